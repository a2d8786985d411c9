"""The one table of defaults: method="auto"'s rule, the training settings every entry point resolves the same way,
and the command line fitting the model the Python API fits."""
import csv
import io

import numpy as np
import pytest
import torch

from gpscale import GPClassifier, GPRegressor, load
from gpscale.cli import main
from gpscale import defaults
from gpscale.defaults import (AUTO_COLLAPSED_MAX_WORK, AUTO_EXACT_MAX_FLOPS, AUTO_EXACT_MAX_N, AUTO_INDUCING,
                              AUTO_ITERATIVE_MAX_ENTRIES, AUTO_ITERATIVE_PRODUCTS, CHOLESKY_MEMORY_FRACTION,
                              resolve_training)
from gpscale.models import available_methods, get_model_class
from gpscale.models.auto import choose_method
from gpscale.models.base import GPModel
from gpscale.models.exact import ExactGP
from gpscale.models.linear import SGPR
from gpscale.models.variational import SVGP

pytestmark = pytest.mark.usefixtures("one_thread")


def data(n=150, d=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, (n, d))
    return X, np.sin(2 * X[:, 0]) + X[:, 1] ** 2 + 0.1 * rng.standard_normal(n) + 5.0


GB = 1e9


@pytest.mark.parametrize("n, d, memory, method", [
    (10, 3, 0.0, "exact"),  # the exact GP up to AUTO_EXACT_MAX_N rows whatever the memory
    (AUTO_EXACT_MAX_N, 50, 0.0, "exact"),
    (AUTO_EXACT_MAX_N + 1, 5, 0.0, "sgpr"),
    (36_000, 8, 20 * GB, "exact"),  # kin40k's factor, 10.4 GB (9.7 GiB), fits in 80% of 20 GB
    (36_000, 8, 12 * GB, "sgpr"),  # and not in 80% of 12 GB
    (56_000, 8, 1000 * GB, "exact"),  # its n^3 / 3 operations are within AUTO_EXACT_MAX_FLOPS
    (57_000, 8, 1000 * GB, "svgp"),  # not here, and a pass of sgpr is dearer than its budget
    (50_000, 20, 0.0, "sgpr"),  # sgpr's budget is exactly this size's pass
    (50_000, 21, 0.0, "svgp"),
    (45_000, 100, 0.0, "svgp"),  # many features make the pass dearer: fewer rows fit the budget
    (1_000_000, 2, 1000 * GB, "svgp"),
])
def test_auto_follows_the_documented_rule(n, d, memory, method):
    m = min(AUTO_INDUCING, n)
    exact = n <= AUTO_EXACT_MAX_N or (8 * n * n <= CHOLESKY_MEMORY_FRACTION * memory
                                      and n**3 / 3 <= AUTO_EXACT_MAX_FLOPS)
    assert exact == (method == "exact")
    assert (exact or n * m * (m + d) <= AUTO_COLLAPSED_MAX_WORK) == (method != "svgp")
    choice = choose_method(n, d, memory_bytes=memory)
    assert choice.method == method and f"{n:,}" in choice.reason
    assert choose_method(n, d, "classification", memory_bytes=memory).method == "svgp"


def test_auto_takes_the_iterative_exact_gp_on_a_gpu_where_the_factor_does_not_fit():
    n = 200_000  # a 320 GB factor; 400 products with K of 4e10 entries each
    assert AUTO_ITERATIVE_PRODUCTS * n**2 <= AUTO_ITERATIVE_MAX_ENTRIES["cuda"]
    choice = choose_method(n, 8, memory_bytes=80 * GB, device_type="cuda")
    assert choice.method == "exact" and "iterative solver" in choice.reason
    assert choose_method(n, 8, memory_bytes=80 * GB, device_type="cpu").method == "svgp"
    assert choose_method(10 * n, 8, memory_bytes=80 * GB, device_type="cuda").method == "svgp"


def test_auto_assumes_the_inducing_points_sgpr_and_svgp_default_to_and_counts_those_asked_for():
    import inspect

    for key in ("sgpr", "svgp"):
        assert inspect.signature(get_model_class(key).__init__).parameters["n_inducing"].default == AUTO_INDUCING
    assert choose_method(45_000, 20, memory_bytes=0.0).method == "sgpr"
    assert choose_method(45_000, 20, memory_bytes=0.0, n_inducing=1024).method == "svgp"  # a dearer pass


def test_auto_rejects_an_unknown_task():
    with pytest.raises(ValueError, match="task must be"):
        choose_method(10, 2, "ranking")


def test_the_estimator_reports_what_auto_chose_and_why(capsys):
    X, y = data()
    reg = GPRegressor(progress=False).fit(X, y)
    assert reg.method == "auto" and reg.method_ == "exact" and reg.method_reason_ == choose_method(150, 3).reason
    reg.summary()
    text = capsys.readouterr().out
    assert "method 'exact'" in text and "n = 150 <= 2,000" in text
    assert "L-BFGS iterations, converged" in text and "lengthscale (units of X)" in text
    clf = GPClassifier(progress=False, epochs=3, n_inducing=8).fit(X, y > 5.5)
    assert clf.method_ == "svgp" and "classification" in clf.method_reason_


# full-batch methods that train with Adam: dbk, whose network's weights L-BFGS leaves far from converged
FULL_BATCH_ADAM = {"dbk"}


def test_every_method_has_a_row_and_full_batch_methods_converge_with_lbfgs():
    for key in available_methods():
        cls = get_model_class(key)
        if not cls.trainable:
            continue
        assert cls.default_training is not None, f"{key} declares no default_training"
        expected = "lbfgs" if cls.full_batch and key not in FULL_BATCH_ADAM else "adam"
        assert resolve_training(cls.training_defaults()).optimizer == expected


def test_a_fixed_number_of_epochs_trains_with_adam_at_the_tables_rate():
    settings = resolve_training(SGPR.training_defaults(), epochs=30)
    assert (settings.optimizer, settings.epochs, settings.lr) == ("adam", 30, SGPR.training_defaults().lr)
    given = resolve_training(SVGP.training_defaults(), epochs=None, lr=0.5, batch_size=7, max_steps=9,
                             optimizer="adam")
    assert (given.lr, given.batch_size, given.max_steps, given.epochs) == (0.5, 7, 9, None)

    class UsersModel(GPModel):  # declares no training defaults: the generic row for its full_batch
        full_batch = False

    assert resolve_training(UsersModel.training_defaults()).optimizer == "adam"


def test_validation_or_a_checkpoint_trains_a_full_batch_method_with_adam():
    watched = resolve_training(SGPR.training_defaults(), watched=True)
    assert watched.optimizer == "adam" and watched.epochs is None
    X, y = data(80)
    reg = GPRegressor(method="sgpr", n_inducing=10, val_fraction=0.25, progress=False).fit(X, y)
    assert reg.fit_result_.settings.optimizer == "adam" and reg.fit_result_.converged is not None
    assert any("val_nlpd" in h for h in reg.fit_result_.history)


def test_the_command_line_and_the_api_fit_the_same_model_from_the_same_defaults(tmp_path):
    X, y = data(120)
    path = tmp_path / "train.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["a", "b", "c", "y"])
        writer.writerows(np.c_[X, y].tolist())
    assert main(["fit", str(path), "--target", "y", "-o", str(tmp_path / "m.gps"), "--quiet"]) == 0
    from_cli = load(tmp_path / "m.gps")
    from_api = GPRegressor(progress=False).fit(X, y)
    assert from_cli.method_ == from_api.method_ == "exact"
    np.testing.assert_allclose(from_cli.predict(X, return_std=True), from_api.predict(X, return_std=True),
                               rtol=1e-10)


def test_summary_gives_hyperparameters_in_the_units_of_x_and_y():
    X, y = data(200)
    scale_x, scale_y = np.array([10.0, 0.1, 3.0]), 7.0
    small = GPRegressor(method="exact", progress=False).fit(X, y)
    big = GPRegressor(method="exact", progress=False).fit(X * scale_x, y * scale_y)
    a, b = small.hyperparameters(), big.hyperparameters()
    np.testing.assert_allclose(b["lengthscale"], a["lengthscale"] * scale_x, rtol=1e-5)
    np.testing.assert_allclose(b["noise"], a["noise"] * scale_y**2, rtol=1e-5)
    np.testing.assert_allclose(b["outputscale"], a["outputscale"] * scale_y**2, rtol=1e-5)
    text = io.StringIO()
    big.summary(file=text)
    assert "final objective" in text.getvalue() and "noise (variance, units of y^2)" in text.getvalue()


def test_a_loaded_model_summarises_as_the_fitted_one(tmp_path):
    X, y = data(100)
    reg = GPRegressor(progress=False).fit(X, y)
    reg.save(tmp_path / "m.gps")
    printed = []
    for model in (reg, load(tmp_path / "m.gps")):
        text = io.StringIO()
        model.summary(file=text)
        printed.append(text.getvalue())
    assert printed[0] == printed[1] and "converged" in printed[0]


def test_sgpr_named_or_chosen_is_capped_by_the_same_budget_of_work(monkeypatch):
    # 1.1e12 / (n 512 532)
    assert SGPR.default_max_steps(43_945, 20, {}) == choose_method(43_945, 20, memory_bytes=0.0).max_steps == 91
    assert SGPR.default_max_steps(3_000, 8, {}) == SGPR.training_defaults().max_steps  # a cheap pass: its cap binds
    assert SGPR.default_max_steps(43_945, 20, {"n_inducing": 1024}) < SGPR.default_max_steps(43_945, 20, {})
    monkeypatch.setattr(defaults, "SGPR_WORK_BUDGET", 1e8)  # so that a small fit meets it: 300 x 50 x 53 a pass
    X = np.random.default_rng(0).normal(size=(300, 3))
    for params in ({"method": "sgpr", "n_inducing": 50}, {"method": "sgpr", "n_inducing": 50, "max_steps": 7}):
        reg = GPRegressor(progress=False, **params).fit(X, X.sum(1))
        assert reg.training_["max_steps"] == params.get("max_steps", 125)


def test_the_exact_gp_named_or_chosen_is_capped_by_the_budget_of_its_evidence(monkeypatch):
    assert ExactGP.default_max_steps(36_000, 8, {"evidence_rows": 5000}) == 120  # 1.5e13 / 5,000^3
    # a small evidence: the method's own cap binds
    assert ExactGP.default_max_steps(1_500, 8, {"evidence_rows": 5000}) == ExactGP.training_defaults().max_steps
    # every row's evidence: one evaluation's work is the budget
    assert ExactGP.default_max_steps(36_000, 8, {"evidence_rows": None}) == 1
    monkeypatch.setattr(defaults, "EXACT_EVIDENCE_BUDGET", 7 * 100**3)  # 7 evaluations of 100 rows
    X, y = data(300)
    for params in ({}, {"method": "exact"}, {"method": "exact", "max_steps": 3}):
        reg = GPRegressor(progress=False, evidence_rows=100, **params).fit(X, y)
        assert reg.method_ == "exact" and reg.training_["max_steps"] == params.get("max_steps", 7)


@pytest.mark.parametrize("method", ["svgp", "softki", "sgpr", "exact"])
def test_dtype_auto_is_float32_for_the_methods_measured_safe_in_it_and_float64_for_the_others(method, tmp_path):
    X, y = data(120)
    reg = GPRegressor(method=method, n_inducing=10, epochs=2, progress=False).fit(X, y)
    expected = torch.float32 if get_model_class(method).auto_dtype == "float32" else torch.float64
    assert reg.dtype == "auto" and reg.dtype_ == expected
    assert next(reg.model_.parameters()).dtype == expected
    reg.save(tmp_path / "m.gps")
    assert load(tmp_path / "m.gps").dtype_ == expected
    # a dtype given is a dtype kept, whatever the method's default
    other = torch.float64 if expected == torch.float32 else torch.float32
    assert GPRegressor(method=method, n_inducing=10, epochs=2, progress=False,
                       dtype=other).fit(X, y).dtype_ == other


def test_auto_chooses_the_method_before_its_dtype():
    X, y = data(120)
    reg = GPRegressor(progress=False).fit(X, y)  # 'auto' picks the exact GP for 120 rows
    assert reg.method_ == "exact" and reg.dtype_ == torch.float64
    assert get_model_class("svgp").auto_dtype == "float32" and GPModel.auto_dtype == "float64"

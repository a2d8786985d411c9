"""The memory guard: every matrix whose size grows with n^2, n x m or n*^2 is checked against the free memory before
it is formed, and refused with the size, the limit and what to do instead; method="auto" picks a method that fits.

Each test lowers the free memory that :func:`gpscale.memory.available_bytes` reports (to a few MB), so a refused
matrix is one of some MB, never allocated, and an accepted one is small."""
import numpy as np
import pytest
import torch

import gpscale.estimator.base
from gpscale import GPClassifier, GPRegressor
from gpscale.memory import InsufficientMemoryError, check_tensors_fit
from gpscale.models.deep_basis.dbk import DBK
from gpscale.models.exact.gp import ExactGP
from gpscale.models.grief.grief_ii import GRIEFII
from gpscale.models.harmonic.hvgp import HVGP
from gpscale.models.linear.sgpr import SGPR
from gpscale.models.linear.softki import SoftKI
from gpscale.models.variational.svgp import SVGP

from conftest import toy_regression

pytestmark = pytest.mark.usefixtures("one_thread")
MB = 10**6


def limit_memory(monkeypatch, n_bytes: int) -> None:
    """Make every device report ``n_bytes`` free (also where a module imported the function by name)."""
    monkeypatch.setattr("gpscale.memory.available_bytes", lambda device="cpu": n_bytes)
    monkeypatch.setattr("gpscale.models.exact.gp.available_bytes", lambda device="cpu": n_bytes)


def never(*args, **kwargs):
    raise AssertionError("called after the memory guard should have refused")


def test_the_guard_names_the_shape_the_dtype_the_sizes_and_the_advice(monkeypatch):
    limit_memory(monkeypatch, 100 * MB)
    check_tensors_fit((1000, 1000), torch.float64, what="A small matrix", advice="")
    with pytest.raises(InsufficientMemoryError,
                       match=r"^A big matrix \(3 matrices of 4,000 x 5,000 float32\) needs 228\.9 MiB, but cpu "
                             r"memory has 95\.4 MiB free .* Do less\.$"):
        check_tensors_fit((4000, 5000), torch.float32, copies=3, what="A big matrix", advice="Do less.")


def fitted(cls, X, y, **options):
    model = cls(X.shape[1], **options).to(torch.float64)
    model.initialise_from_data(X, y)
    model.fit_posterior(X, y)
    return model


@pytest.mark.parametrize("cls, options, first_step", [
    (SGPR, {"n_inducing": 20}, "predictive_factors"),
    (SVGP, {"n_inducing": 20}, "predictive_factors"),
    (ExactGP, {}, "rows_per_chunk"),  # the chunked covariance's first step, before the n* x n* result
])
def test_a_joint_covariance_that_does_not_fit_is_refused_before_it_is_formed(monkeypatch, cls, options, first_step):
    X, y = toy_regression(n=200, d=3)
    model = fitted(cls, X, y, **options)
    few, many = toy_regression(n=100, d=3, seed=1)[0], toy_regression(n=3000, d=3, seed=2)[0]
    limit_memory(monkeypatch, 50 * MB)  # 3,000^2 float64 numbers are 72 MB
    assert model.predict_cov(few)[1].shape == (100, 100)
    monkeypatch.setattr(model, first_step, never)
    with pytest.raises(InsufficientMemoryError,
                       match=r"joint posterior covariance of 3,000 test rows \(.*3,000 x 3,000 float64\) needs "
                             r".* MiB, but cpu memory has 47\.7 MiB free .* marginal variances .* in blocks"):
        model.predict_cov(many)


def test_return_cov_and_sample_y_refuse_a_joint_covariance_that_does_not_fit(monkeypatch):
    X, y = (t.numpy() for t in toy_regression(n=200, d=3))
    reg = GPRegressor(method="sgpr", n_inducing=20, max_steps=3, progress=False).fit(X, y)
    many = toy_regression(n=3000, d=3, seed=2)[0].numpy()
    limit_memory(monkeypatch, 50 * MB)
    monkeypatch.setattr(reg.model_, "predict_cov", never)
    for call in (lambda: reg.predict(many, return_cov=True), lambda: reg.sample_y(many)):
        with pytest.raises(InsufficientMemoryError,
                           match=r"joint predictive covariance of 3,000 rows in host memory \(2 matrices of 3,000 x "
                                 r"3,000 float64\) needs 137\.3 MiB.* return_std=True .* in blocks"):
            call()
    assert np.isfinite(reg.predict(many, return_std=True)[1]).all()  # the marginal variances, in chunks


def test_an_exact_gp_whose_cholesky_factor_does_not_fit_is_refused_before_training(monkeypatch):
    X, y = (t.numpy() for t in toy_regression(n=3000, d=5))
    limit_memory(monkeypatch, 50 * MB)  # the factor of 3,000 rows is 72 MB; the evidence of 500 rows 14 MB
    monkeypatch.setattr(gpscale.estimator.base, "fit", never)
    reg = GPRegressor(method="exact", inference="cholesky", evidence_rows=500, progress=False)
    with pytest.raises(InsufficientMemoryError, match=r"Cholesky factor of 3,000 rows .* inference='iterative'"):
        reg.fit(X, y)


def test_the_iterative_exact_gp_refuses_a_preconditioner_or_variance_cache_that_does_not_fit(monkeypatch):
    X, y = toy_regression(n=2000, d=2)
    model = ExactGP(2, inference="iterative").to(torch.float64)
    limit_memory(monkeypatch, 1 * MB)  # the rank-100 preconditioner of 2,000 rows is 1.6 MB
    with pytest.raises(InsufficientMemoryError,
                       match=r"preconditioner of 2,000 rows \(2,000 x 100 float64\) .* preconditioner_rank="):
        model.loss(X, y, 2000)
    limit_memory(monkeypatch, 5 * MB)  # the rank-256 Lanczos cache, gathered, is 8.2 MB
    monkeypatch.setattr(model, "_cg_solve", never)
    with pytest.raises(InsufficientMemoryError,
                       match=r"Lanczos variance cache of 2,000 rows \(2 matrices of 2,000 x 256 float64\) .* "
                             r"variance_rank=None"):
        model.fit_posterior(X, y)
    monkeypatch.undo()
    limit_memory(monkeypatch, 5 * MB)
    model.variance_rank = None  # variances by conjugate gradients: nothing of n x 256
    model.fit_posterior(X, y)
    assert torch.isfinite(model.predict(X[:10])[1]).all()


def test_dbk_refuses_features_held_whole_that_do_not_fit(monkeypatch):
    X, y = toy_regression(n=2000, d=3)
    model = DBK(3, n_basis=256, chunk_size=500).to(torch.float64)
    basis, calls = model.kernel.basis, []

    def first_chunk_only(Xc):
        calls.append(Xc.shape[0])
        assert len(calls) == 1, "the network ran on the rows after the guard should have refused"
        return basis(Xc)

    monkeypatch.setattr(model.kernel, "basis", first_chunk_only)
    limit_memory(monkeypatch, 5 * MB)  # Phi [2,000, 256] and its gradient are 8.2 MB
    with pytest.raises(InsufficientMemoryError,
                       match=r"features Phi of 2,000 rows held whole \(2 matrices of 2,000 x 256 float64\) .* "
                             r"method='svdbk'.*\(n_basis="):
        model.objective(X, y)


def test_grief_streams_its_evidence_where_phi_does_not_fit_and_refuses_to_hold_it(monkeypatch):
    X, y = toy_regression(n=2000, d=3)
    model = GRIEFII(3, n_eigen=100, init_exact_points=0).to(torch.float64)
    model.initialise_from_data(X, y)
    assert model.holds_features(X)
    with torch.no_grad():
        held = model.log_marginal_likelihood(X, y)
    limit_memory(monkeypatch, 1 * MB)  # Phi [2,000, 100] is 1.6 MB
    assert not model.holds_features(X)
    with torch.no_grad():
        torch.testing.assert_close(model.log_marginal_likelihood(X, y), held, rtol=1e-8, atol=0)  # streamed
    with pytest.raises(InsufficientMemoryError, match=r"features Phi of 2,000 rows held whole .*\(n_eigen="):
        model.preconditioner(X)


def test_softki_refuses_a_batch_whose_interpolation_weights_do_not_fit(monkeypatch):
    X, y = toy_regression(n=3000, d=5)
    model = SoftKI(5, n_inducing=512).to(torch.float64)
    monkeypatch.setattr("gpscale.models.linear.softki.softmax_weights", never)
    limit_memory(monkeypatch, 50 * MB)  # four [3,000, 512] float64 matrices are 49 MB
    with pytest.raises(InsufficientMemoryError,
                       match=r"interpolation weights of a batch of 3,000 rows .*\(4 matrices of 3,000 x 512 float64\)"
                             r" .* batch_size=.*\(n_inducing="):
        model.loss(X, y, 3000)


@pytest.mark.parametrize("cls, options, inducing", [(SVGP, {"n_inducing": 512}, 512),
                                                    (HVGP, {"n_inducing": 128}, 8 * 128)])  # T = 2^3 blocks
def test_a_variational_batch_whose_kuf_does_not_fit_is_refused(monkeypatch, cls, options, inducing):
    X, y = toy_regression(n=3000, d=5)
    model = cls(5, **options).to(torch.float64)
    with torch.no_grad():
        model.features.Z.normal_()
    monkeypatch.setattr(model.features, "Kuf", never)
    limit_memory(monkeypatch, 20 * MB)  # K_uf, A and S^T A of 3,000 rows: 37 MB (SVGP), 74 MB (HVGP)
    with pytest.raises(InsufficientMemoryError,
                       match=rf"K_uf of {inducing:,} inducing features with 3,000 rows \(3 matrices of "
                             rf"{inducing:,} x 3,000 float64\) .* batch_size=.*\(n_inducing="):
        model.loss(X, y, 3000)


def test_the_classifier_refuses_a_full_batch_whose_kuf_does_not_fit(monkeypatch):
    X, _ = toy_regression(n=2000, d=3)
    labels = (X[:, 0] > 0).numpy()
    limit_memory(monkeypatch, 10 * MB)  # K_uf of 256 points with 2,000 rows, A and S^T A: 12 MB in float64
    clf = GPClassifier(n_inducing=256, batch_size=2000, epochs=1, dtype="float64", progress=False)
    with pytest.raises(InsufficientMemoryError, match=r"K_uf of 256 inducing features with 2,000 rows .* batch_size="):
        clf.fit(X.numpy(), labels)


def test_auto_picks_a_method_that_fits_under_limited_memory_and_fits_it(monkeypatch):
    X, y = (t.numpy() for t in toy_regression(n=3000, d=5))
    limit_memory(monkeypatch, 50 * MB)  # the exact GP's factor of 3,000 rows (72 MB) does not fit
    reg = GPRegressor(max_steps=3, progress=False).fit(X, y)
    assert reg.method_ == "sgpr" and "47.7 MiB free" in reg.method_reason_
    mean, std = reg.predict(X[:500], return_std=True)
    assert np.isfinite(mean).all() and (std > 0).all()
    assert reg.predict(X[:100], return_cov=True)[1].shape == (100, 100)


def test_the_command_line_refuses_in_one_line(tmp_path, capsys, monkeypatch):
    from gpscale.cli import main

    rng = np.random.default_rng(0)
    table = tmp_path / "train.csv"
    np.savetxt(table, np.c_[rng.normal(size=(3000, 2)), rng.normal(size=3000)], delimiter=",", header="a,b,y",
               comments="")
    limit_memory(monkeypatch, 50 * 2**20)
    code = main(["fit", str(table), "--target", "y", "--method", "exact", "--option", "inference=cholesky",
                 "--quiet", "-o", str(tmp_path / "m.gps")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "of 3,000 rows" in err and "MiB free" in err, err
    assert not (tmp_path / "m.gps").exists()


def test_the_deep_convolutional_models_hidden_layer_refuses_a_batch_whose_kernel_matrix_does_not_fit(monkeypatch):
    from gpscale.models import get_model_class

    model = get_model_class("deep-conv-hvgp")(16, image_shape=(4, 4), filter_sizes=(2, 2), strides=(1, 1),
                                              hidden_channels=2, hidden_inducing=3).double()
    layer = model.hidden[0]
    small = layer.patches(torch.randn(2, 16, dtype=torch.float64))
    layer.moments(small)
    limit_memory(monkeypatch, 1 * MB)  # 3 x (T 3) x 60,000 float64 numbers are 4.1 MB
    big = torch.zeros(60_000, small.shape[1], dtype=torch.float64)
    monkeypatch.setattr(layer.features, "Kuf", never)
    with pytest.raises(InsufficientMemoryError, match=r"hidden layer.s covariance K_uf .*\(hidden_inducing="):
        layer.moments(big)

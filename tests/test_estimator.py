
import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.utils.estimator_checks import parametrize_with_checks

import gpscale
from gpscale import GPRegressor
from gpscale.io import ModelFileError


def data(n=120, d=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, (n, d))
    y = np.sin(2 * X[:, 0]) + X[:, 1] ** 2 + 0.1 * rng.standard_normal(n) + 5.0
    return X, y


@pytest.mark.parametrize("method", ["exact", "sgpr", "svgp"])
def test_predictions_in_original_units_with_calibrated_std(method):
    X, y = data(300)
    Xt, yt = data(200, seed=1)
    reg = GPRegressor(method=method, n_inducing=30, epochs=60, batch_size=100, lr=0.1, progress=False).fit(X, y)
    mean, std = reg.predict(Xt, return_std=True)
    assert np.sqrt(np.mean((mean - yt) ** 2)) < 0.3  # y has mean 5 and noise std 0.1: units restored
    assert reg.score(Xt, yt) > 0.9
    assert (std > 0.05).all() and np.mean(np.abs(mean - yt) < 1.96 * std) > 0.85


def test_torch_inputs_are_accepted_and_give_the_same_predictions():
    X, y = data()
    a = GPRegressor(epochs=5, n_inducing=10, progress=False).fit(X, y)
    b = GPRegressor(epochs=5, n_inducing=10, progress=False).fit(torch.tensor(X), torch.tensor(y))
    np.testing.assert_allclose(a.predict(X), b.predict(torch.tensor(X)), rtol=1e-12)


def test_method_options_are_parameters_and_survive_clone():
    reg = GPRegressor(method="sgpr", solver="qr", jitter=1e-5)
    assert reg.get_params()["solver"] == "qr"
    twin = clone(reg)
    assert twin.solver == "qr" and twin.jitter == 1e-5
    reg.set_params(solver="cholesky")
    assert reg.solver == "cholesky"


def test_method_options_are_saved(tmp_path):
    X, y = data()
    reg = GPRegressor(method="sgpr", epochs=2, n_inducing=8, solver="qr", progress=False).fit(X, y)
    reg.save(tmp_path / "m.gps")
    loaded = GPRegressor.load(tmp_path / "m.gps")
    assert loaded.solver == "qr" and loaded.model_.solver == "qr"


# --- the scikit-learn surface -----------------------------------------------------------------------------------
@parametrize_with_checks([GPRegressor(progress=False)])  # method "auto": the exact GP here, L-BFGS to convergence
def test_check_estimator_with_every_default(estimator, check):  # one test per check, for parallel workers
    check(estimator)


def test_predict_keywords_are_options_not_routed_metadata_and_help_is_mostly_ours():
    import pydoc

    assert not hasattr(GPRegressor(), "set_predict_request")  # return_std, return_cov, latent are not metadata
    assert hasattr(GPRegressor(), "set_score_request")  # sample_weight is
    text = pydoc.render_doc(GPRegressor, renderer=pydoc.plaintext)
    assert "R² of ``predict(X)``" in text and "Return the coefficient of determination" not in text


def test_fit_copies_a_kernel_object_and_the_trained_copy_is_kernel_():
    from gpscale.kernels import Matern

    X, y = data()
    kernel = Matern(3, nu=1.5)
    before = {k: v.clone() for k, v in kernel.state_dict().items()}
    reg = GPRegressor(method="exact", kernel=kernel, progress=False).fit(X, y)
    for name, value in kernel.state_dict().items():
        torch.testing.assert_close(value, before[name], rtol=0, atol=0)
    assert reg.kernel is kernel and reg.kernel_ is not kernel and isinstance(reg.kernel_, Matern)
    assert not torch.equal(reg.kernel_.raw_lengthscale, kernel.raw_lengthscale)  # the copy trained
    shown = repr(reg.kernel_)
    assert shown.startswith("Matern(nu=1.5, lengthscale=[") and "outputscale=" in shown
    assert f"{reg.kernel_.outputscale.item():.4g}" in shown


def test_the_lengthscales_start_at_the_median_distance_unless_given():
    from gpscale.kernels import median_distance

    X, y = data()
    X = X * np.array([1.0, 30.0, 0.01])  # standardised by the estimator: the median is of the standardised rows
    Z = torch.tensor((X - X.mean(0)) / X.std(0))
    barely = dict(method="exact", epochs=1, lr=1e-9, progress=False)  # one Adam step that moves nothing
    start = GPRegressor(**barely).fit(X, y).model_.kernel.lengthscale.detach()
    torch.testing.assert_close(start, torch.full_like(start, median_distance(Z)), rtol=1e-6, atol=0)
    given = GPRegressor(lengthscale=0.3, **barely).fit(X, y).model_.kernel.lengthscale.detach()
    torch.testing.assert_close(given, torch.full_like(given, 0.3), rtol=1e-6, atol=0)


def test_every_method_option_is_a_parameter_for_set_params_clone_and_grid_search():
    from sklearn.model_selection import GridSearchCV

    reg = GPRegressor(method="sgpr", epochs=20, n_inducing=10, progress=False)
    reg.set_params(solver="qr", ard=False)  # options given to no constructor
    assert reg.get_params()["solver"] == "qr" and clone(reg).ard is False
    with pytest.raises(ValueError, match="Invalid parameter.*'solvr'"):
        reg.set_params(solvr="qr")
    X, y = data(90)
    grid = GridSearchCV(GPRegressor(epochs=10, n_inducing=10, progress=False),
                        [{"method": ["exact", "sgpr"]}, {"method": ["sgpr"], "solver": ["qr", "cholesky"]}], cv=2)
    grid.fit(X, y)
    assert len(grid.cv_results_["params"]) == 4 and np.isfinite(grid.cv_results_["mean_test_score"]).all()
    options = GridSearchCV(GPRegressor(method="exact", progress=False), {"ard": [True, False]}, cv=2).fit(X, y)
    assert options.best_estimator_.model_.kernel.ard == options.best_params_["ard"]


@pytest.mark.parametrize("dtype", ["float32", torch.float32, np.float32, np.dtype("float32")])
def test_dtype_takes_names_and_torch_and_numpy_dtypes(dtype):
    X, y = data(50)
    reg = GPRegressor(method="svgp", dtype=dtype, epochs=2, n_inducing=5, progress=False).fit(X, y)
    assert reg.model_.q_mu.dtype == torch.float32 and reg.dtype is dtype


# --- the joint predictive ---------------------------------------------------------------------------------------
def test_return_cov_equals_the_dense_formula_for_the_exact_gp():
    X, y = data(80)
    Xs = data(12, seed=3)[0]
    reg = GPRegressor(method="exact", progress=False).fit(X, y)
    model = reg.model_
    scale = lambda A: torch.tensor((A - reg.x_mean_) / reg.x_std_)  # noqa: E731
    with torch.no_grad():
        Kff, Kfs, Kss = (model.kernel(a, b) for a, b in ((scale(X), scale(X)), (scale(X), scale(Xs)),
                                                          (scale(Xs), scale(Xs))))
        noise = model.likelihood.noise
        Ky = Kff + noise * torch.eye(len(X), dtype=Kff.dtype)
        cov_f = Kss - Kfs.T @ torch.linalg.solve(Ky, Kfs)
        mean = Kfs.T @ torch.linalg.solve(Ky, torch.tensor((y - reg.y_mean_) / reg.y_std_))
    mean_y, cov_y = reg.predict(Xs, return_cov=True)
    np.testing.assert_allclose(mean_y, mean.numpy() * reg.y_std_ + reg.y_mean_, rtol=1e-8)
    np.testing.assert_allclose(cov_y, (cov_f + noise * torch.eye(12, dtype=Kff.dtype)).numpy() * reg.y_std_**2,
                               rtol=1e-6, atol=1e-10)
    _, cov_latent = reg.predict(Xs, return_cov=True, latent=True)
    np.testing.assert_allclose(cov_latent, cov_f.numpy() * reg.y_std_**2, rtol=1e-6, atol=1e-10)
    _, std = reg.predict(Xs, return_std=True)
    _, std_latent = reg.predict(Xs, return_std=True, latent=True)
    np.testing.assert_allclose(std**2, np.diag(cov_y), rtol=1e-8)
    np.testing.assert_allclose(std_latent**2 + noise.item() * reg.y_std_**2, std**2, rtol=1e-8)


def test_return_cov_is_refused_where_it_does_not_fit_in_memory(monkeypatch):
    X, y = data(40)
    reg = GPRegressor(method="exact", progress=False).fit(X, y)
    monkeypatch.setattr("gpscale.memory.available_bytes", lambda device: 20_000)  # 2 x 8 x 40^2 bytes do not fit
    with pytest.raises(gpscale.memory.InsufficientMemoryError,
                       match=r"joint predictive covariance of 40 rows in host memory \(2 matrices of 40 x 40 "
                             r"float64\) needs .* Ask for return_std=True"):
        reg.predict(X, return_cov=True)
    assert reg.predict(X[:20], return_cov=True)[1].shape == (20, 20)  # 2 x 8 x 20^2 bytes fit


@pytest.mark.parametrize("latent", [False, True])
def test_sample_y_draws_from_the_joint_predictive(latent):
    X, y = data(60)
    Xs = data(4, seed=5)[0]
    reg = GPRegressor(method="sgpr", n_inducing=20, progress=False).fit(X, y)
    mean, cov = reg.predict(Xs, return_cov=True, latent=latent)
    draws = reg.sample_y(Xs, n_samples=20_000, random_state=1, latent=latent)
    assert draws.shape == (4, 20_000)
    stderr = np.sqrt(np.diag(cov) / 20_000)
    assert np.all(np.abs(draws.mean(1) - mean) < 5 * stderr)
    np.testing.assert_allclose(np.cov(draws), cov, rtol=0.05, atol=0.05 * np.abs(cov).max())
    np.testing.assert_array_equal(draws, reg.sample_y(Xs, n_samples=20_000, random_state=1, latent=latent))
    assert not np.array_equal(draws, reg.sample_y(Xs, n_samples=20_000, random_state=2, latent=latent))


# --- saving models with kernel objects --------------------------------------------------------------------------
def test_a_gpscale_kernel_object_saves_as_its_constructor_and_loads_identically(tmp_path):
    from gpscale.kernels import RBF, Periodic, Sum

    X, y = data()
    reg = GPRegressor(method="exact", kernel=Sum(RBF(3, ard=False), Periodic(3)), progress=False).fit(X, y)
    reg.save(tmp_path / "m.gps")
    loaded = gpscale.load(tmp_path / "m.gps")
    np.testing.assert_array_equal(loaded.predict(X, return_std=True), reg.predict(X, return_std=True))
    assert isinstance(loaded.kernel, Sum) and isinstance(loaded.kernel_.second, Periodic)


def test_a_gpytorch_kernel_saves_by_its_registered_constructor_or_is_refused_with_how(tmp_path):
    gpytorch = pytest.importorskip("gpytorch")
    from gpscale.kernels import GPyTorchKernel, register_kernel
    from gpscale.kernels.specs import _REGISTERED

    def build(n_features):
        return GPyTorchKernel(gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=1.5)))

    X, y = data(60)
    as_object = GPRegressor(method="exact", kernel=build(3), progress=False).fit(X, y)
    with pytest.raises(ValueError, match="register_kernel"):
        as_object.save(tmp_path / "refused.gps")
    assert not (tmp_path / "refused.gps").exists()
    register_kernel("test-gpytorch-matern")(build)
    try:
        reg = GPRegressor(method="exact", kernel="test-gpytorch-matern", progress=False).fit(X, y)
        reg.save(tmp_path / "m.gps")
        np.testing.assert_array_equal(gpscale.load(tmp_path / "m.gps").predict(X), reg.predict(X))
    finally:
        del _REGISTERED["test-gpytorch-matern"]
    with pytest.raises(ModelFileError, match="Unknown kernel 'test-gpytorch-matern'.*register_kernel"):
        gpscale.load(tmp_path / "m.gps")


@pytest.mark.parametrize("x_scaling", ["standard", "minmax", "center", "none"])
def test_x_scaling_maps_the_training_rows_as_documented_and_predicts_in_original_units(x_scaling):
    X, y = data(60)
    X = X * [3.0, 0.5, 1.0] + [10.0, -4.0, 0.0]
    reg = GPRegressor(method="exact", x_scaling=x_scaling, epochs=3, progress=False).fit(X, y)
    scaled = (X - reg.x_mean_) / reg.x_std_
    if x_scaling == "standard":
        np.testing.assert_allclose(scaled.mean(0), 0, atol=1e-12)
        np.testing.assert_allclose(scaled.std(0), 1, rtol=1e-12)
    elif x_scaling == "minmax":
        np.testing.assert_allclose(scaled.min(0), -1, atol=1e-12)
        np.testing.assert_allclose(scaled.max(0), 1, atol=1e-12)
    elif x_scaling == "center":
        np.testing.assert_allclose(scaled, X - X.mean(0), atol=1e-12)
    else:
        np.testing.assert_array_equal(scaled, X)
    # the model was trained on exactly these rows: its posterior at them is what predict gives
    with torch.no_grad():
        mean_f, _ = reg.model_.predict(torch.tensor(scaled))
    np.testing.assert_allclose(reg.predict(X, latent=True), mean_f.numpy() * reg.y_std_ + reg.y_mean_, rtol=1e-10)
    with pytest.raises(ValueError, match="x_scaling must be one of 'standard', 'minmax', 'center', 'none', got 'unit'"):
        GPRegressor(method="exact", x_scaling="unit", progress=False).fit(X, y)


def test_normalize_y_false_trains_on_y_as_given():
    X, y = data(60)
    raw = GPRegressor(method="exact", normalize_y=False, epochs=3, progress=False).fit(X, 5 * y + 100)
    normalized = GPRegressor(method="exact", epochs=3, progress=False).fit(X, 5 * y + 100)
    assert (raw.y_mean_, raw.y_std_) == (0.0, 1.0)
    far = np.full((1, 3), 1e3)  # far from the data the posterior is the prior: mean 0 in the units the model saw
    assert raw.predict(far)[0] == pytest.approx(0, abs=1e-6)
    assert normalized.predict(far)[0] == pytest.approx(normalized.y_mean_, rel=1e-6)
    with pytest.raises(ValueError, match="normalize_y must be True or False"):
        GPRegressor(method="exact", normalize_y="yes", progress=False).fit(X, y)
    with pytest.raises(ValueError, match="y is constant"):
        GPRegressor(method="exact", progress=False).fit(X, np.ones(len(X)))


def test_refit_posterior_changes_posterior_options_without_training_again():
    X, y = data(80)
    reg = GPRegressor(method="softki", n_inducing=10, epochs=2, calibrate_noise=None, progress=False).fit(X, y)
    trained = {k: v.clone() for k, v in reg.model_.state_dict().items() if isinstance(v, torch.Tensor)}
    before = reg.predict(X[:5], return_std=True)
    reg.refit_posterior(X, y, calibrate_noise="variance")
    after = reg.predict(X[:5], return_std=True)
    np.testing.assert_allclose(after[0], before[0], rtol=1e-12)  # the variance mode keeps the mean
    assert not np.allclose(after[1], before[1]) and reg.calibrate_noise == "variance"
    fresh = GPRegressor(method="softki", n_inducing=10, epochs=2, calibrate_noise="variance", progress=False)
    np.testing.assert_allclose(fresh.fit(X, y).predict(X[:5], return_std=True), after, rtol=1e-10)
    for name, value in reg.model_.state_dict().items():
        if name in trained and "noise" not in name:  # the trained parameters did not move
            torch.testing.assert_close(value, trained[name])
    with pytest.raises(ValueError, match="'n_inducing' cannot change without training again"):
        reg.refit_posterior(X, y, n_inducing=5)
    with pytest.raises(ValueError, match="calibrate_noise must be one of"):
        reg.refit_posterior(X, y, calibrate_noise=True)  # the spelling of an earlier version
    np.testing.assert_array_equal(reg.predict(X[:5], return_std=True), after)  # a refused refit changes nothing
    assert reg.calibrate_noise == "variance"


def test_a_refit_posterior_takes_the_rows_the_fit_held_out_as_a_fresh_fit_does():
    """softki's default holds out a tenth of the rows for calibrate_noise; a refit with another mode draws the same
    rows again from the seed, so it gives what a fresh fit with that mode gives (the training does not depend on it)
    and not the training rows' evidence."""
    X, y = data(600)
    settings = dict(method="softki", n_inducing=10, max_steps=5, dtype="float64", progress=False)
    reg = GPRegressor(**settings).fit(X, y)
    assert reg.fit_result_.val_fraction == 0.1
    reg.refit_posterior(X, y, calibrate_noise="posterior")
    fresh = GPRegressor(**settings, calibrate_noise="posterior").fit(X, y)
    np.testing.assert_allclose(reg.predict(X[:5], return_std=True), fresh.predict(X[:5], return_std=True),
                               rtol=1e-10)


def test_a_method_accepts_only_the_engine_options_it_honours():
    X, y = data(40)
    with pytest.raises(ValueError, match="Method 'grief' has no option 'solver'"):
        GPRegressor(method="grief", solver="qr", epochs=1, progress=False).fit(X, y)
    with pytest.raises(ValueError, match="Method 'sgpr' has no option 'calibrate_noise'"):
        GPRegressor(method="sgpr", calibrate_noise="variance", epochs=1, progress=False).fit(X, y)
    with pytest.raises(ValueError, match="calibrate_noise of dbk must be one of"):
        GPRegressor(method="dbk", calibrate_noise="variance", epochs=1, progress=False).fit(X, y)


def test_the_estimator_checkpoints_and_resumes_to_the_uninterrupted_fit(tmp_path):
    X, y = data()
    state = tmp_path / "state.pt"
    settings = dict(method="svgp", n_inducing=8, batch_size=16, progress=False)
    GPRegressor(epochs=3, checkpoint=state, **settings).fit(X, y)  # stopped after 3 epochs
    resumed = GPRegressor(epochs=6, checkpoint=state, resume=True, **settings).fit(X, y)
    whole = GPRegressor(epochs=6, **settings).fit(X, y)
    np.testing.assert_array_equal(resumed.predict(X), whole.predict(X))
    assert resumed.fit_result_.epochs_run == 6
    resumed.save(tmp_path / "m.gps")  # the checkpoint's path is an option like any other
    assert GPRegressor.load(tmp_path / "m.gps").checkpoint == str(state)
    with pytest.raises(FileNotFoundError, match="the folder .* does not exist"):
        GPRegressor(epochs=2, checkpoint=tmp_path / "no" / "state.pt", **settings).fit(X, y)
    with pytest.raises(ValueError, match="resume=True continues from a checkpoint"):
        GPRegressor(epochs=2, resume=True, **settings).fit(X, y)


def test_inducing_sizes_are_capped_at_the_rows_training_sees():
    """Held out of training, rows cannot hold inducing points (k-means cannot place more points than rows): softki's
    512 become the rows it trains on. Its default holds out no rows of 60 (fewer than 50 would be held out)."""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(60, 3))
    y = X.sum(1) + 0.1 * rng.normal(size=60)
    assert GPRegressor(method="softki", max_steps=3, progress=False).fit(X, y).model_.n_inducing == 60
    assert GPRegressor(method="softki", max_steps=3, val_fraction=0.1, progress=False).fit(X, y).model_.n_inducing == 54
    assert GPRegressor(method="softki", max_steps=3, val_fraction=0.5, progress=False).fit(X, y).model_.n_inducing == 30

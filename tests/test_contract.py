"""The contract every registered method keeps, checked over ``gpscale.available_methods()``: a method registered later
joins every test here by being registered and given its small settings in ``TINY``.

For each method: scikit-learn's ``check_estimator``; save and load give bit-identical predictions; variances are
finite and non-negative, near the data and far from it; the posterior and the full-batch objective do not depend
on the chunk size; every parameter the optimiser moves gets a finite gradient; float32 runs and agrees with float64;
bad input is refused before any training; and, for the methods with a classification likelihood, the classifier's
probabilities are probabilities. Engines are tested against dense formulas in their own files.

The tests that fit run on every device in ``DEVICES``: the CPU, and a CUDA device where there is one.
"""
import copy
import functools
import inspect
import warnings

import numpy as np
import pytest
import torch
from sklearn.utils.estimator_checks import parametrize_with_checks

import gpscale
from gpscale import GPClassifier, GPRegressor
from gpscale.models import available_methods, get_model_class

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:GP-GRIEF-I's MCMC has not converged"),  # short chains, on purpose
              pytest.mark.filterwarnings("ignore:VFF. in dimension")]  # small boxes, on purpose

# The smallest settings that still build a real model of each method, so that a fit takes a second or so.
TINY = {
    "exact": {},
    "sgpr": {"n_inducing": 16},
    "svgp": {"n_inducing": 16},
    "softki": {"n_inducing": 16},
    "grief": {"n_eigen": 20, "grid_size": 6, "init_exact_points": 40, "init_iterations": 10, "init_stretch": (1.0,)},
    # MALA, not the default HMC: HMC's leapfrog trajectories amplify the round-off of another chunk order or of
    # float32 into chains that differ by Monte Carlo error, beyond the chunk-size and float32 tests' tolerances
    "grief-i": {"n_eigen": 20, "grid_size": 6, "init_exact_points": 40, "init_iterations": 10, "sampler": "mala",
                "n_iterations": 60, "burn_in": 20, "thin": 5},
    "dbk": {"n_basis": 8, "width": 16, "lr": 0.01},
    "svdbk": {"n_basis": 8, "width": 16, "lr": 0.01},
    "hvgp": {"n_inducing": 5, "n_ways": 1},
    "vff": {"n_frequencies": 6},
    "vff-svgp": {"n_frequencies": 6},
    "odvgp": {"n_inducing": 8, "n_mean_inducing": 16},
    "odvff": {"n_frequencies": 4, "n_mean_inducing": 16},
    # each row a one-pixel-high image as wide as X has columns, patches of two neighbouring pixels: the generic
    # tabular data of every suite (and scikit-learn's checks, whatever their number of columns) is image data
    "conv-svgp": {"n_inducing": 8, "image_shape": (1, -1), "filter_size": (1, 2)},
    "conv-hvgp": {"n_inducing": 4, "image_shape": (1, -1), "filter_size": (1, 2)},
    # a hidden layer of one-pixel patches and 2 channels under an output layer of two-pixel patches (negation: a
    # one-pixel patch has no checkerboard), so that an image of 2 pixels or more fits
    "deep-conv-hvgp": {"n_inducing": 4, "hidden_inducing": 4, "image_shape": (1, -1), "filter_sizes": ((1, 1), (1, 2)),
                       "strides": (1, 1), "hidden_channels": 2, "group": "negation", "predict_samples": 2},
}
METHODS = sorted(TINY)
CLASSIFIERS = sorted(k for k in TINY if "bernoulli" in get_model_class(k).likelihoods)
DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]
on_every_device = pytest.mark.parametrize("device", DEVICES)


def regressor(method: str, device: str = "cpu", **options) -> GPRegressor:
    """float64 unless told (``dtype="auto"`` would give svgp, softki and hvgp float32): the contract's tolerances are
    float64's, scikit-learn's subset-invariance check among them; the stress matrix runs float32 explicitly."""
    settings = {"epochs": 3, "batch_size": 32, "lr": 0.05, "dtype": "float64", **TINY[method], **options}
    return GPRegressor(method=method, progress=False, device=device, **settings)


def data(n=80, d=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, (n, d))
    return X, np.sin(2 * X[:, 0]) + X[:, 1] ** 2 + 0.1 * rng.standard_normal(n) + 5.0


_FITTED: dict[tuple[str, str], GPRegressor] = {}


def fitted(method: str, device: str = "cpu") -> GPRegressor:
    """One fit per method and device, shared by the tests that only read it."""
    if (method, device) not in _FITTED:
        _FITTED[method, device] = regressor(method, device).fit(*data())
    return _FITTED[method, device]


def standardised(reg: GPRegressor, X: np.ndarray, y: np.ndarray | None = None, dtype=torch.float64):
    """X (and y) scaled as ``reg`` scaled its training rows, as tensors on its device."""
    as_tensor = dict(dtype=dtype, device=reg.device_)
    Xt = torch.tensor((X - reg.x_mean_) / reg.x_std_, **as_tensor)
    return Xt if y is None else (Xt, torch.tensor((y - reg.y_mean_) / reg.y_std_, **as_tensor))


def test_every_registered_method_is_under_contract():
    assert METHODS == available_methods()


def _options_beyond_the_signature(estimator: GPRegressor) -> dict[str, str]:
    """Method options are keyword arguments beyond the estimator's signature, which scikit-learn's
    check_no_attributes_set_in_init cannot see: expected to fail for an estimator given any."""
    beyond = set(estimator.get_params()) - set(inspect.signature(type(estimator)).parameters)
    return {"check_no_attributes_set_in_init": f"method options {sorted(beyond)} are **kwargs"} if beyond else {}


# scikit-learn's check_estimator, one test per check and estimator, so that parallel workers share them out (the
# slowest method's checks took a minute as one test)
@parametrize_with_checks(
    [regressor(method, device, epochs=30, batch_size=64, lr=TINY[method].get("lr", 0.1))
     for method in METHODS for device in DEVICES],
    expected_failed_checks=_options_beyond_the_signature, xfail_strict=True)
def test_check_estimator(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check(estimator)


@on_every_device
@pytest.mark.parametrize("method", METHODS)
def test_save_and_load_give_bit_identical_predictions(tmp_path, method, device):
    reg = fitted(method, device)
    reg.save(tmp_path / "model.gps")
    loaded = gpscale.load(tmp_path / "model.gps")
    Xs = data(20, seed=1)[0]
    for a, b in zip(reg.predict(Xs, return_std=True), loaded.predict(Xs, return_std=True)):
        np.testing.assert_array_equal(a, b)
    assert loaded.get_params() == reg.get_params() and loaded.method_ == method


@on_every_device
@pytest.mark.parametrize("method", METHODS)
def test_variances_are_finite_and_non_negative_near_the_data_and_far_from_it(method, device):
    reg = fitted(method, device)
    Xs = np.vstack([data(20, seed=1)[0], np.full((3, 3), 50.0)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a deep basis kernel warns that it extrapolates, as it should
        mean, std = reg.predict(Xs, return_std=True)
        _, latent_std = reg.predict(Xs, return_std=True, latent=True)
    assert np.isfinite(mean).all() and np.isfinite(std).all() and np.isfinite(latent_std).all()
    assert (latent_std >= 0).all() and (std >= latent_std).all()  # the noise adds to the latent variance


@on_every_device
@pytest.mark.parametrize("method", METHODS)
def test_the_posterior_and_the_objective_do_not_depend_on_the_chunk_size(method, device):
    reg = fitted(method, device)
    Xt, yt = standardised(reg, *data())
    small = copy.deepcopy(reg.model_)
    small.chunk_size = 7
    small.fit_posterior(Xt, yt)
    for a, b in zip(small.predict(Xt[:30]), reg.model_.predict(Xt[:30])):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)
    if reg.model_.full_batch and reg.model_.trainable:
        # at the training noise: a noise calibrated in the posterior fit is an optimum found to ~1e-8 (the evidence
        # is flat there), which the chunks' summation order moves; clear_cache restores the training noise. With
        # gradients on, over more rows than a chunk the statistics stream (their backward pass rebuilds one chunk at
        # a time), which a pass without gradients never takes
        small.clear_cache()
        large = copy.deepcopy(reg.model_)
        large.clear_cache()
        (loss_small, *grad_small), (loss_large, *grad_large) = (loss_and_gradient(m, Xt, yt) for m in (small, large))
        torch.testing.assert_close(loss_small, loss_large, rtol=1e-9, atol=1e-12)
        for a, b in zip(grad_small, grad_large):
            torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-10)


def loss_and_gradient(model, X: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """The full-batch loss and its gradient in every trainable parameter (zeros for one it does not reach)."""
    params = [p for p in model.parameters() if p.requires_grad]
    loss = model.loss(X, y, len(y))
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return [loss.detach(), *(torch.zeros_like(p) if g is None else g for p, g in zip(params, grads))]


@on_every_device
@pytest.mark.parametrize("method", METHODS)
def test_every_parameter_the_optimiser_moves_gets_a_finite_gradient(method, device):
    reg = fitted(method, device)
    model = copy.deepcopy(reg.model_).train()
    if not model.trainable:
        return  # its inference is all in the posterior fit
    Xt, yt = standardised(reg, *data())
    rows = slice(None) if model.full_batch else slice(0, 32)
    model.loss(Xt[rows], yt[rows], len(yt)).backward()
    moved = [p for group in model.parameter_groups() for p in group["params"]]
    assert moved
    for name, p in model.named_parameters():
        if p.numel() and any(p is q for q in moved):  # an empty one (no mean basis) moves nothing
            assert p.grad is not None and torch.isfinite(p.grad).all(), name


@on_every_device
@pytest.mark.parametrize("method", METHODS)
def test_float32_trains_and_its_posterior_agrees_with_float64_at_the_same_parameters(method, device):
    X, y = data()
    Xs = data(20, seed=1)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        single = regressor(method, device, dtype="float32").fit(X, y)
    assert next(single.model_.parameters()).dtype == torch.float32
    mean, std = single.predict(Xs, return_std=True)
    assert np.isfinite(mean).all() and np.isfinite(std).all()
    # a row's prediction does not depend on the other rows of the call (scikit-learn's subset invariance, whose
    # tolerance float32 round-off exceeds): each row alone, and the rows in two calls of other sizes
    alone = np.array([single.predict(Xs[i:i + 1], return_std=True) for i in range(len(Xs))])[:, :, 0]
    parts = np.concatenate([np.c_[single.predict(part, return_std=True)] for part in (Xs[:7], Xs[7:])])
    compare = np.testing.assert_array_equal if device == "cpu" else \
        functools.partial(np.testing.assert_allclose, rtol=1e-6, atol=1e-7)
    compare(alone, np.c_[mean, std])
    compare(parts, np.c_[mean, std])
    # training paths part within a few Adam steps (a step's size barely depends on its gradient's), so the
    # precisions are compared on one set of parameters: the float64 fit's, its posterior refitted in float32
    reg = fitted(method, device)
    model = copy.deepcopy(reg.model_).float()
    model.fit_posterior(*standardised(reg, X, y, torch.float32))
    with torch.no_grad():
        mean32, var32 = (t.double().cpu().numpy() for t in model.predict(standardised(reg, Xs, dtype=torch.float32)))
    mean64, std64 = reg.predict(Xs, return_std=True, latent=True)
    np.testing.assert_allclose(mean32 * reg.y_std_ + reg.y_mean_, mean64, rtol=0, atol=1e-3)
    np.testing.assert_allclose(np.sqrt(var32) * reg.y_std_, std64, rtol=0, atol=1e-3)


@pytest.mark.parametrize("method", METHODS)
def test_bad_input_is_refused_before_any_training(method):
    X, y = data(30)
    holed = X.copy()
    holed[4, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        regressor(method).fit(holed, y)
    with pytest.raises(ValueError, match="inconsistent numbers of samples"):
        regressor(method).fit(X[:-1], y)
    reg = fitted(method)
    with pytest.raises(ValueError, match="X has 2 features, but GPRegressor is expecting 3"):
        reg.predict(X[:, :2])


@pytest.mark.parametrize("method", METHODS)
def test_posterior_options_are_constructor_options(method):
    cls = get_model_class(method)
    for name in cls.posterior_options:
        assert any(name in inspect.signature(klass.__init__).parameters for klass in cls.__mro__
                   if "__init__" in vars(klass))


@on_every_device
@pytest.mark.parametrize("method", CLASSIFIERS)
def test_a_classifier_gives_probabilities_and_saves(tmp_path, method, device):
    X, _ = data(80)
    labels = np.where(X[:, 0] + 0.3 * X[:, 1] > 0, "yes", "no")
    settings = {"epochs": 3, "batch_size": 32, "lr": 0.05, **TINY[method]}
    clf = GPClassifier(method=method, progress=False, device=device, **settings).fit(X, labels)
    p = clf.predict_proba(X)
    assert p.shape == (80, 2) and np.all((p >= 0) & (p <= 1)) and np.allclose(p.sum(1), 1)
    assert set(clf.predict(X)) <= {"no", "yes"} and list(clf.classes_) == ["no", "yes"]
    clf.save(tmp_path / "clf.gps")
    np.testing.assert_array_equal(gpscale.load(tmp_path / "clf.gps").predict_proba(X), p)


def _awkward_data():
    """Data sets that break naive code: no noise at all, every row twice, inputs at 1e8, a constant column, two
    rows."""
    X, y = data(n=40)
    Xc = X.copy()
    Xc[:, 1] = 3.0
    yield "noiseless", X, np.sin(2 * X[:, 0]) + X[:, 1] ** 2
    yield "duplicated rows", np.r_[X[:20], X[:20]], np.r_[y[:20], y[:20]]
    yield "inputs at 1e8", X * 1e8, y
    yield "a constant column", Xc, y
    yield "two rows", X[:2], y[:2]


@on_every_device
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("method", METHODS)
def test_awkward_data_gives_finite_predictions_or_a_clear_error(method, dtype, device):
    """The numerical stress matrix: every method and dtype on each awkward data set predicts a finite mean and std,
    or refuses with a ValueError or RuntimeError (NotPSDError, TrainingError) that says what went wrong."""
    for name, X, y in _awkward_data():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mean, std = regressor(method, device, dtype=dtype, epochs=2).fit(X, y).predict(X, return_std=True)
        except (ValueError, RuntimeError) as err:
            assert len(str(err)) > 40, f"{name}: {err!r}"
            continue
        assert np.isfinite(mean).all() and np.isfinite(std).all() and (std > 0).all(), name

"""Every mistake a user of the Python API can make, one row each: what they did, the error it must raise and words
its message must hold (the option or file, the value, what to do). Each row runs on copies of a fitted regressor and
a fitted classifier and then checks that both still predict exactly as before: a refused call loses nothing.

The command line's rows are in test_command_line_errors.py, interruptions in test_interruption.py, and the numerical
stress matrix (every method x dtype x awkward data) in tests/test_contract.py."""
import copy
import hashlib
import io
import json
import struct
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import numpy as np
import pytest
import torch
from sklearn.exceptions import NotFittedError

import gpscale.estimator.base
from gpscale import GPClassifier, GPRegressor
from gpscale.io import FORMAT_VERSION, MAGIC, ModelFileError, read_model_file
from gpscale.linalg import NotPSDError
from gpscale.models import get_model_class
from gpscale.train import TrainingError, fit

pytestmark = pytest.mark.usefixtures("one_thread")


@dataclass
class Refusal:
    what: str  # the mistake, as the test's id
    call: Callable  # call(ctx): makes the mistake
    error: type | tuple[type, ...]
    message: str  # a regular expression the message must match


def _regression_data(n=40, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, (n, 2))
    return X, np.sin(2 * X[:, 0]) + X[:, 1] + 0.1 * rng.standard_normal(n) + 5.0


def _sealed(header_bytes: bytes, payload: bytes, version: int = FORMAT_VERSION) -> bytes:
    """A model file with a valid checksum around whatever header and payload bytes it is given."""
    body = b"".join([MAGIC, struct.pack("<I", version), struct.pack("<Q", len(header_bytes)), header_bytes,
                     struct.pack("<Q", len(payload)), payload])
    return body + hashlib.sha256(body).digest()


class NotATensor:
    """An object that weights_only unpickling refuses, as a model file's payload must never need."""


def _bad_model_files(folder, reg) -> dict:
    """Files that are not whole gpscale model files, each in its own way."""
    good = folder / "good.gps"
    reg.save(good)
    raw = good.read_bytes()
    header, tensors = read_model_file(good)
    payload = io.BytesIO()
    torch.save(tensors, payload)
    hostile = io.BytesIO()
    torch.save({"model": NotATensor()}, hostile)
    flipped = bytearray(raw)
    flipped[len(raw) // 2] ^= 0xFF
    contents = {
        "truncated": raw[: len(raw) // 2],
        "flipped": bytes(flipped),
        "foreign": b"PK\x03\x04 this is a zip, not a model",
        "not_json": _sealed(b"{not json", payload.getvalue()),
        "not_object": _sealed(b"[1, 2]", payload.getvalue()),
        "pickled": _sealed(json.dumps(header).encode(), hostile.getvalue()),
        "newer_major": _sealed(json.dumps({**header, "gpscale_version": "99.0.0"}).encode(), payload.getvalue()),
        "newer_format": _sealed(json.dumps(header).encode(), payload.getvalue(), FORMAT_VERSION + 1),
    }
    files = {"good": good}
    for name, content in contents.items():
        files[name] = folder / f"{name}.gps"
        files[name].write_bytes(content)
    return files


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    X, y = _regression_data()
    labels = np.where(y > np.median(y), "high", "low")
    reg = GPRegressor(method="exact", epochs=5, progress=False).fit(X, y)
    clf = GPClassifier(method="svgp", n_inducing=8, epochs=3, progress=False).fit(X, labels)
    files = _bad_model_files(tmp_path_factory.mktemp("files"), reg)
    return SimpleNamespace(X=X, y=y, labels=labels, reg=reg, clf=clf, files=files)


def _refit(**options):
    """Refit the regressor with ``options`` on data whose scaling differs from the first fit's, as a refit that
    reached the scaling before failing would show."""
    return lambda c: c.reg.set_params(**options).fit(c.X * 100, c.y * 50 + 3)


def _fit_y(transform):
    return lambda c: c.reg.fit(c.X, transform(c.y))


def _fit_X(transform):
    return lambda c: c.reg.fit(transform(c.X), c.y)


def _refit_classifier(labels, **options):
    return lambda c: c.clf.set_params(**options).fit(c.X, labels(c.labels))


def _train(model, **settings):
    """gpscale.train.fit, the trainer under the estimator, on the regression rows."""
    def call(c):
        X, y = torch.tensor(c.X), torch.tensor(c.y)
        fit(get_model_class(model)(2, **({"n_inducing": 4} if model != "exact" else {})).double(), X, y,
            progress=False, **settings)
    return call


def _with_missing(labels, row=2, missing=None):
    labels = labels.astype(object)
    labels[row::7] = missing
    return labels


OPTIONS = [
    Refusal("n_inducing=-5", _refit(method="svgp", n_inducing=-5), ValueError,
            r"n_inducing \(the number of inducing points.*\) must be an integer >= 1, got -5\."),
    Refusal("n_inducing=0 (svgp)", _refit(method="svgp", n_inducing=0), ValueError, "n_inducing .* got 0"),
    Refusal("n_inducing=0 (hvgp)", _refit(method="hvgp", n_inducing=0), ValueError, "n_inducing .* got 0"),
    Refusal("n_inducing='ten'", _refit(method="svgp", n_inducing="ten"), ValueError, "n_inducing .* got 'ten'"),
    Refusal("epochs=2.5", _refit(method="svgp", epochs=2.5), ValueError, "epochs .* must be an integer >= 1, got 2.5"),
    Refusal("epochs=True", _refit(epochs=True), ValueError, "epochs .* got True"),
    Refusal("chunk_size=0", _refit(method="svgp", chunk_size=0), ValueError, "chunk_size .* >= 1, got 0"),
    Refusal("lengthscale=nan", _refit(lengthscale=float("nan")), ValueError,
            "lengthscale .* must be a number > 0 or 'median', got nan"),
    Refusal("lengthscale=-1", _refit(lengthscale=-1.0), ValueError, "lengthscale .* got -1.0"),
    Refusal("outputscale=-1", _refit(outputscale=-1.0), ValueError, r"outputscale \(the kernel's initial signal"),
    Refusal("noise=-1", _refit(noise=-1.0), ValueError, r"noise \(the initial noise variance.* > 0, got -1.0"),
    Refusal("lr=inf", _refit(lr=float("inf")), ValueError, r"lr \(the optimiser's learning rate\) .* got inf"),
    Refusal("lr=-1", _refit(lr=-1.0), ValueError, "lr .* got -1.0"),
    Refusal("batch_size=0", _refit(method="svgp", batch_size=0), ValueError, "batch_size .* got 0"),
    Refusal("val_fraction=1", _refit(val_fraction=1.0), ValueError, r"val_fraction .* in \[0, 1\), got 1.0"),
    Refusal("patience=0", _refit(patience=0), ValueError, "patience .* got 0"),
    Refusal("method typo", _refit(method="magic"), ValueError,
            "Unknown method 'magic'.*Available methods: .*exact, .*sgpr, .*svgp"),
    Refusal("unknown option", lambda c: GPRegressor(method="sgpr", n_inducing_pts=3).fit(c.X, c.y), ValueError,
            "has no option 'n_inducing_pts'.*options:"),
    Refusal("unknown parameter to set_params", _refit(n_inducing_pts=3), ValueError,
            "Invalid parameter.*'n_inducing_pts' for GPRegressor: neither a parameter .* nor an option of any method"),
    Refusal("option of another method", _refit(method="exact", solver="qr"), ValueError,
            "Method 'exact' has no option 'solver'"),
    Refusal("option auto's choice lacks", _refit(method="auto", solver="qr"), ValueError,
            "method='auto' chose 'exact' .* which has no option 'solver'"),
    Refusal("ard='maybe'", _refit(ard="maybe"), ValueError,
            "ard must be True or False for method 'exact', got 'maybe'"),
    Refusal("ard='maybe' where None is the method's choice", _refit(method="hvgp", ard="maybe"), ValueError,
            r"ard must be True, False or None \(the method's choice\) for method 'hvgp', got 'maybe'"),
    Refusal("dtype=float16", _refit(dtype="float16"), ValueError, "dtype must be 'auto', 'float64' or 'float32'"),
    Refusal("dtype=torch.int64", _refit(dtype=torch.int64), ValueError, "dtype must be 'auto', 'float64' or 'float32'"),
    Refusal("device='gpu'", _refit(device="gpu"), ValueError, "device='gpu' is not a device name"),
    Refusal("device='tpu'", _refit(device="tpu"), ValueError, "not a device name|gpscale runs on"),
    Refusal("x_scaling='log'", _refit(x_scaling="log"), ValueError,
            "x_scaling must be one of 'standard', 'minmax', 'center', 'none', got 'log'"),
    Refusal("normalize_y='yes'", _refit(normalize_y="yes"), ValueError, "normalize_y must be True or False"),
    Refusal("kernel typo", _refit(kernel="rbff"), ValueError, "Unknown kernel 'rbff'; choose one of rbf, matern12"),
    Refusal("lr=1e3 diverges", _refit(lr=1e3, epochs=50), (TrainingError, NotPSDError), "lr|learning rate"),
    # float64: the loss rises from its first epoch, the optimiser diverged
    Refusal("extreme given hyperparameters", _refit(method="svgp", outputscale=1e12, noise=1e-9, learn_noise=False,
                                                    epochs=3, dtype="float64"),
            TrainingError, r"hyperparameters given \(outputscale=1e\+12, noise=1e-09, learn_noise=False\) may be "
                           "the cause: .*fit without them to start from the data"),
    # svgp's default float32, to convergence: the loss stays ~1e14 per point, far above a model ignoring X, or (on
    # another CPU's round-off) rises from its first epoch; either error names the hyperparameters given
    Refusal("extreme given hyperparameters, float32", _refit(method="svgp", outputscale=1e12, noise=1e-9,
                                                             learn_noise=False, epochs=None, max_steps=30),
            TrainingError, r"(nats per point at best, against .* for a model that ignores the inputs|the optimiser "
                           r"diverged).*hyperparameters given \(outputscale=1e\+12"),
    Refusal("a given lengthscale float32 cannot hold", _refit(lengthscale=1e8, noise=1e-9, learn_noise=False,
                                                              dtype="float32", epochs=3),
            (TrainingError, NotPSDError), r"hyperparameters given \(lengthscale=1e\+08, noise=1e-09"),
    Refusal("resume without checkpoint", _refit(method="svgp", resume=True), ValueError,
            "resume=True continues from a checkpoint: pass checkpoint=PATH"),
    Refusal("checkpoint in a missing folder",
            lambda c: c.reg.set_params(method="svgp", checkpoint=c.files["good"].parent / "missing" / "state.pt").fit(
                c.X, c.y),
            FileNotFoundError, "the folder .*missing does not exist; create it first"),
    Refusal("bernoulli for three classes", _refit_classifier(lambda y: np.arange(y.size) % 3, likelihood="bernoulli"),
            ValueError, "likelihood='bernoulli' is for two classes, but y has 3; use 'robustmax'"),
    Refusal("likelihood='logit'", _refit_classifier(lambda y: y, likelihood="logit"), ValueError,
            "likelihood must be None, 'bernoulli', 'robustmax' or 'softmax', got 'logit'"),
    Refusal("classifier with a regression-only method", _refit_classifier(lambda y: y, method="exact"), ValueError,
            "Method 'exact' supports the likelihoods .*'gaussian'.*, not 'bernoulli', which these methods take"),
]
if not torch.cuda.is_available():
    OPTIONS.append(Refusal("device='cuda' without CUDA", _refit(device="cuda"), ValueError,
                           "device='cuda', but this machine has no CUDA device"))

DATA = [
    Refusal("NaN in X", _fit_X(lambda X: np.where(np.arange(X.size).reshape(X.shape) == 4, np.nan, X)), ValueError,
            "NaN"),
    Refusal("inf in y", _fit_y(lambda y: np.where(np.arange(y.size) == 3, np.inf, y)), ValueError, "infinity|inf"),
    Refusal("X one-dimensional", _fit_X(lambda X: X[:, 0]), ValueError, "Expected 2D array"),
    Refusal("X three-dimensional", _fit_X(lambda X: X[None]), ValueError, "Found array with dim 3"),
    Refusal("X complex", _fit_X(lambda X: X + 1j), ValueError, "Complex data not supported"),
    Refusal("X and y of different lengths", _fit_y(lambda y: y[:-1]), ValueError, "inconsistent numbers of samples"),
    Refusal("one row", lambda c: c.reg.fit(c.X[:1], c.y[:1]), ValueError, "1 sample"),
    Refusal("no rows", lambda c: c.reg.fit(c.X[:0], c.y[:0]), ValueError, "0 sample"),
    Refusal("constant y", _fit_y(lambda y: np.full_like(y, 3.0)), ValueError,
            "y is constant .*Check the target column"),
    Refusal("y two columns", _fit_y(lambda y: np.c_[y, y]), ValueError, "y should be a 1d array"),
    Refusal("y text for a regressor", _fit_y(lambda y: np.where(np.arange(y.size) == 6, "six", y.astype(str))),
            ValueError, "y must be numbers for a regressor, but row 6 holds 'six'; use GPClassifier"),
    Refusal("one class", _refit_classifier(lambda y: np.full(y.size, "low")), ValueError,
            r"y holds one class only \('low'\): a classifier needs at least two"),
    Refusal("None among labels", _refit_classifier(lambda y: _with_missing(y)), ValueError,
            "y holds 6 missing label.*None or NaN.*the first at row 2"),
    Refusal("NaN among labels", _refit_classifier(lambda y: _with_missing((y == "high").astype(float), 4, np.nan)),
            ValueError, "y holds 6 missing label.*the first at row 4"),
    Refusal("continuous labels", _refit_classifier(lambda y: np.linspace(0, 1, y.size)), ValueError,
            "Unknown label type"),
]

PREDICTION = [
    Refusal("predict before fit", lambda c: GPRegressor().predict(c.X), NotFittedError, "not fitted yet"),
    Refusal("predict with the wrong feature count", lambda c: c.reg.predict(c.X[:, :1]), ValueError,
            "X has 1 features, but GPRegressor is expecting 2"),
    Refusal("predict NaN", lambda c: c.reg.predict(np.full((2, 2), np.nan)), ValueError, "NaN"),
    Refusal("return_std with return_cov", lambda c: c.reg.predict(c.X[:3], return_std=True, return_cov=True),
            ValueError, "return_std or return_cov, not both"),
    Refusal("sample_y n_samples=0", lambda c: c.reg.sample_y(c.X[:3], n_samples=0), ValueError,
            "n_samples must be a positive integer, got 0"),
    Refusal("classifier predict with the wrong feature count", lambda c: c.clf.predict_proba(c.X[:, :1]), ValueError,
            "X has 1 features, but GPClassifier is expecting 2"),
]

FILES = [
    Refusal(f"load {name}", lambda c, name=name: GPRegressor.load(c.files[name]), ModelFileError, message)
    for name, message in [
        ("truncated", "truncated|corrupt"), ("flipped", "corrupt"), ("foreign", "not a gpscale model file"),
        ("not_json", "cannot be read"), ("not_object", "not a JSON object"), ("pickled", "cannot be read"),
        ("newer_major", "gpscale 99.0.0, a newer major version"), ("newer_format", "newer than this gpscale reads")]
] + [
    Refusal("load a missing file", lambda c: GPRegressor.load(c.files["good"].parent / "missing.gps"), ModelFileError,
            "no such model file"),
    Refusal("load a folder", lambda c: GPRegressor.load(c.files["good"].parent), ModelFileError,
            "is a directory, not a gpscale model file"),
    Refusal("load a classifier as a regressor", lambda c: (c.clf.save(c.files["good"].parent / "clf.gps"),
                                                           GPRegressor.load(c.files["good"].parent / "clf.gps")),
            ModelFileError, "GPClassifier"),
    Refusal("save into a missing folder", lambda c: c.reg.save(c.files["good"].parent / "missing" / "m.gps"),
            FileNotFoundError, "the folder .* does not exist"),
    Refusal("save onto a folder", lambda c: c.reg.save(c.files["good"].parent), IsADirectoryError,
            "is a directory; give a file name to write"),
    Refusal("save before fit", lambda c: GPRegressor().save(c.files["good"].parent / "x.gps"), NotFittedError,
            "not fitted yet"),
]

TRAINER = [
    Refusal("fit epochs=0", _train("sgpr", epochs=0), ValueError, "epochs"),
    Refusal("fit lr=-1", _train("sgpr", lr=-1.0), ValueError, "lr"),
    Refusal("fit batch_size=0", _train("svgp", batch_size=0), ValueError, "batch_size"),
    Refusal("fit val_fraction=1", _train("sgpr", val_fraction=1.0), ValueError, "val_fraction"),
    Refusal("fit optimizer='sgd'", _train("sgpr", optimizer="sgd"), ValueError, "Unknown optimizer"),
    Refusal("lbfgs with validation", _train("sgpr", optimizer="lbfgs", val_fraction=0.2), ValueError,
            "without val_fraction"),
    Refusal("lbfgs with a schedule", _train("sgpr", optimizer="lbfgs", schedule="cosine"), ValueError,
            "without schedule"),
    Refusal("lbfgs on minibatches", _train("svgp", optimizer="lbfgs"), ValueError, "minibatches"),
    Refusal("a schedule without fixed epochs", _train("svgp", schedule="cosine"), ValueError,
            "schedule='cosine' anneals over a fixed number of epochs"),
    Refusal("resume without a checkpoint", _train("svgp", resume=True), ValueError, "resume"),
]

CASES = OPTIONS + DATA + PREDICTION + FILES + TRAINER


def test_the_suite_has_a_row_for_every_kind_of_mistake():
    assert len(CASES) >= 60 and len({case.what for case in CASES}) == len(CASES)


@pytest.mark.filterwarnings("ignore:Training failed")  # the diverging fit's restarts
@pytest.mark.parametrize("case", CASES, ids=[case.what for case in CASES])
def test_a_mistake_gets_a_clear_error_and_loses_nothing(fitted, case):
    ctx = SimpleNamespace(**{**vars(fitted), "reg": copy.deepcopy(fitted.reg), "clf": copy.deepcopy(fitted.clf)})
    with pytest.raises(case.error, match=case.message):
        case.call(ctx)
    np.testing.assert_array_equal(ctx.reg.predict(fitted.X, return_std=True), fitted.reg.predict(fitted.X,
                                                                                                 return_std=True))
    np.testing.assert_array_equal(ctx.clf.predict_proba(fitted.X), fitted.clf.predict_proba(fitted.X))
    assert list(ctx.clf.classes_) == ["high", "low"]


def test_the_error_of_a_failed_fit_says_what_the_estimator_kept(fitted):
    reg = copy.deepcopy(fitted.reg).set_params(method="magic")
    with pytest.raises(ValueError) as refit:
        reg.fit(fitted.X, fitted.y)
    assert refit.value.__notes__ == ["GPRegressor.fit did not finish; the estimator keeps the model it had before "
                                     "this call."]
    with pytest.raises(ValueError) as first:
        GPClassifier(method="magic").fit(fitted.X, fitted.labels)
    assert first.value.__notes__ == ["GPClassifier.fit did not finish; the estimator stays unfitted."]


def test_an_interrupted_refit_keeps_the_earlier_model(fitted, monkeypatch):
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    reg = copy.deepcopy(fitted.reg).set_params(x_scaling="minmax")
    monkeypatch.setattr(gpscale.estimator.base, "fit", interrupt)  # Ctrl-C in the middle of training
    with pytest.raises(KeyboardInterrupt):
        reg.fit(fitted.X * 100, fitted.y + 50)
    np.testing.assert_array_equal(reg.predict(fitted.X), fitted.reg.predict(fitted.X))
    assert not hasattr(GPRegressor(), "model_")


def test_numeric_text_is_read_as_numbers(fitted):
    as_text = GPRegressor(method="exact", epochs=5, progress=False).fit(fitted.X.astype(str), fitted.y.astype(str))
    np.testing.assert_allclose(as_text.predict(fitted.X), fitted.reg.predict(fitted.X), rtol=1e-12)

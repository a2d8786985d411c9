"""GPRegressor and GPClassifier: the gpscale methods behind the scikit-learn estimator contract."""
from __future__ import annotations

import inspect
import os
import time

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from . import __version__
from .distributed import LOCAL, Comm, TorchComm
from .io import ModelFileError, read_model_file, write_model_file
from .models import get_model_class
from .models.base import GPModel
from .train import fit

__all__ = ["GPRegressor", "GPClassifier", "load"]

_DTYPES = {"float64": torch.float64, "float32": torch.float32}


class _GPEstimator(BaseEstimator):
    """What the regressor and the classifier share: the method options as parameters, standardised X, training,
    the latent predictive, and saving and loading. Subclasses define ``fit`` and what their model file adds, and
    list every parameter in their own ``__init__`` (scikit-learn reads them from its signature)."""

    def __init__(self, method, n_inducing, epochs, batch_size, lr, kernel, val_fraction, seed, dtype, device,
                 progress, distributed, method_options: dict):
        self.method = method
        self.n_inducing = n_inducing
        self.epochs = epochs
        self.batch_size = batch_size
        self.lr = lr
        self.kernel = kernel
        self.val_fraction = val_fraction
        self.seed = seed
        self.dtype = dtype
        self.device = device
        self.progress = progress
        self.distributed = distributed
        self._method_options = tuple(sorted(method_options))
        for name, value in method_options.items():
            setattr(self, name, value)

    def get_params(self, deep=True):
        params = super().get_params(deep=deep)
        params.update({name: getattr(self, name) for name in self._method_options})
        return params

    # --- fitting -----------------------------------------------------------------------------------------
    def _comm(self) -> Comm:
        return TorchComm.from_env(self.device) if self.distributed else LOCAL

    def _train(self, X: np.ndarray, targets: np.ndarray, comm: Comm, common: dict, **training) -> None:
        """Standardise X with its global statistics, build the method with ``common`` options (those it accepts)
        and the method options, and train it on (X, targets)."""
        n, x_mean, x_std = _global_moments(X, comm)
        self.x_mean_, self.x_std_ = x_mean, _safe_std(x_std)
        self.rank_ = comm.rank
        cls = get_model_class(self.method)
        options = self._model_options(cls, n, common)
        model = cls(X.shape[1], **options).to(dtype=self._torch_dtype(), device=torch.device(self.device))
        tic = time.perf_counter()
        self.fit_result_ = fit(model, self._to_tensor(self._scale_x(X)), self._to_tensor(targets),
                               epochs=self.epochs, batch_size=self.batch_size, lr=self.lr,
                               val_fraction=self.val_fraction, seed=self.seed, progress=self.progress, comm=comm,
                               **training)
        self.training_seconds_ = time.perf_counter() - tic
        self.model_options_ = options
        self.model_ = model

    def _model_options(self, cls: type[GPModel], n: int, common: dict) -> dict:
        """Keyword options for ``cls``: the common ones it accepts, plus every method option (checked)."""
        accepted = _option_names(cls)
        options = {k: v for k, v in {"n_inducing": min(int(self.n_inducing), n), **common}.items()
                   if k in accepted and v is not None}
        for name in self._method_options:
            if name not in accepted:
                raise ValueError(f"Method {self.method!r} has no option {name!r}. Its options: "
                                 f"{', '.join(sorted(accepted))}.")
            options[name] = getattr(self, name)
        for name in cls.sizes_capped_by_rows:  # e.g. the mean basis of odvgp / odvff: at most one per row
            options[name] = min(int(options.get(name, _option_default(cls, name))), n)
        return options

    # --- prediction --------------------------------------------------------------------------------------
    def _latent(self, X) -> tuple[torch.Tensor, torch.Tensor]:
        """The latent predictive (mean, variance) at X, after the checks every predict method makes (call it
        without autograd)."""
        check_is_fitted(self, "model_")
        X = validate_data(self, _as_numpy(X), reset=False, dtype=np.float64)
        X = self._to_tensor(self._scale_x(X))
        self.model_.check_inputs(X)
        return self.model_.predict(X)

    # --- persistence -------------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike, metadata: dict | None = None) -> None:
        """Write the fitted model to one file (atomically); :meth:`load` reads it back.

        ``metadata`` (JSON-serialisable, e.g. feature names) is stored alongside and restored as ``metadata_``.
        """
        check_is_fitted(self, "model_")
        if getattr(self, "rank_", 0) != 0:  # data-parallel: every rank holds the same model; rank 0 writes it
            return
        header = {
            "kind": type(self).__name__,
            "gpscale_version": __version__,
            "torch_version": torch.__version__,
            "params": _jsonable(self.get_params()),
            "model_options": _jsonable(self.model_options_),
            "n_features_in": int(self.n_features_in_),
            **self._header(),
            "dtype": self.dtype,
            "metadata": metadata or {},
        }
        tensors = {"model": self.model_.state_dict(), "x_mean": torch.as_tensor(self.x_mean_),
                   "x_std": torch.as_tensor(self.x_std_)}
        write_model_file(path, header, tensors)

    @classmethod
    def load(cls, path: str | os.PathLike, device: str | None = None):
        """Read a model written by :meth:`save`; predictions are identical to the saved model's."""
        header, tensors = read_model_file(path)
        if header.get("kind") != cls.__name__:
            raise ModelFileError(f"{path} holds a {header.get('kind')!r}, not a {cls.__name__}.")
        return cls._restore(path, header, tensors, device)

    @classmethod
    def _restore(cls, path, header: dict, tensors: dict, device: str | None):
        try:
            params = dict(header["params"])
            if device is not None:
                params["device"] = device
            est = cls(**params)
            model_cls = get_model_class(est.method)
            model = model_cls(header["n_features_in"], **header["model_options"])
            # cast before loading: load_state_dict copies into the parameters' current dtype
            model.to(dtype=est._torch_dtype(), device=torch.device(est.device))
            model.load_state_dict(tensors["model"])
            device = torch.device(est.device)  # a list holds per-device factors (HVGP's placed blocks)
            model.cache = {k: [t.to(device) for t in v] if isinstance(v, list) else v.to(device)
                           for k, v in model.cache.items()}
            est.model_ = model.eval()
            est.model_options_ = header["model_options"]
            est.n_features_in_ = header["n_features_in"]
            est.x_mean_, est.x_std_ = tensors["x_mean"].numpy(), tensors["x_std"].numpy()
            est._restore_header(header)
            est.metadata_ = header["metadata"]
        except (KeyError, TypeError, RuntimeError, ValueError) as err:
            raise ModelFileError(f"{path} could not be restored as a {cls.__name__} ({err}); it may come from an "
                                 "incompatible gpscale version.") from err
        return est

    def _header(self) -> dict:  # pragma: no cover - interface
        """What this estimator's model file holds beyond the model and the X scaling."""
        raise NotImplementedError

    def _restore_header(self, header: dict) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    # --- helpers -----------------------------------------------------------------------------------------
    def _torch_dtype(self) -> torch.dtype:
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be 'float64' or 'float32', got {self.dtype!r}.")
        return _DTYPES[self.dtype]

    def _scale_x(self, X: np.ndarray) -> np.ndarray:
        return (X - self.x_mean_) / self.x_std_

    def _to_tensor(self, a: np.ndarray) -> torch.Tensor:
        return torch.tensor(a, dtype=self._torch_dtype(), device=torch.device(self.device))


class GPRegressor(RegressorMixin, _GPEstimator):
    """Gaussian-process regression with any gpscale method.

    X is standardised per column and y to zero mean and unit variance with training statistics, which are
    stored with the model; predictions come back in the original units.

    Parameters
    ----------
    method : str, default="sgpr"
        Registry key: ``"exact"``, ``"sgpr"``, ``"svgp"`` (and the methods added later).
    n_inducing : int, default=512
        Inducing points (or basis functions) for methods that have them; capped at n.
    epochs, batch_size, lr : training length, minibatch size (minibatch methods) and Adam learning rate.
    optimizer : {"adam", "lbfgs"}, default="adam"
        "lbfgs": scipy's L-BFGS-B on the full-batch loss for at most ``epochs`` iterations (full-batch methods
        only; no ``lr``, no validation), see :func:`gpscale.train.fit`.
    kernel : {"rbf", "matern12", "matern32", "matern52"} or None, default=None
        None: the method's default ("rbf", except "matern32" for the Fourier-feature methods, which need a Matérn).
    noise : float or None, default=None
        Initial noise variance of standardised y (fixed if ``learn_noise=False``). None: the method's default
        (ln 2 = softplus(0), as GPyTorch, for exact/SGPR/SVGP; SoftKI's paper setting is a fixed 1e-3).
    learn_noise : bool or None, default=None
        None: the method's default (learned, except for SoftKI).
    val_fraction : float, default=0.0
        Hold out this fraction for early stopping on validation NLPD (0: no validation).
    seed : int, default=0
    dtype : {"float64", "float32"}, default="float64"
    device : str, default="cpu"
    progress : bool, default=True
        A progress bar while training (in a terminal; written to a file, a line a minute at most).
    distributed : bool, default=False
        Data-parallel training under torchrun (:mod:`gpscale.distributed`): every process calls ``fit`` with its
        own shard of the rows; the scaling statistics and n are global, and the fitted model equals the
        one-process fit on all rows (see :func:`gpscale.train.fit` for what is supported). :meth:`save` writes
        on rank 0 only.
    **method_options
        Passed to the method (e.g. ``jitter``, ``solver``, ``learn_inducing``, ``ard``, ``chunk_size``).

    Attributes
    ----------
    model_ : GPModel, the trained model.
    n_features_in_ : int
    x_mean_, x_std_ : ndarray (d,), y_mean_, y_std_ : float, training statistics.
    training_seconds_ : float, wall time of training (initialisation and posterior included).
    fit_result_ : gpscale.train.FitResult (loss history, restarts, timing).
    """

    def __init__(self, method="sgpr", n_inducing=512, epochs=50, batch_size=1024, lr=0.01, optimizer="adam",
                 kernel=None, noise=None, learn_noise=None, val_fraction=0.0, seed=0, dtype="float64", device="cpu",
                 progress=True, distributed=False, **method_options):
        self.optimizer = optimizer
        self.noise = noise
        self.learn_noise = learn_noise
        super().__init__(method, n_inducing, epochs, batch_size, lr, kernel, val_fraction, seed, dtype, device,
                         progress, distributed, method_options)

    def fit(self, X, y):
        """Standardise, train and fit the posterior. X: (n, d), y: (n,). Returns self."""
        X, y = validate_data(self, _as_numpy(X), _as_numpy(y), y_numeric=True, ensure_min_samples=2,
                             dtype=np.float64)
        comm = self._comm()
        _, y_mean, y_std = _global_moments(y, comm)
        if y_std == 0:
            raise ValueError(f"y is constant (every value is {y[0]!r}): there is nothing for a GP to fit. Check "
                             "the target column.")
        self.y_mean_, self.y_std_ = float(y_mean), float(y_std)
        self._train(X, (y - self.y_mean_) / self.y_std_, comm,
                    {"kernel": self.kernel, "noise": self.noise, "learn_noise": self.learn_noise},
                    optimizer=self.optimizer)
        return self

    @torch.no_grad()
    def predict(self, X, return_std=False):
        """Predictive mean (n*,) of y, and with ``return_std=True`` its standard deviation (noise included)."""
        mean_f, var_f = self._latent(X)
        mean, var = self.model_.likelihood.predictive(mean_f, var_f)
        mean = mean.double().cpu().numpy() * self.y_std_ + self.y_mean_
        if not return_std:
            return mean
        return mean, np.sqrt(var.double().cpu().numpy()) * self.y_std_

    def _header(self) -> dict:
        return {"scaling": {"y_mean": self.y_mean_, "y_std": self.y_std_}}

    def _restore_header(self, header: dict) -> None:
        self.y_mean_, self.y_std_ = header["scaling"]["y_mean"], header["scaling"]["y_std"]


class GPClassifier(ClassifierMixin, _GPEstimator):
    """Gaussian-process classification with a variational gpscale method.

    Two classes use the probit (Bernoulli) likelihood, more the robust-max one (or ``likelihood="softmax"``),
    each through the method's expected log-likelihood. Labels may be any values that ``numpy.unique`` sorts
    (numbers under ``distributed=True``); X is standardised per column with training statistics.

    Parameters
    ----------
    method : str, default="svgp"
        A method whose objective takes a non-Gaussian likelihood: ``"svgp"``, ``"hvgp"``, ``"odvgp"``,
        ``"odvff"``, ``"vff-svgp"``; the others say so.
    likelihood : {None, "bernoulli", "robustmax", "softmax"}, default=None
        None: "bernoulli" for two classes, "robustmax" for more.
    n_inducing, epochs, batch_size, lr, kernel, val_fraction, seed, dtype, device, progress, distributed,
    **method_options : as for :class:`GPRegressor` (validation scores the NLPD of the held-out labels).

    Attributes
    ----------
    classes_ : ndarray (C,), the labels, sorted; ``predict_proba``'s columns follow them.
    model_, n_features_in_, x_mean_, x_std_, training_seconds_, fit_result_ : as for :class:`GPRegressor`.
    """

    def __init__(self, method="svgp", n_inducing=512, epochs=50, batch_size=1024, lr=0.01, kernel=None,
                 likelihood=None, val_fraction=0.0, seed=0, dtype="float64", device="cpu", progress=True,
                 distributed=False, **method_options):
        self.likelihood = likelihood
        super().__init__(method, n_inducing, epochs, batch_size, lr, kernel, val_fraction, seed, dtype, device,
                         progress, distributed, method_options)

    def fit(self, X, y):
        """Train on X (n, d) and labels y (n,). Returns self."""
        X, y = validate_data(self, _as_numpy(X), _as_numpy(y), ensure_min_samples=2, dtype=np.float64)
        check_classification_targets(y)
        comm = self._comm()
        self.classes_ = _global_classes(y, comm)
        C = len(self.classes_)
        if C < 2:
            raise ValueError(f"y holds one class only ({self.classes_[0]!r}): a classifier needs at least two.")
        likelihood = self.likelihood or ("bernoulli" if C == 2 else "robustmax")
        if likelihood == "bernoulli" and C > 2:
            raise ValueError(f"likelihood='bernoulli' is for two classes, but y has {C}; use 'robustmax' or "
                             "'softmax' (or leave likelihood=None).")
        if likelihood not in ("bernoulli", "robustmax", "softmax"):
            raise ValueError(f"likelihood must be None, 'bernoulli', 'robustmax' or 'softmax', got {likelihood!r}.")
        codes = np.searchsorted(self.classes_, y).astype(np.float64)
        targets = 2 * codes - 1 if likelihood == "bernoulli" else codes  # probit's labels are -1 / +1
        self._train(X, targets, comm, {"kernel": self.kernel, "likelihood": likelihood,
                                       "n_classes": None if likelihood == "bernoulli" else C})
        return self

    @torch.no_grad()
    def predict_proba(self, X):
        """Predictive class probabilities (n*, C), columns in the order of ``classes_``."""
        mean_f, var_f = self._latent(X)
        p = self.model_.likelihood.probability(mean_f, var_f).double().cpu().numpy()
        return np.stack([1 - p, p], axis=1) if p.ndim == 1 else p

    def predict(self, X):
        """The most probable class (n*,) of each row."""
        most_probable = self.predict_proba(X).argmax(axis=1)  # first: it checks that the model is fitted
        return self.classes_[most_probable]

    def _header(self) -> dict:
        return {"classes": self.classes_.tolist()}

    def _restore_header(self, header: dict) -> None:
        self.classes_ = np.asarray(header["classes"])


def load(path: str | os.PathLike, device: str | None = None) -> GPRegressor | GPClassifier:
    """Load a model saved by :meth:`GPRegressor.save` or :meth:`GPClassifier.save`."""
    header, tensors = read_model_file(path)
    kinds = {klass.__name__: klass for klass in (GPRegressor, GPClassifier)}
    if header.get("kind") not in kinds:
        raise ModelFileError(f"{path} holds a {header.get('kind')!r}, not a GPRegressor or a GPClassifier.")
    return kinds[header["kind"]]._restore(path, header, tensors, device)


def _global_classes(y: np.ndarray, comm: Comm) -> np.ndarray:
    """The sorted labels of every process's y."""
    classes = np.unique(y)
    if comm.world_size == 1:
        return classes
    if not np.issubdtype(classes.dtype, np.number):
        raise ValueError("Under distributed=True the labels must be numbers (each process holds some of them); "
                         f"got {classes.dtype}. Encode them as integers first.")
    return np.unique(comm.all_gather(torch.as_tensor(classes, dtype=torch.float64)).numpy()).astype(classes.dtype)


def _global_moments(A: np.ndarray, comm: Comm) -> tuple[int, np.ndarray, np.ndarray]:
    """n, and the mean and (population) standard deviation over axis 0 of the rows of every process's A."""
    n = int(comm.all_reduce_sum(torch.tensor(float(A.shape[0]), dtype=torch.float64)).item())
    mean = comm.all_reduce_sum(torch.as_tensor(np.asarray(A.sum(0)))).numpy() / n
    variance = comm.all_reduce_sum(torch.as_tensor(np.asarray(((A - mean) ** 2).sum(0)))).numpy() / n
    return n, mean, np.sqrt(variance)


def _as_numpy(a):
    """Torch tensors (on any device, with or without grad) become numpy; everything else passes through."""
    if isinstance(a, torch.Tensor):
        return a.detach().cpu().numpy()
    return a


def _safe_std(std: np.ndarray) -> np.ndarray:
    """Constant columns keep scale 1, so they standardise to 0 instead of NaN."""
    return np.where(std > 0, std, 1.0)


def _option_names(cls: type[GPModel]) -> set[str]:
    """Keyword options of a model class and of its bases up to GPModel."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass is torch.nn.Module or not issubclass(klass, GPModel):
            break
        params = inspect.signature(klass.__init__).parameters.values()
        names |= {p.name for p in params if p.kind == p.KEYWORD_ONLY or
                  (p.kind == p.POSITIONAL_OR_KEYWORD and p.name not in ("self", "n_features"))}
    return names


def _option_default(cls: type[GPModel], name: str):
    """The default of keyword option ``name`` in the first class of ``cls``'s MRO that declares it."""
    for klass in cls.__mro__:
        params = inspect.signature(klass.__init__).parameters
        if name in params:
            return params[name].default
    raise KeyError(name)


_SCALARS = (str, int, float, bool, type(None))


def _jsonable(params: dict) -> dict:
    """The options as JSON values; lists and tuples of scalars (e.g. ``image_shape``, ``devices``) become lists."""
    def scalar_sequence(v):
        return isinstance(v, (list, tuple)) and all(isinstance(x, _SCALARS) for x in v)

    bad = [k for k, v in params.items() if not (isinstance(v, _SCALARS) or scalar_sequence(v))]
    if bad:
        raise ValueError(f"Cannot save options {bad}: only str/int/float/bool/None options, and lists of them, can "
                         "be stored.")
    return {k: list(v) if isinstance(v, tuple) else v for k, v in params.items()}

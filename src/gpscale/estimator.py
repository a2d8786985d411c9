"""GPRegressor: every gpscale method behind the scikit-learn estimator contract."""
from __future__ import annotations

import inspect
import os
import time

import numpy as np
import torch
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from . import __version__
from .distributed import LOCAL, Comm, TorchComm
from .io import ModelFileError, read_model_file, write_model_file
from .models import get_model_class
from .models.base import GPModel
from .train import fit

__all__ = ["GPRegressor"]

_DTYPES = {"float64": torch.float64, "float32": torch.float32}


class GPRegressor(RegressorMixin, BaseEstimator):
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
        A progress bar while training (only in a terminal).
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
        self.method = method
        self.n_inducing = n_inducing
        self.epochs = epochs
        self.batch_size = batch_size
        self.lr = lr
        self.optimizer = optimizer
        self.kernel = kernel
        self.noise = noise
        self.learn_noise = learn_noise
        self.val_fraction = val_fraction
        self.seed = seed
        self.dtype = dtype
        self.device = device
        self.progress = progress
        self.distributed = distributed
        self._method_options = tuple(sorted(method_options))
        for name, value in method_options.items():
            setattr(self, name, value)

    # --- scikit-learn parameter protocol (the method options are parameters too) -------------------------
    def get_params(self, deep=True):
        params = super().get_params(deep=deep)
        params.update({name: getattr(self, name) for name in self._method_options})
        return params

    # --- fitting -----------------------------------------------------------------------------------------
    def fit(self, X, y):
        """Standardise, train and fit the posterior. X: (n, d), y: (n,). Returns self."""
        X, y = validate_data(self, _as_numpy(X), _as_numpy(y), y_numeric=True, ensure_min_samples=2,
                             dtype=np.float64)
        comm = TorchComm.from_env() if self.distributed else LOCAL
        n, x_mean, x_std = _global_moments(X, comm)
        _, y_mean, y_std = _global_moments(y, comm)
        if y_std == 0:
            raise ValueError(f"y is constant (every value is {y[0]!r}): there is nothing for a GP to fit. Check "
                             "the target column.")
        dtype, device = self._torch_dtype(), torch.device(self.device)
        self.x_mean_, self.x_std_ = x_mean, _safe_std(x_std)
        self.y_mean_, self.y_std_ = float(y_mean), float(y_std)
        self.rank_ = comm.rank
        Xt, yt = self._to_tensor(self._scale_x(X)), self._to_tensor((y - self.y_mean_) / self.y_std_)
        cls = get_model_class(self.method)
        options = self._model_options(cls, n)
        model = cls(X.shape[1], **options).to(dtype=dtype, device=device)
        tic = time.perf_counter()
        self.fit_result_ = fit(model, Xt, yt, epochs=self.epochs, batch_size=self.batch_size, lr=self.lr,
                               optimizer=self.optimizer, val_fraction=self.val_fraction, seed=self.seed,
                               progress=self.progress, comm=comm)
        self.training_seconds_ = time.perf_counter() - tic
        self.model_options_ = options
        self.model_ = model
        return self

    def _model_options(self, cls: type[GPModel], n: int) -> dict:
        """Keyword options for ``cls``: the common ones it accepts, plus every method option (checked)."""
        accepted = _option_names(cls)
        common = {"n_inducing": min(int(self.n_inducing), n), "kernel": self.kernel, "noise": self.noise,
                  "learn_noise": self.learn_noise}
        options = {k: v for k, v in common.items() if k in accepted and v is not None}
        for name in self._method_options:
            if name not in accepted:
                raise ValueError(f"Method {self.method!r} has no option {name!r}. Its options: "
                                 f"{', '.join(sorted(accepted))}.")
            options[name] = getattr(self, name)
        for name in cls.sizes_capped_by_rows:  # e.g. the mean basis of odvgp / odvff: at most one per row
            options[name] = min(int(options.get(name, _option_default(cls, name))), n)
        return options

    # --- prediction --------------------------------------------------------------------------------------
    def predict(self, X, return_std=False):
        """Predictive mean (n*,) of y, and with ``return_std=True`` its standard deviation (noise included)."""
        check_is_fitted(self, "model_")
        X = validate_data(self, _as_numpy(X), reset=False, dtype=np.float64)
        with torch.no_grad():
            mean_f, var_f = self.model_.predict(self._to_tensor(self._scale_x(X)))
            mean, var = self.model_.likelihood.predictive(mean_f, var_f)
        mean = mean.double().cpu().numpy() * self.y_std_ + self.y_mean_
        if not return_std:
            return mean
        return mean, np.sqrt(var.double().cpu().numpy()) * self.y_std_

    # --- persistence -------------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike, metadata: dict | None = None) -> None:
        """Write the fitted model to one file (atomically); :meth:`load` reads it back.

        ``metadata`` (JSON-serialisable, e.g. feature names) is stored alongside and restored as ``metadata_``.
        """
        check_is_fitted(self, "model_")
        if getattr(self, "rank_", 0) != 0:  # data-parallel: every rank holds the same model; rank 0 writes it
            return
        header = {
            "kind": "GPRegressor",
            "gpscale_version": __version__,
            "torch_version": torch.__version__,
            "params": _jsonable(self.get_params()),
            "model_options": _jsonable(self.model_options_),
            "n_features_in": int(self.n_features_in_),
            "scaling": {"y_mean": self.y_mean_, "y_std": self.y_std_},
            "dtype": self.dtype,
            "metadata": metadata or {},
        }
        tensors = {"model": self.model_.state_dict(), "x_mean": torch.as_tensor(self.x_mean_),
                   "x_std": torch.as_tensor(self.x_std_)}
        write_model_file(path, header, tensors)

    @classmethod
    def load(cls, path: str | os.PathLike, device: str | None = None) -> "GPRegressor":
        """Read a model written by :meth:`save`; predictions are identical to the saved model's."""
        header, tensors = read_model_file(path)
        if header.get("kind") != "GPRegressor":
            raise ModelFileError(f"{path} holds a {header.get('kind')!r}, not a GPRegressor.")
        try:
            params = dict(header["params"])
            if device is not None:
                params["device"] = device
            reg = cls(**params)
            model_cls = get_model_class(reg.method)
            model = model_cls(header["n_features_in"], **header["model_options"])
            # cast before loading: load_state_dict copies into the parameters' current dtype
            model.to(dtype=reg._torch_dtype(), device=torch.device(reg.device))
            model.load_state_dict(tensors["model"])
            device = torch.device(reg.device)  # a list holds per-device factors (HVGP's placed blocks)
            model.cache = {k: [t.to(device) for t in v] if isinstance(v, list) else v.to(device)
                           for k, v in model.cache.items()}
            reg.model_ = model.eval()
            reg.model_options_ = header["model_options"]
            reg.n_features_in_ = header["n_features_in"]
            reg.x_mean_, reg.x_std_ = tensors["x_mean"].numpy(), tensors["x_std"].numpy()
            reg.y_mean_, reg.y_std_ = header["scaling"]["y_mean"], header["scaling"]["y_std"]
            reg.metadata_ = header["metadata"]
        except (KeyError, TypeError, RuntimeError, ValueError) as err:
            raise ModelFileError(f"{path} could not be restored as a GPRegressor ({err}); it may come from an "
                                 "incompatible gpscale version.") from err
        return reg

    # --- helpers -----------------------------------------------------------------------------------------
    def _torch_dtype(self) -> torch.dtype:
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be 'float64' or 'float32', got {self.dtype!r}.")
        return _DTYPES[self.dtype]

    def _scale_x(self, X: np.ndarray) -> np.ndarray:
        return (X - self.x_mean_) / self.x_std_

    def _to_tensor(self, a: np.ndarray) -> torch.Tensor:
        return torch.tensor(a, dtype=self._torch_dtype(), device=torch.device(self.device))


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

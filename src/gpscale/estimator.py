"""GPRegressor and GPClassifier: the gpscale methods behind the scikit-learn estimator contract."""
from __future__ import annotations

import contextlib
import copy
import functools
import json
import math
import os
import sys
import time
import warnings
from dataclasses import replace

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils.metadata_routing import UNUSED
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from ._version import __version__
from .defaults import Choice, choose_method, default_dtype, exact_max_steps, sgpr_max_steps
from .distributed import LOCAL, Comm, TorchComm, agree, global_count, row_offset
from .io import ModelFileError, read_model_file, write_model_file
from .kernels import Kernel, kernel_from_spec, kernel_spec
from .linalg import NotPSDError, cholesky
from .memory import check_tensors_fit, per_process_bytes
from .models import available_methods, get_model_class
from .models.base import GPModel, mixture_moments, option_default, option_names
from .options import check_options
from .scaling import SCALINGS, fit_scaling, robust_centre_and_spread, warn_outlying_targets
from .sources import ArrayRows, StagedRows, Table, TableScan
from .train import TrainingError, fit

__all__ = ["GPRegressor", "GPClassifier", "load", "named_blocks", "resolve_dtype", "check_device",
           "boolean_options"]

_DTYPES = {"float64": torch.float64, "float32": torch.float32}
# float64 n* x n* matrices return_cov and sample_y hold in host memory: the covariance and sample_y's Cholesky factor
JOINT_HOST_MATRICES = 2
# Sizes of a basis placed at training rows (k-means centres): at most one per row, whatever the method
SIZES_CAPPED_BY_ROWS = ("n_inducing", "n_mean_inducing", "n_extra_inducing")


def _all_or_nothing(fit_method):
    """A ``fit`` that fails or is interrupted (an error, Ctrl-C) leaves the estimator's attributes as they were:
    a model fitted earlier keeps its own scaling and classes. The error carries a note saying so."""

    @functools.wraps(fit_method)
    def wrapper(self, *args, **kwargs):
        before = dict(vars(self))
        try:
            return fit_method(self, *args, **kwargs)
        except BaseException as error:
            vars(self).clear()
            vars(self).update(before)
            kept = "keeps the model it had before this call" if "model_" in before else "stays unfitted"
            error.add_note(f"{type(self).__name__}.fit did not finish; the estimator {kept}.")
            raise

    return wrapper


class _GPEstimator(BaseEstimator):
    """What the regressor and the classifier share: the method options as parameters, standardised X, training,
    the latent predictive, and saving and loading. Subclasses define ``fit`` and what their model file adds, and
    list every parameter in their own ``__init__`` (scikit-learn reads them from its signature).

    Every option of every registered method is a parameter too: those given to the constructor or to
    :meth:`set_params` are listed by :meth:`get_params`, so ``clone`` and ``GridSearchCV`` reach them, and ``fit``
    refuses one that the method it trains does not take.
    """

    _task = ""  # "regression" or "classification", for method="auto"

    def __init__(self, method, n_inducing, epochs, max_steps, batch_size, lr, kernel, x_scaling, val_fraction,
                 patience, val_every, seed, dtype, device, progress, distributed, checkpoint, resume,
                 method_options: dict):
        self.method = method
        self.n_inducing = n_inducing
        self.epochs = epochs
        self.max_steps = max_steps
        self.batch_size = batch_size
        self.lr = lr
        self.kernel = kernel
        self.x_scaling = x_scaling
        self.val_fraction = val_fraction
        self.patience = patience
        self.val_every = val_every
        self.seed = seed
        self.dtype = dtype
        self.device = device
        self.progress = progress
        self.distributed = distributed
        self.checkpoint = checkpoint
        self.resume = resume
        self._method_options = tuple(sorted(method_options))
        for name, value in method_options.items():
            setattr(self, name, value)

    def get_params(self, deep=True):
        params = super().get_params(deep=deep)
        params.update({name: getattr(self, name) for name in self._method_options})
        return params

    def set_params(self, **params):
        """Set parameters, including any option of any registered method (e.g. ``ard``, ``solver``,
        ``calibrate_noise``): it becomes a method option, passed to the method at ``fit``."""
        own = set(self._get_param_names())
        options = {k: v for k, v in params.items() if k not in own}
        unknown = sorted(set(options) - set(self._method_options) - _all_method_options())
        if unknown:
            raise ValueError(f"Invalid parameter(s) {', '.join(map(repr, unknown))} for {type(self).__name__}: "
                             f"neither a parameter ({', '.join(sorted(own))}) nor an option of any method "
                             f"({', '.join(available_methods())}).")
        super().set_params(**{k: v for k, v in params.items() if k in own})
        for name, value in options.items():
            setattr(self, name, value)
        self._method_options = tuple(sorted(set(self._method_options) | set(options)))
        return self

    # --- fitting -----------------------------------------------------------------------------------------
    def _comm(self) -> Comm:
        return TorchComm.from_env(self.device) if self.distributed else LOCAL

    def _check_settings(self) -> torch.device:
        """What ``fit`` checks before touching the data: the values of the options (:mod:`gpscale.options`), the
        method, the scaling, the dtype and the device."""
        check_options(self.get_params(deep=False))
        if self.method != "auto":
            get_model_class(self.method)  # an unknown method says which exist
        if self.x_scaling not in SCALINGS:
            raise ValueError(f"x_scaling must be one of {', '.join(map(repr, SCALINGS))}, got {self.x_scaling!r}: "
                             "'standard' z-scores each column, 'minmax' maps the training rows onto [-1, 1], 'none' "
                             "keeps X as given.")
        if not (isinstance(self.dtype, str) and self.dtype == "auto"):
            resolve_dtype(self.dtype)
        return check_device(self.device)

    def _train(self, data: ArrayRows | StagedRows, comm: Comm, common: dict, fitted: dict, **training) -> None:
        """Scale X as ``x_scaling`` says with its global statistics, choose the method (``method="auto"``), build
        it with ``common`` options (those it accepts) and the method options, and train it on ``data`` (arrays,
        or a table's rows staged on disk). The fitted attributes, ``fitted`` among them, are set together at the
        end: a fit that fails or is interrupted leaves the estimator as it was."""
        device = self._check_settings()
        n, d = global_count(data.n, comm), data.d
        x_scale = data.x_moments().scaling(self.x_scaling, comm)
        if self.method == "auto":
            choice = choose_method(n, d, self._task, n_inducing=self.n_inducing,
                                   memory_bytes=per_process_bytes(device, comm), device_type=device.type)
        else:
            capped = sgpr_max_steps(n, d, self.n_inducing) if self.method == "sgpr" else None
            choice = Choice(self.method, "named by the caller", capped)
        cls = get_model_class(choice.method)
        dtype = resolve_dtype(self.dtype, choice.method)
        options = self._model_options(cls, n, common, choice)
        if choice.method == "exact":  # its evidence's budget of work, as sgpr's passes
            rows = options.get("evidence_rows", option_default(cls, "evidence_rows"))
            choice = replace(choice, max_steps=exact_max_steps(n, rows))
        model = cls(d, **options).to(dtype=dtype, device=device)
        model.check_memory(n, comm)  # before any training: a matrix the fit would form must fit
        if "lengthscale" not in options and not isinstance(options.get("kernel"), Kernel):
            model.start_lengthscale_at_median()  # see gpscale.defaults: ln 2 leaves L-BFGS without a gradient
        tic = time.perf_counter()
        max_steps = self.max_steps if self.max_steps is not None else choice.max_steps
        X, y, mapped = agree(comm, lambda: data.tensors(x_scale, dtype, device))  # a full disk on one process
        try:
            result = fit(model, X, y, epochs=self.epochs, max_steps=max_steps,
                         batch_size=self.batch_size, lr=self.lr, val_fraction=self.val_fraction,
                         patience=self.patience, val_every=self.val_every, seed=self.seed, progress=self.progress,
                         checkpoint=self.checkpoint, resume=self.resume, comm=comm,
                         checkpoint_settings=_checkpoint_settings(options, x_scale, fitted),
                         mapped=mapped, **training)
        except (NotPSDError, TrainingError) as error:
            given = _given_hyperparameters(options)
            if given:
                error.args = (f"{error.args[0]} The hyperparameters given ({given}) may be the cause: they apply to "
                              "the standardised data, so values far from 1 make the covariance singular or the "
                              "objective steep; fit without them to start from the data, or use dtype='float64'.",
                              *error.args[1:])
            raise
        seconds = time.perf_counter() - tic
        settings = result.settings
        training = {"rows": n, "trainable": model.trainable, "optimizer": settings.optimizer, "epochs": settings.epochs,
                    "max_steps": settings.max_steps, "steps": result.steps, "converged": result.converged,
                    "final_objective": result.final_loss, "seconds": seconds}
        for name, value in {**fitted, "x_mean_": x_scale.shift, "x_std_": x_scale.scale, "dtype_": dtype,
                            "device_": device, "rank_": comm.rank,
                            "method_": choice.method, "method_reason_": choice.reason, "fit_result_": result,
                            "training_": training, "training_seconds_": seconds, "model_options_": options,
                            "model_": model}.items():
            setattr(self, name, value)

    def _scan(self, table: Table, y, comm: Comm, labels: bool) -> TableScan:
        """The first pass over ``table``'s rows (this process's block of them under data parallelism), with the
        checks that ``validate_data`` makes of arrays; sets ``n_features_in_`` and ``feature_names_in_`` as it
        does for a data frame."""
        if y is not None:
            raise ValueError(f"fit({table!r}) takes y from the table's target column {table.target!r}: pass no y.")
        scan = agree(comm, lambda: TableScan(table, (comm.rank, comm.world_size), labels))
        _check_global_rows(scan.n, comm)
        if comm.world_size == 1 and scan.n < 2:
            raise ValueError(f"{table.path} has {scan.n} data row; a fit needs at least 2.")
        self.n_features_in_, self.feature_names_in_ = scan.d, np.asarray(table.features, dtype=object)
        return scan

    def _model_options(self, cls: type[GPModel], n: int, common: dict, choice: Choice) -> dict:
        """Keyword options for ``cls``: the common ones it accepts, plus every method option (checked); sizes
        capped at the number of rows. Objects (a kernel) are copied, so that fit never changes what it was given."""
        accepted = option_names(cls)
        options = {k: v for k, v in {"n_inducing": self.n_inducing, **common}.items()
                   if k in accepted and v is not None}
        for name in self._method_options:
            if name not in accepted:
                chosen = (f"method='auto' chose {choice.method!r} ({choice.reason}), which" if self.method == "auto"
                          else f"Method {choice.method!r}")
                raise ValueError(f"{chosen} has no option {name!r}. Its options: {', '.join(sorted(accepted))}.")
            value = getattr(self, name)
            boolean = isinstance(option_default(cls, name), bool)
            if boolean and not isinstance(value, (bool, np.bool_)):
                raise ValueError(f"{name} must be True or False for method {choice.method!r}, got {value!r}.")
            options[name] = bool(value) if boolean else value
        for name in SIZES_CAPPED_BY_ROWS:  # at most one inducing point per row
            if name in accepted:
                options[name] = min(int(options.get(name, option_default(cls, name))), n)
        return {k: copy.deepcopy(v) if isinstance(v, torch.nn.Module) else v for k, v in options.items()}

    def refit_posterior(self, X, y, **posterior_options):
        """Refit the trained model's posterior on (X, y), the training rows in their original units, with new values
        of options that act only in the posterior fit (the model's ``posterior_options``: SoftKI's and DBK's
        ``calibrate_noise``, GP-GRIEF-I's MCMC settings), without training again; they become this estimator's
        parameters. All or nothing: on an error the estimator keeps its earlier posterior. Returns self."""
        check_is_fitted(self, "model_")
        if isinstance(X, Table):
            raise ValueError("refit_posterior takes the training rows as arrays (X, y); to fit from a Table again, "
                             "call fit.")
        allowed = type(self.model_).posterior_options
        unknown = sorted(set(posterior_options) - set(allowed))
        if unknown:
            raise ValueError(f"{', '.join(map(repr, unknown))} cannot change without training again: method "
                             f"{self.method_!r} refits its posterior with new values of "
                             f"{', '.join(map(repr, allowed)) or 'no option'} only.")
        X, targets = self._training_rows(X, y)
        # the entries a model forms again when they are missing (the exact GP's n x n factor) are not copied
        kept = {k: self.model_.cache.pop(k) for k in type(self.model_).rebuilt_cache if k in self.model_.cache}
        try:
            model = copy.deepcopy(self.model_)
        finally:
            self.model_.cache.update(kept)
        for name, value in posterior_options.items():
            setattr(model, name, value)
        model.check_posterior_options()
        dtype, device = self.dtype_, self.device_
        with torch.no_grad():
            model.fit_posterior(torch.tensor((X - self.x_mean_) / self.x_std_, dtype=dtype, device=device),
                                torch.tensor(targets, dtype=dtype, device=device), self._comm())
        self.set_params(**posterior_options)
        self.model_, self.model_options_ = model.eval(), {**self.model_options_, **posterior_options}
        return self

    def _training_rows(self, X, y) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - interface
        """(X, the model's targets) for rows the estimator was fitted on, checked as ``fit`` checks them."""
        raise NotImplementedError

    # --- what was fitted ---------------------------------------------------------------------------------
    @property
    def kernel_(self) -> Kernel:
        """The trained kernel (a copy of ``kernel`` when one was given), on standardised inputs and targets:
        :meth:`hyperparameters` gives its values in the units of X and y."""
        check_is_fitted(self, "model_")
        return self.model_.kernel

    def hyperparameters(self) -> dict:
        """The learned kernel and noise hyperparameters in the units of X and y: ``lengthscale`` (one per input
        column, in that column's units), ``outputscale`` and ``noise`` (variances, in units of y squared; the
        classifier's latent functions have no units, so its outputscale is the latent variance). A kernel without
        a lengthscale (a network's, an additive one) reports what it has, on standardised inputs."""
        check_is_fitted(self, "model_")
        y_var = getattr(self, "y_std_", 1.0) ** 2
        values: dict = {}
        kernel = self.model_.kernel
        if hasattr(kernel, "lengthscale"):
            lengthscale = kernel.lengthscale.detach().double().cpu().numpy().reshape(-1)
            if lengthscale.size in (1, self.n_features_in_):
                values["lengthscale"] = np.broadcast_to(lengthscale, self.n_features_in_) * self.x_std_
        if hasattr(kernel, "outputscale"):
            outputscale = kernel.outputscale.detach().double().cpu().numpy()
            values["outputscale"] = (float(outputscale) if outputscale.size == 1 else outputscale) * y_var
        likelihood = self.model_.likelihood
        if hasattr(likelihood, "noise"):
            values["noise"] = float(likelihood.noise.detach()) * y_var
        return values

    def summary(self, file=None) -> None:
        """Print the method (and why it was chosen), how training ended and its time, the final training objective,
        and the learned hyperparameters in the units of X and y (a loaded model prints what its file recorded)."""
        check_is_fitted(self, "model_")
        t = self.training_
        lines = [f"{type(self).__name__}: method {self.method_!r} ({self.method_reason_})"]
        if not t["trainable"]:
            lines.append(f"  training: none to do, inference in the posterior fit, {t['seconds']:.1f} s")
        else:
            how = "L-BFGS iterations" if t["optimizer"] == "lbfgs" else "Adam steps"
            if t["converged"] is None:
                ended = f"{t['epochs']} epochs"
            elif t["converged"]:
                ended = "converged (the objective stopped improving)"
            else:
                counted = "iterations or loss evaluations" if t["optimizer"] == "lbfgs" else "steps"
                ended = f"stopped at the cap of {t['max_steps']} {counted} before converging"
            lines.append(f"  training: {t['steps']} {how}, {ended}, {t['seconds']:.1f} s")
            lines.append(f"  final objective: {t['final_objective']:.6g} (per data point, standardised targets)")
        posterior = self.model_.posterior_description()
        if posterior:
            lines.append(f"  {posterior}")
        units = {"lengthscale": "units of X", "outputscale": "units of y^2", "noise": "variance, units of y^2"}
        for name, value in self.hyperparameters().items():
            shown = (np.array2string(np.asarray(value), precision=4, max_line_width=100) if np.ndim(value)
                     else f"{value:.6g}")
            lines.append(f"  {name} ({units[name] if self._task == 'regression' else 'latent'}): {shown}")
        print("\n".join(lines), file=file or sys.stdout)

    # --- prediction --------------------------------------------------------------------------------------
    def _inputs(self, X) -> torch.Tensor:
        """X after the checks every predict method makes, standardised, as a tensor (call without autograd) in host
        memory: the model copies it to its device chunk by chunk, asynchronously (:meth:`GPModel.predict`), so a
        GPU holds a chunk of the rows, not all of them."""
        check_is_fitted(self, "model_")
        X = validate_data(self, _as_numpy(X), reset=False, dtype=np.float64)
        X = torch.tensor((X - self.x_mean_) / self.x_std_, dtype=self.dtype_)
        self.model_.check_inputs(X)
        return X

    def _by_block(self, table: Table, predict):
        """``predict`` (returning an array or a tuple of arrays) of the table's rows a block at a time, joined: the
        columns the model was fitted on, by name where it was fitted on named columns (a table), else the
        table's features."""
        check_is_fitted(self, "model_")
        names = getattr(self, "feature_names_in_", None)
        parts = []
        with named_blocks():
            for X, _ in table.blocks(features=None if names is None else names.tolist(), target=False):
                parts.append(predict(X))
        if isinstance(parts[0], tuple):
            return tuple(np.concatenate(column) for column in zip(*parts))
        return np.concatenate(parts)

    def _latent(self, X) -> tuple[torch.Tensor, torch.Tensor]:
        """The latent predictive (mean, variance) at X."""
        X = self._inputs(X)  # first: it checks that the model is fitted
        return self.model_.predict(X)

    def _latent_mixture(self, X) -> tuple[torch.Tensor, torch.Tensor]:
        """The latent predictive at X as an equal-weight mixture: means and variances [S, n*] (or [S, n*, C]); S = 1
        except for a model with a sampled predictive (:meth:`~gpscale.models.base.GPModel.predict_mixture`)."""
        X = self._inputs(X)
        return self.model_.predict_mixture(X)

    # --- persistence -------------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike, metadata: dict | None = None) -> None:
        """Write the fitted model to one file (atomically); :meth:`load` reads it back.

        ``metadata`` (JSON-serialisable, e.g. feature names) is stored alongside and restored as ``metadata_``.
        A kernel object is stored as its constructor's name and arguments plus its tensors (never as a pickle):
        gpscale's kernels and kernels registered with :func:`gpscale.kernels.register_kernel` can be saved; any
        other object is refused with a message saying how to register it.
        """
        check_is_fitted(self, "model_")
        if getattr(self, "rank_", 0) != 0:  # data-parallel: every rank holds the same model; rank 0 writes it
            return
        # the model's own dtype and device, whatever set_params has changed since the fit
        params = {**self.get_params(), "dtype": _saved_dtype(self.dtype, self.method_, self.dtype_),
                  "device": str(self.device_)}
        header = {
            "kind": type(self).__name__,
            "gpscale_version": __version__,
            "torch_version": torch.__version__,
            "params": _jsonable(params),
            "model_options": _jsonable(self.model_options_),
            "method": self.method_,
            "method_reason": self.method_reason_,
            "training": self.training_,
            "n_features_in": int(self.n_features_in_),
            "feature_names": getattr(self, "feature_names_in_", np.empty(0)).tolist() or None,
            **self._header(),
            "dtype": _dtype_name(self.dtype_),
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
            params = _unjsonable(dict(header["params"]))
            if device is not None:
                params["device"] = device
            est = cls(**params)
            method = header["method"]
            model_cls = get_model_class(method)
            model = model_cls(header["n_features_in"], **_unjsonable(header["model_options"]))
            # cast before loading: load_state_dict copies into the parameters' current dtype
            dtype = resolve_dtype(header["dtype"])  # the fitted dtype (what "auto" resolved to)
            model.to(dtype=dtype, device=torch.device(est.device))
            model.load_state_dict(tensors["model"])
            device = est.device_ = torch.device(est.device)  # a list: per-device factors (HVGP's placed blocks)
            est.dtype_ = dtype
            model.cache = {k: [t.to(device) for t in v] if isinstance(v, list) else v.to(device)
                           for k, v in model.cache.items()}
            est.model_ = model.eval()
            est.method_ = method
            est.method_reason_ = header["method_reason"]
            est.training_ = header["training"]
            est.model_options_ = _unjsonable(header["model_options"])
            est.n_features_in_ = header["n_features_in"]
            if header["feature_names"]:
                est.feature_names_in_ = np.asarray(header["feature_names"], dtype=object)
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


class GPRegressor(RegressorMixin, _GPEstimator):
    """Gaussian-process regression with any gpscale method.

    X is standardised per column and y to zero mean and unit variance with training statistics, which are
    stored with the model; predictions come back in the original units. With no arguments it picks a method for
    the data (``method="auto"``), trains it until its objective stops improving and predicts with calibrated
    intervals.

    ``fit`` checks every option before it touches the data: numeric ones against :data:`gpscale.options.CONSTRAINTS`
    (the range of each, listed in docs/options.md), the others by name. A fit that fails or is interrupted leaves
    the estimator as it was (fitted earlier or not), and its error carries a note saying so.

    Parameters
    ----------
    method : str, default="auto"
        A method key (``gpscale.available_methods()``: ``"exact"``, ``"sgpr"``, ``"svgp"``, ``"softki"``,
        ``"grief"``, ``"grief-i"``, ``"dbk"``, ``"svdbk"``, ``"hvgp"``, ``"vff"``, ``"vff-svgp"``, ``"odvgp"``,
        ``"odvff"``, and for images ``"conv-svgp"``, ``"conv-hvgp"``, ``"deep-conv-hvgp"``), or ``"auto"``: the
        exact GP over every row while its Cholesky factor (8 n^2 bytes, n^3 / 3 operations) fits the device's free
        memory and a budget of work (about 46,000 rows on a 24 GB machine), by the iterative solver on a GPU
        beyond, then SGPR (512 inducing points, full batch) while a pass over the data costs at most that of
        50,000 rows of 20 features, SVGP beyond (:func:`gpscale.defaults.choose_method`). ``method_`` says what was
        fitted and ``summary()`` why.
    n_inducing : int or None, default=None
        Inducing points (or basis functions) for methods that have them, capped at n. None: the method's default.
    epochs : int or None, default=None
        None: train until the objective has converged (the plateau rule of :mod:`gpscale.defaults`), with
        L-BFGS for full-batch methods and Adam with a step-down schedule for minibatch methods. An int: that many
        passes over the data with Adam (one step per pass for full-batch methods).
    max_steps : int or None, default=None
        The cap of training to convergence, in optimiser steps. None: the method's (``gpscale.defaults.TRAINING``:
        1,000 L-BFGS iterations or 5,000 Adam steps, fewer where a step is dear; SGPR's by a budget of work,
        :func:`gpscale.defaults.sgpr_max_steps`).
    batch_size, lr : int or None, float or None, default=None
        Minibatch size (minibatch methods) and Adam's learning rate. None: the method's defaults.
    optimizer : {None, "adam", "lbfgs"}, default=None
        None: L-BFGS for full-batch methods trained to convergence, Adam otherwise. "lbfgs": scipy's L-BFGS-B
        on the full-batch loss (full-batch methods only; no ``lr``, no validation), see :func:`gpscale.train.fit`.
    kernel : str, Kernel or None, default=None
        None: the method's default ("rbf", except "matern32" for the Fourier-feature methods, which need a Matérn).
        A name (``"rbf"``, ``"matern12"``, ``"matern32"``, ``"matern52"``, or one registered with
        :func:`gpscale.kernels.register_kernel`) or a :class:`~gpscale.kernels.Kernel` object, which ``fit``
        copies: the trained one is ``kernel_``.
    noise : float or None, default=None
        Initial noise variance of standardised y (fixed if ``learn_noise=False``). None: the method's default.
    learn_noise : bool or None, default=None
        None: the method's default (learned, except for SoftKI, whose intervals are calibrated after training).
    x_scaling : {"standard", "minmax", "center", "none"}, default="standard"
        How X is scaled before the method sees it, with the training rows' statistics (:mod:`gpscale.scaling`):
        z-scores, the training rows mapped onto [-1, 1] (the DBK and ODVFF papers' protocols), the column means
        subtracted (images for the convolutional methods: pixels keep their common scale, which z-scores would
        break where a border pixel barely varies), or as given.
        ``x_mean_`` and ``x_std_`` hold the shift and scale of each column.
    normalize_y : bool, default=True
        Standardise y with its training mean and standard deviation (the methods' default hyperparameters assume
        unit-scale targets); False keeps y as given, for targets on a known scale.
    val_fraction : float, default=0.0
        Hold out this fraction to watch the validation NLPD: training then stops when it stops improving, and
        keeps the best parameters (0: no validation).
    patience : int or None, default=None
        With validation and a fixed ``epochs``: epochs without a better validation NLPD before training stops
        (None: 10); training to convergence: windows without improvement before the learning rate steps down.
    val_every : int, default=1
        With validation and a fixed ``epochs``: score the validation rows every this many epochs.
    seed : int, default=0
    dtype : {"auto", "float64", "float32"} or a torch or numpy float dtype, default="auto"
        The dtype of the data-sized work; every m x m (or p x p) core and every solve runs in float64 whatever
        it is. "auto": float32 for the methods where it measured faster at the same accuracy (svgp, softki, hvgp,
        odvgp, odvff, svdbk, dbk and the convolutional models: :data:`gpscale.defaults.FLOAT32_METHODS`), float64
        for the others; ``dtype_`` says which a fit used.
    device : str, default="cpu"
        Checked before any work: a CUDA device on a machine without one is an error.
    progress : bool, default=True
        A progress bar while training (in a terminal; written to a file, a line a minute at most).
    distributed : bool, default=False
        Data-parallel training under torchrun (:mod:`gpscale.distributed`): every process calls ``fit`` with its
        own shard of the rows; the scaling statistics and n are global, and the fitted model equals the
        one-process fit on all rows (see :func:`gpscale.train.fit` for what is supported). :meth:`save` writes
        on rank 0 only.
    checkpoint : str, path or None, default=None
        A file the training state is written to (atomically) after every epoch; its folder is checked before any
        work. With ``resume=True`` a fit continues from it when it exists, to the model an uninterrupted fit
        gives. A checkpoint makes a full-batch method train with Adam, since L-BFGS keeps no state to resume.
    resume : bool, default=False
        Continue from ``checkpoint`` if it exists (else start afresh).
    **method_options
        Passed to the method (e.g. ``jitter``, ``solver``, ``learn_inducing``, ``ard``, ``chunk_size``,
        ``calibrate_noise``); an option the fitted method does not take is an error at ``fit``.

    Attributes
    ----------
    method_ : str, the method fitted; method_reason_ : str, why.
    model_ : GPModel, the trained model; kernel_ : its kernel.
    n_features_in_ : int
    x_mean_, x_std_ : ndarray (d,), y_mean_, y_std_ : float, training statistics.
    dtype_, device_ : torch.dtype and torch.device the model holds; prediction uses them, whatever ``dtype`` and
        ``device`` are set to after the fit (they take effect at the next fit).
    training_seconds_ : float, wall time of training (initialisation and posterior included).
    training_ : dict, how training ran and ended (optimiser, steps, converged, final objective, seconds); saved.
    fit_result_ : gpscale.train.FitResult (loss history, steps, whether it converged, timing); not saved.
    """

    _task = "regression"
    # predict's keywords choose what it returns; they are not per-row metadata, so scikit-learn's metadata routing
    # has nothing to route for them (and generates no set_predict_request)
    __metadata_request__predict = {"return_std": UNUSED, "return_cov": UNUSED, "latent": UNUSED}

    def __init__(self, method="auto", n_inducing=None, epochs=None, max_steps=None, batch_size=None, lr=None,
                 optimizer=None, kernel=None, noise=None, learn_noise=None, x_scaling="standard", normalize_y=True,
                 val_fraction=0.0, patience=None, val_every=1, seed=0, dtype="auto", device="cpu", progress=True,
                 distributed=False, checkpoint=None, resume=False, **method_options):
        self.optimizer = optimizer
        self.noise = noise
        self.learn_noise = learn_noise
        self.normalize_y = normalize_y
        super().__init__(method, n_inducing, epochs, max_steps, batch_size, lr, kernel, x_scaling, val_fraction,
                         patience, val_every, seed, dtype, device, progress, distributed, checkpoint, resume,
                         method_options)

    @_all_or_nothing
    def fit(self, X, y=None):
        """Scale, train and fit the posterior. X: (n, d), y: (n,); or X a :class:`~gpscale.sources.Table` whose
        target column gives y (y left None), read a block at a time. Returns self."""
        self._check_settings()
        if not isinstance(self.normalize_y, (bool, np.bool_)):
            raise ValueError(f"normalize_y must be True or False, got {self.normalize_y!r}.")
        comm = self._comm()
        y_how = "standard" if self.normalize_y else "none"
        if isinstance(X, Table):
            scan = self._scan(X, y, comm, labels=False)
            y_scale = scan.y_moments.scaling(y_how, comm)
            first_y = scan.y_sample[0] if len(scan.y_sample) else 0.0
            rows = StagedRows(scan, y_scale.apply, robust_centre_and_spread(scan.y_sample),
                              row_offset(scan.n, comm))
        else:
            _check_global_rows(X, comm)
            X, y = agree(comm, lambda: validate_data(self, _as_numpy(X), _numeric_targets(_as_numpy(y)),
                                                     y_numeric=True, ensure_min_samples=_min_rows(comm),
                                                     dtype=(np.float64, np.float32)))
            warn_outlying_targets(y, comm)
            y_scale, first_y = fit_scaling(y, y_how, comm), y[0]
            rows = ArrayRows(X, y_scale.apply(y))
        if y_scale.constant:
            raise ValueError(f"y is constant (every value is {first_y!r}): there is nothing for a GP to fit. Check "
                             "the target column.")
        self._train(rows, comm, {"kernel": self.kernel, "noise": self.noise, "learn_noise": self.learn_noise},
                    {"y_mean_": float(y_scale.shift), "y_std_": float(y_scale.scale)}, optimizer=self.optimizer)
        return self

    def _training_rows(self, X, y) -> tuple[np.ndarray, np.ndarray]:
        X, y = validate_data(self, _as_numpy(X), _as_numpy(y), y_numeric=True, reset=False, dtype=np.float64)
        return X, (y - self.y_mean_) / self.y_std_

    @torch.no_grad()
    def predict(self, X, return_std=False, return_cov=False, latent=False):
        """The predictive mean (n*,) of y; with ``return_std=True`` also its standard deviation (n*,), with
        ``return_cov=True`` its covariance (n*, n*) (refused, with InsufficientMemoryError, where it would not fit in
        memory), both noise included unless ``latent=True``, which gives the moments of the noise-free function f
        instead."""
        if return_std and return_cov:
            raise ValueError("Ask for return_std or return_cov, not both: the std is the root of cov's diagonal.")
        if isinstance(X, Table):
            if return_cov:
                raise ValueError("return_cov=True forms the covariance of all the rows at once: pass them as an "
                                 "array, or ask a Table for return_std=True.")
            return self._by_block(X, functools.partial(self.predict, return_std=return_std, latent=latent))
        if return_cov:
            mean, cov = self._joint(X, latent)
            return mean * self.y_std_ + self.y_mean_, cov * self.y_std_**2
        if latent:
            mean, var = self._latent(X)
        else:  # the moments of the mixture of the components' predictives of y
            means_f, variances_f = self._latent_mixture(X)  # first: it checks that the model is fitted
            mean, var = mixture_moments(*self.model_.likelihood.predictive(means_f, variances_f))
        mean = mean.double().cpu().numpy() * self.y_std_ + self.y_mean_
        if not return_std:
            return mean
        return mean, np.sqrt(var.double().cpu().numpy()) * self.y_std_

    def score(self, X, y, sample_weight=None):
        """R² of ``predict(X)`` against y, scikit-learn's score for regressors (model selection and ``cross_val_score``
        use it). It sees only the mean: for the intervals, score with ``gpscale.metrics`` (``nlpd``, ``coverage``)."""
        return super().score(X, y, sample_weight=sample_weight)

    @torch.no_grad()
    def sample_y(self, X, n_samples=1, random_state=0, latent=False):
        """Draws (n*, n_samples) from the joint predictive of y at the rows of X (of f with ``latent=True``), as
        scikit-learn's ``GaussianProcessRegressor.sample_y``. ``random_state``: an int, a numpy Generator or
        RandomState, or None."""
        if not (isinstance(n_samples, (int, np.integer)) and n_samples >= 1):
            raise ValueError(f"n_samples must be a positive integer, got {n_samples!r}.")
        mean, cov = self._joint(X, latent)
        L = cholesky(torch.from_numpy(cov), what="predictive covariance").numpy()
        rng = random_state if isinstance(random_state, (np.random.Generator, np.random.RandomState)) else \
            np.random.default_rng(random_state)
        draws = mean[:, None] + L @ rng.standard_normal((len(mean), int(n_samples)))
        return draws * self.y_std_ + self.y_mean_

    def _joint(self, X, latent: bool) -> tuple[np.ndarray, np.ndarray]:
        """The joint predictive (mean, covariance) of standardised f, or of y unless ``latent``, as float64 numpy."""
        check_is_fitted(self, "model_")
        rows = len(X)
        check_tensors_fit((rows, rows), torch.float64, copies=JOINT_HOST_MATRICES,
                          what=f"The joint predictive covariance of {rows:,} rows in host memory",
                          advice="Ask for return_std=True (marginal variances, any number of rows, formed in chunks), "
                                 "or pass the rows in blocks.")
        X = self._inputs(X)
        mean, cov = self.model_.predict_cov(X)
        mean, cov = mean.double().cpu().numpy(), cov.double().cpu().numpy()
        if not latent:
            cov[np.diag_indices(len(mean))] += float(self.model_.likelihood.noise)
        return mean, cov

    def _header(self) -> dict:
        return {"scaling": {"y_mean": self.y_mean_, "y_std": self.y_std_}}

    def _restore_header(self, header: dict) -> None:
        self.y_mean_, self.y_std_ = header["scaling"]["y_mean"], header["scaling"]["y_std"]


class GPClassifier(ClassifierMixin, _GPEstimator):
    """Gaussian-process classification with a variational gpscale method.

    Two classes use the probit (Bernoulli) likelihood, more the robust-max one (or ``likelihood="softmax"``),
    each through the method's expected log-likelihood. Labels may be any values that ``numpy.unique`` sorts
    (strings or numbers, also under ``distributed=True``); X is standardised per column with training statistics.

    Parameters
    ----------
    method : str, default="auto"
        A method whose objective takes a non-Gaussian likelihood: ``"svgp"``, ``"hvgp"``, ``"odvgp"``,
        ``"odvff"``, ``"vff-svgp"``, ``"svdbk"``, and for images ``"conv-svgp"``, ``"conv-hvgp"``,
        ``"deep-conv-hvgp"`` (with ``image_shape``); the others say so. ``"auto"``: ``"svgp"``.
    likelihood : {None, "bernoulli", "robustmax", "softmax"}, default=None
        None: "bernoulli" for two classes, "robustmax" for more.
    n_inducing, epochs, max_steps, batch_size, lr, kernel, x_scaling, val_fraction, patience, val_every, seed, dtype,
    device, progress, distributed, checkpoint, resume, **method_options : as for :class:`GPRegressor` (validation
        scores the NLPD of the held-out labels).

    Attributes
    ----------
    classes_ : ndarray (C,), the labels, sorted; ``predict_proba``'s columns follow them.
    method_, method_reason_, model_, kernel_, n_features_in_, x_mean_, x_std_, dtype_, device_, training_seconds_,
        fit_result_ : as for :class:`GPRegressor`.
    """

    _task = "classification"

    def __init__(self, method="auto", n_inducing=None, epochs=None, max_steps=None, batch_size=None, lr=None,
                 kernel=None, likelihood=None, x_scaling="standard", val_fraction=0.0, patience=None, val_every=1,
                 seed=0, dtype="auto", device="cpu", progress=True, distributed=False, checkpoint=None,
                 resume=False, **method_options):
        self.likelihood = likelihood
        super().__init__(method, n_inducing, epochs, max_steps, batch_size, lr, kernel, x_scaling, val_fraction,
                         patience, val_every, seed, dtype, device, progress, distributed, checkpoint, resume,
                         method_options)

    @_all_or_nothing
    def fit(self, X, y=None):
        """Train on X (n, d) and labels y (n,); or X a :class:`~gpscale.sources.Table` whose target column holds the
        labels (y left None), read a block at a time. Returns self."""
        self._check_settings()
        comm = self._comm()
        if isinstance(X, Table):
            scan = self._scan(X, y, comm, labels=True)
            classes = _global_classes(np.asarray(sorted(scan.classes)), comm)
        else:
            def validated():
                _check_labels(_as_numpy(y))
                checked = validate_data(self, _as_numpy(X), _as_numpy(y), ensure_min_samples=_min_rows(comm),
                                        dtype=(np.float64, np.float32))
                check_classification_targets(checked[1])
                return checked

            _check_global_rows(X, comm)
            X, y = agree(comm, validated)
            classes = _global_classes(y, comm)
        C = len(classes)
        if C < 2:
            raise ValueError(f"y holds one class only ({np.asarray(classes[0]).item()!r}): a classifier needs at "
                             "least two.")
        likelihood = self.likelihood or ("bernoulli" if C == 2 else "robustmax")
        if likelihood == "bernoulli" and C > 2:
            raise ValueError(f"likelihood='bernoulli' is for two classes, but y has {C}; use 'robustmax' or "
                             "'softmax' (or leave likelihood=None).")
        if likelihood not in ("bernoulli", "robustmax", "softmax"):
            raise ValueError(f"likelihood must be None, 'bernoulli', 'robustmax' or 'softmax', got {likelihood!r}.")
        targets = functools.partial(_class_targets, classes=classes, likelihood=likelihood)
        rows = StagedRows(scan, targets) if isinstance(X, Table) else ArrayRows(X, targets(y))
        self._train(rows, comm, {"kernel": self.kernel, "likelihood": likelihood,
                                 "n_classes": None if likelihood == "bernoulli" else C}, {"classes_": classes})
        return self

    def _training_rows(self, X, y) -> tuple[np.ndarray, np.ndarray]:
        X, y = validate_data(self, _as_numpy(X), _as_numpy(y), reset=False, dtype=np.float64)
        unseen = sorted(set(np.unique(y).tolist()) - set(self.classes_.tolist()))
        if unseen:
            raise ValueError(f"y holds labels the classifier was not fitted on: {unseen[:5]}.")
        likelihood = "bernoulli" if self.model_options_.get("n_classes") is None else "multiclass"
        return X, _class_targets(y, self.classes_, likelihood)

    @torch.no_grad()
    def predict_proba(self, X):
        """Predictive class probabilities (n*, C), columns in the order of ``classes_``."""
        if isinstance(X, Table):
            return self._by_block(X, self.predict_proba)
        means_f, variances_f = self._latent_mixture(X)  # the mean of the components' probabilities
        S = means_f.shape[0]  # the likelihood takes rows [S n*(, C)]
        p = self.model_.likelihood.probability(means_f.flatten(0, 1), variances_f.flatten(0, 1))
        p = p.reshape(S, -1, *p.shape[1:]).mean(0).double().cpu().numpy()
        return np.stack([1 - p, p], axis=1) if p.ndim == 1 else p

    def predict(self, X):
        """The most probable class (n*,) of each row."""
        most_probable = self.predict_proba(X).argmax(axis=1)  # first: it checks that the model is fitted
        return self.classes_[most_probable]

    def score(self, X, y, sample_weight=None):
        """Accuracy of ``predict(X)`` against y, scikit-learn's score for classifiers. It sees only the most probable
        class: for the probabilities, score ``predict_proba`` (e.g. with ``sklearn.metrics.log_loss``)."""
        return super().score(X, y, sample_weight=sample_weight)

    def _header(self) -> dict:
        return {"classes": self.classes_.tolist()}

    def _restore_header(self, header: dict) -> None:
        self.classes_ = np.asarray(header["classes"])


@contextlib.contextmanager
def named_blocks():
    """Where the rows given to ``predict`` are blocks of a table's columns matched to the fitted features by name
    (arrays, which scikit-learn would warn carry no names)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="X does not have valid feature names")
        yield


def load(path: str | os.PathLike, device: str | None = None) -> GPRegressor | GPClassifier:
    """Load a model saved by :meth:`GPRegressor.save` or :meth:`GPClassifier.save`."""
    header, tensors = read_model_file(path)
    kinds = {klass.__name__: klass for klass in (GPRegressor, GPClassifier)}
    if header.get("kind") not in kinds:
        raise ModelFileError(f"{path} holds a {header.get('kind')!r}, not a GPRegressor or a GPClassifier.")
    return kinds[header["kind"]]._restore(path, header, tensors, device)


# --- settings ---------------------------------------------------------------------------------------------------
def resolve_dtype(dtype, method: str | None = None) -> torch.dtype:
    """``"float32"`` / ``"float64"``, or the torch or numpy dtype of either, as a torch dtype; ``"auto"``: the
    method's default (:func:`gpscale.defaults.default_dtype`)."""
    if isinstance(dtype, str) and dtype == "auto" and method is not None:
        dtype = default_dtype(method)
    if isinstance(dtype, torch.dtype):
        name = _dtype_name(dtype) if dtype in _DTYPES.values() else None
    else:
        try:
            name = np.dtype(dtype).name if dtype is not None else None
        except TypeError:
            name = None
    if name not in _DTYPES:
        raise ValueError(f"dtype must be 'auto', 'float64' or 'float32' (or the torch or numpy dtype of either), "
                         f"got {dtype!r}.")
    return _DTYPES[name]


def _saved_dtype(given, method: str, fitted: torch.dtype) -> str:
    """The ``dtype`` parameter a model file records: the one given (``"auto"`` or a name) when it still resolves to
    the fitted dtype, so that a loaded estimator's ``get_params`` are the fitted one's; else (changed by
    ``set_params`` since the fit) the fitted dtype's name."""
    try:
        name = "auto" if isinstance(given, str) and given == "auto" else _dtype_name(resolve_dtype(given))
        return name if resolve_dtype(name, method) == fitted else _dtype_name(fitted)
    except ValueError:
        return _dtype_name(fitted)


def _dtype_name(dtype: torch.dtype) -> str:
    return {v: k for k, v in _DTYPES.items()}[dtype]


def check_device(device) -> torch.device:
    """``device`` as a torch device, checked to exist on this machine before any work is done on it."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device={device!r} is not a device name torch knows ({err}); use 'cpu', 'cuda' or "
                         "'cuda:N'.") from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r}, but this machine has no CUDA device that torch "
                             f"{torch.__version__} can use (torch.cuda.is_available() is False): use device='cpu', "
                             "or install a CUDA build of torch on a machine with an NVIDIA GPU.")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ValueError(f"device={device!r}, but this machine has {torch.cuda.device_count()} CUDA device(s) "
                             f"(cuda:0 .. cuda:{torch.cuda.device_count() - 1}).")
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device={device!r}, but MPS is not available on this machine: use device='cpu'.")
    elif parsed.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device={device!r}: gpscale runs on 'cpu', 'cuda' or 'mps'.")
    return parsed


# --- helpers ----------------------------------------------------------------------------------------------------
def _global_classes(y: np.ndarray, comm: Comm) -> np.ndarray:
    """The sorted labels of every process's y."""
    classes = np.unique(y)
    if comm.world_size == 1:
        return classes
    if np.issubdtype(classes.dtype, np.number):
        return np.unique(comm.all_gather(torch.as_tensor(classes, dtype=torch.float64)).numpy()).astype(classes.dtype)
    # labels of any other kind travel as one line of JSON per process
    line = torch.tensor(list(json.dumps([str(c) for c in classes]).encode("utf-8") + b"\n"), dtype=torch.uint8)
    lines = bytes(comm.all_gather(line).tolist()).decode("utf-8").splitlines()
    return np.unique(np.asarray([label for text in lines for label in json.loads(text)]))


def _given_hyperparameters(options: dict) -> str:
    """The initial hyperparameter values the caller gave (not left to start from the data), as one phrase."""
    given = [f"{name}={options[name]:.3g}" for name in ("lengthscale", "outputscale", "noise")
             if isinstance(options.get(name), (int, float))]
    if options.get("learn_noise") is False:
        given.append("learn_noise=False")
    return ", ".join(given)


def _checkpoint_settings(options: dict, x_scale, fitted: dict) -> dict[str, str]:
    """What a training checkpoint records of a fit beyond the data the model sees (:mod:`gpscale.checkpoint`): the
    model's options, and the scaling of X and of the targets to 6 digits (shifted data standardise to the same
    rows: their scaling tells them apart)."""
    def digits(value) -> str:
        values = np.asarray(value)
        if values.dtype.kind not in "fiu":
            return repr(values.tolist())
        return " ".join(f"{v:.6g}" for v in np.atleast_1d(values.astype(np.float64)))

    scaling = {"x_shift": x_scale.shift, "x_scale": x_scale.scale, **fitted}
    return {**{name: repr(value) for name, value in options.items()},
            **{name: digits(value) for name, value in scaling.items()}}


def _min_rows(comm: Comm) -> int:
    """The rows each process's part of X must have: 2 in one process; 1 under data parallelism, where
    :func:`_check_global_rows` counts them all."""
    return 2 if comm.world_size == 1 else 1


def _check_global_rows(rows, comm: Comm) -> None:
    """Under data parallelism: at least 2 rows over the processes' parts (this one's: ``rows``, an array or their
    number), and at least 1 in each (the same error on every process)."""
    if comm.world_size == 1:
        return
    counts = comm.all_gather(torch.tensor([rows if isinstance(rows, int) else len(rows)])).tolist()
    if sum(counts) < 2 or min(counts) < 1:
        rows = f"{sum(counts):,} row{'s' if sum(counts) != 1 else ''}"
        raise ValueError(f"The data have {rows}, parted {counts} over {comm.world_size} processes: "
                         "a data-parallel fit needs at least 2 rows in all and 1 on each process. Fit in one "
                         "process, or with fewer processes.")


def _numeric_targets(y):
    """y as numbers: numeric strings are converted; any other text is refused, naming the first such value."""
    if y is None or np.asarray(y).dtype.kind not in "USO":
        return y
    y = np.asarray(y)
    for row, value in enumerate(y.ravel().tolist()):
        try:
            float(value)
        except (TypeError, ValueError):
            raise ValueError(f"y must be numbers for a regressor, but row {row} holds {value!r}; use GPClassifier "
                             "(gpscale fit --classify) for class labels.") from None
    return y.astype(np.float64)


def _check_labels(y) -> None:
    """Refuse a missing label (None or NaN), which no class can stand for."""
    if y is None:  # no labels at all: validate_data says so in scikit-learn's words
        return
    values = np.asarray(y).ravel().tolist()
    missing = np.asarray([v is None or (isinstance(v, float) and math.isnan(v)) for v in values])
    if missing.any():
        raise ValueError(f"y holds {int(missing.sum())} missing label(s) (None or NaN), the first at row "
                         f"{int(missing.argmax())}: drop those rows or give them a class.")


def _class_targets(y: np.ndarray, classes: np.ndarray, likelihood: str) -> np.ndarray:
    """The model's targets for labels y: class indices into ``classes``, or -1 / +1 for probit's two classes."""
    codes = np.searchsorted(classes, y).astype(np.float64)
    return 2 * codes - 1 if likelihood == "bernoulli" else codes


def _as_numpy(a):
    """Torch tensors (on any device, with or without grad) become numpy; everything else passes through."""
    if isinstance(a, torch.Tensor):
        return a.detach().cpu().numpy()
    return a


def _all_method_options() -> set[str]:
    """Every option of every registered method."""
    return set().union(*(option_names(get_model_class(key)) for key in available_methods()))


def boolean_options() -> set[str]:
    """The options that every registered method declaring them declares with a True or False default."""
    kinds: dict[str, set[bool]] = {}
    for key in available_methods():
        cls = get_model_class(key)
        for name in option_names(cls):
            kinds.setdefault(name, set()).add(isinstance(option_default(cls, name), bool))
    return {name for name, boolean in kinds.items() if boolean == {True}}


_SCALARS = (str, int, float, bool, type(None))


def _jsonable(params: dict) -> dict:
    """The options as JSON values: lists of scalars stay lists, tuples of scalars (e.g. ``init_stretch``) become
    ``{"tuple": [...]}`` so that they come back as tuples, a kernel object its constructor spec
    (:func:`gpscale.kernels.kernel_spec`)."""
    def scalar_sequence(v):  # nested: a deep model's filter sizes are a sequence of (height, width) pairs
        return isinstance(v, (list, tuple)) and all(isinstance(x, _SCALARS) or scalar_sequence(x) for x in v)

    def encode(v):
        if isinstance(v, tuple):
            return {"tuple": [encode(x) for x in v]}
        return [encode(x) for x in v] if isinstance(v, list) else v

    out = {}
    for name, value in params.items():
        if isinstance(value, Kernel):
            out[name] = {"kernel_spec": kernel_spec(value)}
        elif isinstance(value, _SCALARS) or scalar_sequence(value):
            out[name] = encode(value)
        elif isinstance(value, os.PathLike):  # a checkpoint's path
            out[name] = os.fspath(value)
        else:
            raise ValueError(f"Cannot save option {name}={value!r}: a model file holds str/int/float/bool/None "
                             "options, lists of them and gpscale kernels, never pickled objects. Pass the option "
                             "by name (e.g. network='resnet', group='pca_negation'), or for a kernel register its "
                             "constructor with gpscale.kernels.register_kernel and pass kernel='<its name>'.")
    return out


def _unjsonable(params: dict) -> dict:
    """:func:`_jsonable` undone: kernel specs become kernel objects again, tuples tuples."""
    def restore(value):
        if isinstance(value, dict) and "kernel_spec" in value:
            return kernel_from_spec(value["kernel_spec"])
        if isinstance(value, dict) and set(value) == {"tuple"}:
            return tuple(restore(v) for v in value["tuple"])
        return [restore(v) for v in value] if isinstance(value, list) else value

    return {name: restore(value) for name, value in params.items()}

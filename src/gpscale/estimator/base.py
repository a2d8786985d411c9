"""What the regressor and the classifier share: the scikit-learn parameters (the method's options among them), the
choice and the construction of the method, training on scaled rows, and the latent predictive."""
from __future__ import annotations

import copy
import functools
import sys
import time
from dataclasses import replace

import numpy as np
import torch
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted, validate_data

from ..distributed import LOCAL, Comm, TorchComm, agree, global_count
from ..kernels import Kernel
from ..linalg import NotPSDError
from ..memory import per_process_bytes
from ..models import available_methods, get_model_class
from ..models.auto import Choice, choose_method
from ..models.base import GPModel, option_default, option_names
from ..options import check_options, check_renamed
from ..scaling import SCALINGS
from ..sources import ArrayRows, StagedRows, Table, TableScan
from ..train import TrainingError, fit
from ..train.validation import (fit_posterior_after_held_out, held_out_fraction, rows_trained_on,
                                validation_split)
from .persistence import SavedEstimator
from .rows import as_numpy, check_global_rows, named_blocks
from .settings import (all_method_options, boolean_options, check_device, checkpoint_settings,
                       given_hyperparameters, resolve_dtype)

__all__ = ["GPEstimator", "all_or_nothing"]


def all_or_nothing(fit_method):
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


class GPEstimator(SavedEstimator, BaseEstimator):
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
        unknown = sorted(set(options) - set(self._method_options) - all_method_options())
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
            choice = Choice(self.method, "named by the caller")
        cls = get_model_class(choice.method)
        dtype = resolve_dtype(self.dtype, choice.method)
        options = self._model_options(cls, n, common, choice)
        # the method's cap where it depends on the data's size (a budget of work), else its own
        choice = replace(choice, max_steps=cls.default_max_steps(n, d, options))
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
                         checkpoint_settings=checkpoint_settings(options, x_scale, fitted),
                         mapped=mapped, **training)
        except (NotPSDError, TrainingError) as error:
            given = given_hyperparameters(options)
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
        check_global_rows(scan.n, comm)
        if comm.world_size == 1 and scan.n < 2:
            raise ValueError(f"{table.path} has {scan.n} data row; a fit needs at least 2.")
        self.n_features_in_, self.feature_names_in_ = scan.d, np.asarray(table.features, dtype=object)
        return scan

    def _model_options(self, cls: type[GPModel], n: int, common: dict, choice: Choice) -> dict:
        """Keyword options for ``cls``: the common ones it accepts, plus every method option (checked); sizes
        capped at the number of rows training sees. Objects (a kernel) are copied, so that fit never changes what
        it was given."""
        accepted = option_names(cls)
        options = {k: v for k, v in {"n_inducing": self.n_inducing, **common}.items()
                   if k in accepted and v is not None}
        for name in self._method_options:
            if name not in accepted:
                check_renamed(choice.method, cls.renamed_options, [name])
                chosen = (f"method='auto' chose {choice.method!r} ({choice.reason}), which" if self.method == "auto"
                          else f"Method {choice.method!r}")
                raise ValueError(f"{chosen} has no option {name!r}. Its options: {', '.join(sorted(accepted))}.")
            value, default = getattr(self, name), option_default(cls, name)
            boolean = isinstance(default, bool) or (default is None and name in boolean_options())
            if boolean and not isinstance(value, (bool, np.bool_)) and not (value is None and default is None):
                either = "True, False or None (the method's choice)" if default is None else "True or False"
                raise ValueError(f"{name} must be {either} for method {choice.method!r}, got {value!r}.")
            options[name] = bool(value) if boolean and value is not None else value
        trained_on = rows_trained_on(n, held_out_fraction(cls, options, self.val_fraction, self.epochs, n))
        for name in cls.sizes_capped_by_rows:  # at most one inducing point per row trained on
            if name in accepted:
                options[name] = min(int(options.get(name, option_default(cls, name))), trained_on)
        return {k: copy.deepcopy(v) if isinstance(v, torch.nn.Module) else v for k, v in options.items()}

    def refit_posterior(self, X, y, **posterior_options):
        """Refit the trained model's posterior on (X, y), the training rows in their original units, with new values
        of options that act only in the posterior fit (the model's ``posterior_options``: SoftKI's and DBK's
        ``calibrate_noise``, GP-GRIEF-I's MCMC settings), without training again; they become this estimator's
        parameters. Where the fit held rows out (``val_fraction``), the same rows, drawn again from ``seed``, serve
        the new options as they served the fit's, so X and y must be the rows fit saw, in the same order. All or
        nothing: on an error the estimator keeps its earlier posterior. Returns self."""
        check_is_fitted(self, "model_")
        if isinstance(X, Table):
            raise ValueError("refit_posterior takes the training rows as arrays (X, y); to fit from a Table again, "
                             "call fit.")
        allowed = type(self.model_).posterior_options
        unknown = sorted(set(posterior_options) - set(allowed))
        check_renamed(self.method_, type(self.model_).renamed_options, unknown)
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
        X = torch.tensor((X - self.x_mean_) / self.x_std_, dtype=self.dtype_, device=self.device_)
        y = torch.tensor(targets, dtype=self.dtype_, device=self.device_)
        comm = self._comm()
        held_out = self.fit_result_.val_fraction
        with torch.no_grad():  # the rows the fit held out, drawn again from its seed, serve the options as in fit
            split = validation_split(X, y, held_out, torch.Generator().manual_seed(self.seed), comm)
            fit_posterior_after_held_out(model, X, y, split, comm)
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
        X = validate_data(self, as_numpy(X), reset=False, dtype=np.float64)
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

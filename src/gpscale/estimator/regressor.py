"""GPRegressor: Gaussian-process regression with any gpscale method, as a scikit-learn regressor."""
from __future__ import annotations

import functools

import numpy as np
import torch
from sklearn.base import RegressorMixin
from sklearn.utils.metadata_routing import UNUSED
from sklearn.utils.validation import check_is_fitted, validate_data

from ..distributed import agree, row_offset
from ..linalg import cholesky
from ..memory import check_tensors_fit
from ..models.base import mixture_moments
from ..scaling import fit_scaling, robust_centre_and_spread, warn_outlying_targets
from ..sources import ArrayRows, StagedRows, Table
from .base import GPEstimator, all_or_nothing
from .rows import as_numpy, check_global_rows, min_rows

__all__ = ["GPRegressor", "JOINT_HOST_MATRICES"]


# float64 n* x n* matrices return_cov and sample_y hold in host memory: the covariance and sample_y's Cholesky factor
JOINT_HOST_MATRICES = 2


class GPRegressor(RegressorMixin, GPEstimator):
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
        memory and a budget of work, by the iterative solver on a GPU
        beyond, then SGPR (512 inducing points, full batch) while a pass over the data costs at most that of
        50,000 rows of 20 features, SVGP beyond (:func:`gpscale.models.auto.choose_method`). ``method_`` says what was
        fitted and ``summary()`` why.
    n_inducing : int or None, default=None
        Inducing points (or basis functions) for methods that have them, capped at n. None: the method's default.
    epochs : int or None, default=None
        None: train until the objective has converged (the plateau rule of :mod:`gpscale.defaults`), with
        L-BFGS for full-batch methods and Adam with a step-down schedule for minibatch methods. An int: that many
        passes over the data with Adam (one step per pass for full-batch methods).
    max_steps : int or None, default=None
        The cap of training to convergence, in optimiser steps. None: the method's (its model class's
        ``training_defaults()``: 1,000 L-BFGS iterations or 5,000 Adam steps, fewer where a step is dear; SGPR's and
        the exact GP's by a budget of work, their ``default_max_steps``).
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
    val_fraction : float or None, default=None
        Hold out this fraction of the rows from training, to watch the validation NLPD (training then stops when
        it stops improving, and keeps the best parameters; with a fixed ``epochs``, or to convergence unless the
        method's plateau rule watches its training loss, as ``dbk``'s and ``softki``'s do) and for what a method
        takes from rows it was not trained on (``dbk``'s and ``softki``'s ``calibrate_noise``); 0: none. None:
        the method's default when training to convergence on up to 100,000 rows of which it holds out at least
        50, 0 but for ``dbk`` and ``softki`` (0.1); else 0.
    patience : int or None, default=None
        With validation and a fixed ``epochs``: epochs without a better validation NLPD before training stops
        (None: 10); training to convergence: windows without improvement before the learning rate steps down.
    val_every : int, default=1
        With validation and a fixed ``epochs``: score the validation rows every this many epochs.
    seed : int, default=0
    dtype : {"auto", "float64", "float32"} or a torch or numpy float dtype, default="auto"
        The dtype of the data-sized work; every m x m (or p x p) core and every solve runs in float64 whatever
        it is. "auto": float32 for the methods that are faster in it at the same accuracy (svgp, softki, hvgp,
        odvgp, odvff, svdbk, dbk and the convolutional models: each model class's ``auto_dtype``), float64 for the
        others; ``dtype_`` says which a fit used.
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
                 val_fraction=None, patience=None, val_every=1, seed=0, dtype="auto", device="cpu", progress=True,
                 distributed=False, checkpoint=None, resume=False, **method_options):
        self.optimizer = optimizer
        self.noise = noise
        self.learn_noise = learn_noise
        self.normalize_y = normalize_y
        super().__init__(method, n_inducing, epochs, max_steps, batch_size, lr, kernel, x_scaling, val_fraction,
                         patience, val_every, seed, dtype, device, progress, distributed, checkpoint, resume,
                         method_options)

    @all_or_nothing
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
            check_global_rows(X, comm)
            X, y = agree(comm, lambda: validate_data(self, as_numpy(X), numeric_targets(as_numpy(y)),
                                                     y_numeric=True, ensure_min_samples=min_rows(comm),
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
        X, y = validate_data(self, as_numpy(X), as_numpy(y), y_numeric=True, reset=False, dtype=np.float64)
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


def numeric_targets(y):
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

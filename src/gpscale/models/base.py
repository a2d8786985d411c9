"""The GPModel contract and the method registry.

A model is a ``torch.nn.Module`` built from keyword options. :func:`gpscale.train.fit` drives any model through
``initialise`` → ``loss`` (minimised by Adam) → ``fit_posterior``; ``predict`` then gives the latent posterior in
chunks, and ``likelihood.predictive`` turns it into the predictive of y.
"""
from __future__ import annotations

import inspect
from typing import Callable, ClassVar, NamedTuple

import torch
from torch import Tensor, nn

from ..defaults import CONVERGENCE, FULL_BATCH_TRAINING, MINIBATCH_TRAINING, Convergence, TrainingDefaults
from ..device import chunks_on, to_device
from ..distributed import LOCAL, Comm
from ..kernels import SOFTPLUS_ZERO, Kernel, Stationary, inverse_softplus, make_kernel, median_distance
from ..likelihoods import LIKELIHOODS, make_likelihood
from ..memory import check_tensors_fit, check_tensors_fit_once

__all__ = ["GPModel", "PredictiveFactors", "BenchSize", "register", "unregister", "get_model_class",
           "available_methods", "constructor_parameters", "option_names", "option_default",
           "NotFittedPosteriorError", "mixture_moments"]

_REGISTRY: dict[str, type["GPModel"]] = {}
# float64 n* x n* matrices at the peak of the default predict_cov: the prior covariance, E^T E and their difference
JOINT_MATRICES = 3
# the rows of every chunk of a prediction are a multiple of this (see GPModel.in_chunks)
ROW_GRANULE = 64


def register(key: str) -> Callable[[type["GPModel"]], type["GPModel"]]:
    """Class decorator: make a model available as ``GPRegressor(method=key)``."""

    def decorate(cls: type["GPModel"]) -> type["GPModel"]:
        cls.key = key
        _REGISTRY[key] = cls
        return cls

    return decorate


def unregister(key: str) -> None:
    """Forget the method registered as ``key`` (a user's model registered for a while, as in a test)."""
    _REGISTRY.pop(key, None)


def get_model_class(key: str) -> type["GPModel"]:
    if key not in _REGISTRY:
        raise ValueError(f"Unknown method {key!r}. Available methods: {', '.join(available_methods())}.")
    return _REGISTRY[key]


def available_methods() -> list[str]:
    return sorted(_REGISTRY)


def constructor_parameters(cls: type["GPModel"]):
    """The ``__init__`` parameters of ``cls`` and of its bases down to GPModel, subclass first (a mixin without a
    constructor of its own, such as an engine's algebra, is skipped)."""
    for klass in cls.__mro__:
        if issubclass(klass, GPModel):
            yield inspect.signature(klass.__init__).parameters


def option_names(cls: type["GPModel"]) -> set[str]:
    """The keyword options of a model class: those its constructor and its bases' constructors declare."""
    return {p.name for parameters in constructor_parameters(cls) for p in parameters.values()
            if p.kind == p.KEYWORD_ONLY or (p.kind == p.POSITIONAL_OR_KEYWORD and p.name not in ("self", "n_features"))}


def option_default(cls: type["GPModel"], name: str):
    """The default of keyword option ``name``: the first class that declares it decides (a subclass may pass it on
    through ``**kwargs``)."""
    for parameters in constructor_parameters(cls):
        if name in parameters:
            return parameters[name].default
    raise KeyError(f"{cls.__name__} has no constructor option {name!r}.")


def mixture_moments(means: Tensor, variances: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and variance of an equal-weight mixture of distributions with these moments [S, ...] -> [...]:
    ``E[mean]`` and ``E[var] + Var[mean]`` (exactly the moments given when S = 1)."""
    mean = means.mean(0)
    return mean, variances.mean(0) + ((means - mean) ** 2).mean(0)


class BenchSize(NamedTuple):
    """A size at which the FLOP-floor instrument (:mod:`gpscale.bench.floor`) measures a method: n rows of d
    features, the method's options (never changed), and the rows of a minibatch step (ignored when full batch)."""
    n: int
    d: int
    options: dict = {}
    batch_size: int = 1024


class NotFittedPosteriorError(RuntimeError):
    """``predict`` was called before ``fit_posterior``."""


class PredictiveFactors(NamedTuple):
    """The latent posterior at the rows of X [c, d] in factored form:

        E[f(X)] = mean,    Cov[f(X)] = P - E^T E + U^T U + diag(extra),

    where P = k(X, X) is the prior covariance when ``explained`` (E) is given, and there is no prior term when it
    is None (a model whose f lies in the span of its r features, a Bayesian linear model). Every method's marginal
    variances and joint covariance come from these; the squared norms keep the variance's terms >= 0."""

    mean: Tensor  # [c]
    explained: Tensor | None  # [k, c]: what the model's features explain of the prior
    spread: Tensor | None  # [l, c]: the posterior's uncertainty about them
    extra: Tensor | None = None  # [c]: an independent variance per row (a variance correction)


class GPModel(nn.Module):
    """Base of every method: a kernel, a Gaussian likelihood and a posterior cache.

    Args:
        n_features: input dimension d.
        kernel: ``'rbf'``, ``'matern12'``, ``'matern32'``, ``'matern52'`` or a :class:`~gpscale.kernels.Kernel`.
        ard: one lengthscale per input dimension.
        lengthscale, outputscale: initial kernel hyperparameters (default ln 2 = softplus(0), as GPyTorch);
            ``lengthscale='median'`` starts every lengthscale at the median distance between training inputs (the
            median heuristic, set by :meth:`initialise`): needed where inputs lie far apart in the kernel's units,
            as images do, because at ln 2 k(x, z) underflows to ~0 and no gradient reaches the lengthscale.
        noise: initial noise variance of standardised y (default ln 2); fixed if ``learn_noise=False``.
        learn_noise: train the noise variance with the other hyperparameters (else it stays at ``noise``).
        noise_floor: lower bound of a learned noise variance.
        likelihood: ``'gaussian'``, or ``'bernoulli'`` (probit; labels -1 / +1) for the methods whose objective
            takes any likelihood through its expected log-likelihood (``likelihoods``); ``'robustmax'`` or
            ``'softmax'`` (labels 0 .. n_classes - 1, one latent GP per class) for the SVGP-engine methods.
        n_classes: the number of classes of a multiclass likelihood.
        chunk_size: rows per chunk in every pass over data; memory is O(chunk_size x m).

    Subclasses set ``full_batch = True`` when their objective needs all the data at once (collapsed bounds),
    ``batch_coupled = True`` when their minibatch loss is a function of the batch as a whole rather than a sum over
    its rows (SoftKI's marginal likelihood of each batch), and list in ``posterior_options`` the constructor options
    that act only in ``fit_posterior``: a trained model takes new values of those by setting the attribute and
    refitting the posterior, without retraining. A model whose inference happens entirely in ``fit_posterior`` (e.g.
    by MCMC) sets ``trainable = False``: training then skips the optimiser and needs no ``loss``.

    What the library does with a method when the caller does not say is declared here too (commented below), each
    with a generic default, so that a registered user model is treated as a built-in one.
    """

    key: str = ""
    likelihoods: tuple[str, ...] = ("gaussian",)  # the observation models the method supports
    full_batch: bool = False
    batch_coupled: bool = False
    trainable: bool = True
    posterior_options: tuple[str, ...] = ()
    # old option name -> new (one meaning per name): the estimators refuse the old name, naming the new (check_renamed)
    renamed_options: ClassVar[dict[str, str]] = {}
    rebuilt_cache: tuple[str, ...] = ()  # cache entries the model forms again when missing: not saved, not copied
    # how it trains (optimiser, learning rate, batch size, step cap); None: the generic row (training_defaults)
    default_training: ClassVar[TrainingDefaults | None] = None
    default_convergence: ClassVar[Convergence] = CONVERGENCE  # the plateau rule of its training to convergence
    auto_dtype: ClassVar[str] = "float64"  # what dtype="auto" gives its data-sized work (cores and solves: float64)
    # options sizing a basis placed at training rows (k-means centres): the estimators cap them at one per row
    sizes_capped_by_rows: ClassVar[tuple[str, ...]] = ("n_inducing",)
    # whether a kernel given by name (RBF, Matérn) is stationary on the distance between inputs, so that the
    # estimators start its lengthscale at the median distance (as start_lengthscale_at_median does for an instance)
    lengthscale_starts_at_median: ClassVar[bool] = True
    warm_up_options: ClassVar[dict] = {}  # added to the benchmark's one-epoch warm-up (work epochs do not shorten)
    floor_sizes: ClassVar[dict[str, BenchSize]] = {}  # "small", "paper": where `bench --protocol floor` measures it

    @classmethod
    def training_defaults(cls) -> TrainingDefaults:
        """How the method trains unless told otherwise: its ``default_training``, else the generic row for its
        ``full_batch`` (:data:`~gpscale.defaults.FULL_BATCH_TRAINING`, :data:`~gpscale.defaults.MINIBATCH_TRAINING`)."""
        if cls.default_training is not None:
            return cls.default_training
        return FULL_BATCH_TRAINING if cls.full_batch else MINIBATCH_TRAINING

    @classmethod
    def default_max_steps(cls, n: int, d: int, options: dict) -> int | None:
        """The step cap of a fit to convergence on n rows of d features with these constructor ``options`` (an option
        left out takes its default) when the caller gives no ``max_steps``; None: :meth:`training_defaults`'."""
        return None

    @classmethod
    def default_val_fraction(cls, options: dict) -> float:
        """The share of the rows a fit to convergence holds out when the caller gives no ``val_fraction``, for these
        constructor ``options`` (as :meth:`default_max_steps`): :meth:`training_defaults`'."""
        return cls.training_defaults().val_fraction

    def __init__(self, n_features: int, *, kernel: str | Kernel = "rbf", ard: bool = True,
                 lengthscale: float | str = SOFTPLUS_ZERO, outputscale: float = SOFTPLUS_ZERO,
                 noise: float = SOFTPLUS_ZERO, learn_noise: bool = True, noise_floor: float = 1e-6,
                 likelihood: str = "gaussian", n_classes: int | None = None, chunk_size: int = 8192):
        super().__init__()
        self.n_features = int(n_features)
        self.chunk_size = int(chunk_size)
        if isinstance(lengthscale, str) and lengthscale != "median":
            raise ValueError(f"lengthscale must be a positive number or 'median', got {lengthscale!r}.")
        self.median_lengthscale = lengthscale == "median"
        if isinstance(kernel, Kernel):
            self.kernel = kernel
        else:
            self.kernel = make_kernel(kernel, self.n_features, ard=ard, outputscale=outputscale,
                                      lengthscale=SOFTPLUS_ZERO if self.median_lengthscale else lengthscale)
        if self.median_lengthscale and not hasattr(self.kernel, "raw_lengthscale"):
            raise ValueError(f"lengthscale='median' sets the lengthscale of a stationary kernel on the inputs; "
                             f"{type(self.kernel).__name__} has none. Pass a number instead.")
        if likelihood in LIKELIHOODS and likelihood not in self.likelihoods:
            able = [key for key in available_methods() if likelihood in _REGISTRY[key].likelihoods]
            raise ValueError(f"Method {self.key or type(self).__name__!r} supports the likelihoods "
                             f"{self.likelihoods}, not {likelihood!r}, which these methods take: {', '.join(able)}.")
        classes = {} if n_classes is None else {"n_classes": n_classes}
        self.likelihood = make_likelihood(likelihood, noise=noise, learn_noise=learn_noise, noise_floor=noise_floor,
                                          **classes)
        self.cache: dict[str, Tensor] = {}

    # --- the contract -----------------------------------------------------------------------------------
    def initialise(self, X: Tensor, y: Tensor, seed: int = 0) -> None:
        """Start training on (X, y): the median-heuristic lengthscale if asked for, then :meth:`initialise_from_data`."""
        if self.median_lengthscale:
            with torch.no_grad():
                ls = inverse_softplus(median_distance(X, seed=seed))
                self.kernel.raw_lengthscale.fill_(ls.item())
        self.initialise_from_data(X, y, seed)

    def start_lengthscale_at_median(self) -> bool:
        """Have :meth:`initialise` start the lengthscale(s) at the median distance between training rows (as
        ``lengthscale='median'``) if the kernel is stationary (RBF, Matérn); returns whether it will."""
        self.median_lengthscale = self.median_lengthscale or isinstance(self.kernel, Stationary)
        return self.median_lengthscale

    def check_memory(self, n: int, comm: Comm = LOCAL) -> None:
        """Raise :class:`~gpscale.memory.InsufficientMemoryError`, before training on n rows (held by ``comm``'s
        processes; call it on every process), where a matrix the fit is sure to form would not fit. Default: nothing."""

    def initialise_from_data(self, X: Tensor, y: Tensor, seed: int = 0) -> None:
        """Data-dependent initialisation (inducing points, grids, ...). Default: nothing."""

    def loss(self, X: Tensor, y: Tensor, num_data: int, comm: Comm = LOCAL,
             share: float = 1.0) -> Tensor:  # pragma: no cover - interface
        """Training objective per data point of a set of ``num_data`` points, on a minibatch (X [b, d], y [b]) or,
        for a ``full_batch`` model, on all the rows.

        Under data parallelism every process calls it on its part of the batch, X holding a ``share`` b_r / B of
        the batch's rows (possibly none; ``share`` is ``1 / world_size`` for a full-batch loss and for a
        ``batch_coupled`` one, which every process evaluates on the whole batch). It returns this process's part:
        the parts weighted by their shares sum to the loss, with every collective the loss needs taken through
        ``comm`` on every process, rows or not. A loss that is a sum over rows plus a term of the parameters needs
        neither: its value on its rows alone is its part."""
        raise NotImplementedError

    def fit_posterior(self, X: Tensor, y: Tensor, comm: Comm = LOCAL) -> None:
        """Fill ``self.cache`` with everything prediction needs, in one streamed pass over (X, y)."""
        raise NotImplementedError  # pragma: no cover - interface

    def calibrate_on_held_out(self, X_fit: Tensor, y_fit: Tensor, X_held: Tensor, y_held: Tensor,
                              comm: Comm = LOCAL) -> None:
        """Set what the posterior takes from the rows training held out (``val_fraction``), given them and the
        rows trained on; the trainer calls it before each validation pass and before the final
        :meth:`fit_posterior` on all the rows. Default: nothing."""

    def predictive_factors(self, X: Tensor) -> PredictiveFactors:  # pragma: no cover - interface
        """The latent posterior at the rows of X [c, d] in factored form (:class:`PredictiveFactors`), from
        ``self.cache``."""
        raise NotImplementedError

    def prior_covariance(self, X: Tensor) -> Tensor:
        """``k(X, X)`` [c, c], the P of :class:`PredictiveFactors`."""
        return self.kernel(X, X)

    def prior_variance(self, X: Tensor) -> Tensor:
        """``k(x, x)`` [c] at the rows of X, the diagonal of :meth:`prior_covariance`."""
        return self.kernel.diag(X)

    def predict_chunk(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """Latent posterior mean and variance [c] at the rows of X [c, d], from ``self.cache``: the diagonal of
        :meth:`predictive_factors`' covariance."""
        mean, E, U, extra = self.predictive_factors(X)
        var = torch.zeros_like(mean)
        if E is not None:  # k(x, x) - |e|^2 >= 0 in exact arithmetic: the clamp removes round-off only
            var = (self.prior_variance(X).to(mean.dtype) - (E * E).sum(0)).clamp_min(0.0)
        if U is not None:
            var = var + (U * U).sum(0)
        if extra is not None:
            var = var + extra
        return mean.to(X.dtype), var.to(X.dtype)

    def training_loss(self, X: Tensor, y: Tensor, num_data: int, comm: Comm = LOCAL,
                      share: float = 1.0) -> Tensor:
        """The loss of one optimiser step on a minibatch, with :meth:`loss`'s arguments; the trainer calls it. A
        model that moves some parameters by steps the optimiser does not see (the variational engine's
        natural-gradient steps on q) takes them here, before its loss on the same minibatch; under data
        parallelism such a step reduces its gradients through ``comm`` so that every process takes the same step.
        Default: :meth:`loss`."""
        return self.loss(X, y, num_data, comm, share)

    def step_state(self) -> dict[str, Tensor]:
        """What a training step passes on to the next within an epoch beyond the parameters and buffers (default:
        nothing): saved in a checkpoint taken mid-epoch, so that the resumed fit takes the steps the uninterrupted
        one takes."""
        return {}

    def set_step_state(self, state: dict[str, Tensor]) -> None:
        """Put back :meth:`step_state` (after ``load_state_dict`` and ``train()``)."""

    # --- shared machinery -------------------------------------------------------------------------------
    @torch.no_grad()
    def predict(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """Latent posterior mean and variance of f at X [n*, d], chunked: never n* x n* or n x n*. X may stay in
        host memory when the model is on a GPU: each chunk is copied there as it is needed
        (:func:`gpscale.device.chunks_on`); the moments come back on the model's device."""
        if not self.cache:
            raise NotFittedPosteriorError(
                f"The {self.key} model has no posterior yet: call fit_posterior(X, y) after training."
            )
        return self.in_chunks(self.predict_chunk, X, self.rows_per_chunk())

    def in_chunks(self, predict_chunk: Callable[[Tensor], tuple[Tensor, Tensor]], X: Tensor, chunk_size: int,
                  dim: int = 0) -> tuple[Tensor, Tensor]:
        """``predict_chunk`` over chunks of the rows of X [n*, ...], its two outputs concatenated along ``dim``
        (where the rows are). Every chunk holds a multiple of ``ROW_GRANULE`` rows, the last padded with copies of
        the last row (cut off after), so that a row's prediction does not depend on the other rows of the call:
        the matrix products take the same path for it, whatever their number."""
        rows = X.shape[0]
        padding = -rows % ROW_GRANULE
        if padding and rows:
            X = torch.cat([X, X[-1:].expand(padding, *X.shape[1:])])
        chunk_size = max(ROW_GRANULE, chunk_size - chunk_size % ROW_GRANULE)
        parts = [predict_chunk(Xc) for (Xc,) in chunks_on(self.device, chunk_size, X)]
        first, second = (torch.cat([part[i] for part in parts], dim).narrow(dim, 0, rows) for i in (0, 1))
        return first, second

    def rows_per_chunk(self) -> int:
        """Rows per chunk of :meth:`predict`: ``chunk_size`` (a model whose chunk is held against every training
        row takes fewer)."""
        return self.chunk_size

    @torch.no_grad()
    def predict_mixture(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """The latent predictive at X [n*, d] as an equal-weight mixture of S Gaussians: means and variances
        [S, n*] (or [S, n*, C]), over which the estimators average the likelihood's predictive. Default: S = 1,
        :meth:`predict`'s moments (a model whose predictive is a mixture, such as a deep GP's over draws of its
        hidden layers, overrides this)."""
        mean, var = self.predict(X)
        return mean.unsqueeze(0), var.unsqueeze(0)

    @torch.no_grad()
    def predict_cov(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """Latent posterior mean [n*] and joint covariance [n*, n*] of f at X [n*, d] (one block: O(n*^2) memory,
        for the few hundred or thousand rows a joint draw needs)."""
        if not self.cache:
            raise NotFittedPosteriorError(
                f"The {self.key} model has no posterior yet: call fit_posterior(X, y) after training."
            )
        self.check_joint_fits(X.shape[0], JOINT_MATRICES)
        X = to_device(X, self.device)
        mean, E, U, extra = self.predictive_factors(X)
        cov = torch.zeros(mean.shape[0], mean.shape[0], dtype=mean.dtype, device=mean.device)
        if E is not None:
            cov = self.prior_covariance(X).to(mean.dtype) - E.T @ E
        if U is not None:
            cov = cov + U.T @ U
        if extra is not None:
            cov = cov + torch.diag(extra)
        return mean.to(X.dtype), cov.to(X.dtype)

    def check_batch_fits(self, shape: tuple[int, ...], dtype: torch.dtype, *, copies: int, what: str,
                         advice: str) -> None:
        """:func:`~gpscale.memory.check_tensors_fit` for matrices a training step or a prediction chunk forms, once
        per shape, dtype and count on this model: a fit's steps form the same few shapes, and reading the free
        memory at every step would cost more than a small step."""
        check_tensors_fit_once(self.__dict__.setdefault("_batch_shapes_fit", set()), shape, dtype, copies=copies,
                               device=self.device, what=what, advice=advice)

    def check_joint_fits(self, rows: int, matrices: int) -> None:
        """Raise :class:`~gpscale.memory.InsufficientMemoryError`, before a joint covariance of ``rows`` test rows is
        formed, where ``matrices`` float64 matrices of rows x rows (the covariance and what it is formed from) do not
        fit in the free memory of the model's device."""
        check_tensors_fit((rows, rows), torch.float64, copies=matrices, device=self.device,
                          what=f"The joint posterior covariance of {rows:,} test rows",
                          advice="Ask for the marginal variances instead (predict; return_std=True in the "
                                 "estimators), which are formed in chunks of rows, or for the joint covariance of "
                                 "fewer rows at a time (pass the rows in blocks).")

    def posterior_description(self) -> str:
        """One line on how the fitted posterior was computed, for ``summary()`` (empty: nothing to add)."""
        return ""

    def check_inputs(self, X: Tensor) -> None:
        """Warn about rows of X [n*, d] where the fitted posterior should not be trusted; called on the inputs a
        user asks to predict at (not on validation rows during training). Default: nothing, as a stationary
        kernel's posterior reverts to its prior away from the data."""

    def parameter_groups(self) -> list[dict]:
        """The trainable parameters as ``torch.optim`` parameter groups, which :func:`gpscale.train.fit` optimises.
        Default: one group with the optimiser's defaults (a model may give some parameters their own, e.g. weight
        decay on a network but not on the noise)."""
        return [{"params": [p for p in self.parameters() if p.requires_grad]}]

    def clear_cache(self) -> None:
        """Forget the posterior; training calls this because new hyperparameters make it stale. A noise calibrated
        in the posterior fit (:meth:`set_calibrated_noise`) goes with it: the training noise comes back."""
        if "training_raw_noise" in self.cache:
            with torch.no_grad():
                self.likelihood.raw_noise.copy_(self.cache["training_raw_noise"])
        self.cache = {}

    @torch.no_grad()
    def set_calibrated_noise(self, noise: float) -> None:
        """Predict with ``noise`` (sigma^2, re-estimated after training) instead of the trained value, which the
        cache keeps for :meth:`clear_cache` to restore: the training loss never sees it. Call after clear_cache."""
        self.cache["training_raw_noise"] = self.likelihood.raw_noise.detach().clone()
        self.likelihood.set_noise(noise)

    def check_posterior_options(self) -> None:
        """Raise ValueError for a ``posterior_options`` value the model cannot use; called before every posterior
        fit (they may be set as attributes after construction). Default: nothing."""

    def noise_search_bounds(self, mean_square: float) -> tuple[float, float]:
        """[noise floor + 1e-8, 10 E[y^2]]: where a noise search looks, for targets of mean square ``mean_square``."""
        return self.likelihood.noise_floor + 1e-8, max(10.0 * mean_square, 1e-6)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """As ``torch.nn.Module.load_state_dict``; a submodule this model holds under several names (a kernel that
        its inducing features hold too) is filled in under every name from the one saved."""
        state = dict(state_dict)
        aliases: dict[int, list[str]] = {}
        for name, value in self.state_dict(keep_vars=True).items():
            aliases.setdefault(id(value), []).append(name)
        for names in aliases.values():
            saved = [name for name in names if name in state]
            for name in names if saved else ():
                state.setdefault(name, state[saved[0]])
        return super().load_state_dict(state, strict=strict, assign=assign)

    def get_extra_state(self) -> dict[str, Tensor]:
        # the posterior cache travels with state_dict(), so a saved model predicts without its training data
        return {k: v for k, v in self.cache.items() if k not in self.rebuilt_cache}

    def set_extra_state(self, state: dict[str, Tensor]) -> None:
        self.cache = dict(state)

    @property
    def noise(self) -> Tensor:
        return self.likelihood.noise

    @property
    def device(self) -> torch.device:
        """Where the model's parameters are, and so where its passes over data compute (HVGP may place its blocks'
        algebra on other devices too)."""
        return next(self.parameters()).device

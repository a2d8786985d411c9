"""The linear engine: :class:`FeatureSpaceGP`, a *feature-space GP*, a GP whose kernel is a finite feature map,
``k(x, x') = phi(x)^T phi(x')``; equivalently the Bayesian linear model ``f(x) = phi(x)^T w``, ``w ~ N(0, I_r)``.

A method supplies the feature map ``phi: R^d -> R^r``; the engine owns the rest: the solver, chunked (and
checkpointed) features, the evidence (streamed, or from Phi held in memory with the cancellation-free residual data
fit), the *weight posterior* p(w | y), prediction and noise calibration, all from the sufficient statistics of
:mod:`gpscale.models.linear.weight_space` (memory O(chunk x r), never n x n; float64 r x r cores).

Users: ``sgpr`` and ``vff`` (Titsias' collapsed bound over inducing features,
:class:`~gpscale.models.linear.collapsed.CollapsedGP`), ``softki`` (softmax interpolation), ``grief`` (grid
eigenfunctions) and ``dbk`` (a network's bases).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from ...device import chunks_on
from ...distributed import LOCAL, Comm, global_count
from ...linalg import CORE, solve_lower
from ...memory import check_tensors_fit, per_process_bytes
from .weight_space import (FeatureMap, Statistics, WeightPosterior, accumulate, chunk_sums, evidence_maximising_noise,
                           gram_and_cross_grad, held_out_maximising_noise, held_statistics, log_evidence, residual_quad,
                           weight_posterior_cholesky, weight_posterior_qr, weight_space_factors)
from ..base import GPModel, PredictiveFactors, option_default, option_names

__all__ = ["FeatureSpaceGP", "Features", "SOLVERS", "CALIBRATION_MODES"]

SOLVERS = ("auto", "cholesky", "qr")
CALIBRATION_MODES = (None, "variance", "posterior")
# the largest Phi [n, r] (float64 bytes per process) that ``residual_evidence`` holds in training: beyond it Phi and
# its gradient's copies would take most of a machine's memory, and the streamed evidence serves instead
HELD_FEATURES_BYTES = 2**31
# and at most this share of the free memory, with its gradient (the rest: the chunks' temporaries and the process)
HELD_MEMORY_FRACTION = 0.5


@dataclass(frozen=True)
class Features:
    """A feature map as the engine takes it: ``phi(x) = L^{-1} psi(x)`` with ``whitening_factor = L`` [r, r]
    (lower, float64), else ``phi(x) = psi(x)``. Whitening is kept apart so that the Cholesky solver can whiten the
    statistics once on the r x r core instead of every row (:func:`accumulate`)."""

    raw: FeatureMap  # X [c, d] -> Psi [c, r]
    whitening_factor: Tensor | None = None

    def __call__(self, X: Tensor) -> Tensor:
        """Phi [c, r] for X [c, d]."""
        Psi = self.raw(X)
        return Psi if self.whitening_factor is None else solve_lower(self.whitening_factor.to(X.dtype), Psi.T).T


# --- the engine --------------------------------------------------------------------------------------------------
class FeatureSpaceGP(GPModel):
    """A GP whose f lies in the span of r features: ``f(x) = phi(x)^T w``, ``w ~ N(0, I)``, trained full batch on
    the log evidence (a method may train on another loss and use the rest).

    A method supplies :meth:`feature_state` (tensors computed once from the hyperparameters, which the posterior
    cache keeps for prediction: a Cholesky factor, eigenvectors; default none) and :meth:`feature_map`; it may set

    - ``trace_term = True`` when ``phi(x)^T phi(x')`` approximates the model's kernel k (inducing features, as
      :class:`CollapsedGP`): the statistics carry ``sum_i k(x_i, x_i)`` for Titsias' trace term, and prediction
      adds back ``k(x, x') - phi(x)^T phi(x')``;
    - ``residual_evidence = True`` to hold Phi [n, r] in memory in training (computed in chunks, no graph kept) and
      take the evidence's data fit in its cancellation-free residual form (:func:`residual_quad`), while Phi fits
      (:meth:`holds_features`); beyond, the evidence streams its statistics like any other;
    - :meth:`predictive_extra`, an independent latent variance per test row (a variance correction);
    - ``held_features_advice``, what to do instead where Phi held whole would not fit in memory (:meth:`phi`
      refuses it).

    Two engine settings, which a method that offers them takes as constructor options and sets with
    :meth:`set_engine_options` (the others keep the class defaults, so that no method accepts an option it ignores):

    - ``solver``: ``'cholesky'`` (the Gram matrix of the features, whitened on the r x r core: fast), ``'qr'`` (TSQR
      of the features, row by row: stable for tiny noise and in float32) or ``'auto'`` (the default): ``'cholesky'``
      for the training objective on float64 data, ``'qr'`` for float32 data and for the posterior fit;
    - ``calibrate_noise``: after training, set the noise of prediction to the sigma^2 that maximises, features
      fixed, the predictive density of the rows training held out (``val_fraction``), else the evidence of the
      rows the posterior fits: ``None`` (the default: no calibration), ``'variance'`` (the posterior mean keeps the
      training noise, the variance takes the calibrated one) or ``'posterior'`` (both take it).
    """

    full_batch = True
    trace_term = False
    residual_evidence = False
    solver: str = "auto"
    calibrate_noise: str | None = None
    held_out_noise: float | None = None  # set by calibrate_on_held_out for the posterior fit that follows it
    # what to do where Phi [n, r] held whole (:meth:`phi`) does not fit: the method's alternatives
    held_features_advice = "Use fewer features or fewer rows."

    def set_engine_options(self, solver: str | None = None, calibrate_noise: str | None = None) -> None:
        """Check, then set, the engine settings a method offers (``solver=None`` keeps the current solver)."""
        solver = self.solver if solver is None else solver
        _check_engine_options(solver, calibrate_noise)
        self.solver, self.calibrate_noise = solver, calibrate_noise

    def check_posterior_options(self) -> None:
        _check_engine_options(self.solver, self.calibrate_noise)

    @classmethod
    def default_val_fraction(cls, options: dict) -> float:
        """Where the method offers ``calibrate_noise``, its default only while that is set (nothing else of the
        engine's takes from held-out rows), else 0."""
        offered = "calibrate_noise" in option_names(cls)
        if offered and options.get("calibrate_noise", option_default(cls, "calibrate_noise")) is None:
            return 0.0
        return super().default_val_fraction(options)

    # --- what a method supplies -----------------------------------------------------------------------------
    def feature_state(self) -> dict[str, Tensor]:
        """The tensors the feature map needs, computed from the current hyperparameters (differentiably)."""
        return {}

    def feature_map(self, state: dict[str, Tensor]) -> Features:  # pragma: no cover - interface
        """``x -> phi(x)`` at the hyperparameters that gave ``state``."""
        raise NotImplementedError

    def predictive_extra(self, Phi: Tensor) -> Tensor | None:
        """An independent latent variance [c] at test rows with features Phi [c, r] (float64). Default: none."""
        return None

    # --- the engine -----------------------------------------------------------------------------------------
    def _prior_diag(self) -> FeatureMap | None:
        return self.prior_variance if self.trace_term else None

    def phi(self, X: Tensor, state: dict[str, Tensor] | None = None) -> Tensor:
        """Phi = phi(X) [n, r] held in memory, computed ``chunk_size`` rows at a time into one tensor. With
        gradients on and several chunks no chunk's graph is kept: the backward pass rebuilds one at a time
        (:class:`_ChunkedFeatures`). Phi is refused where it would not fit (:meth:`check_held_features`)."""
        state = self.feature_state() if state is None else state
        check = functools.partial(self.check_held_features, copies=2 if torch.is_grad_enabled() else 1)
        if not torch.is_grad_enabled() or X.shape[0] <= self.chunk_size:
            return _rows_into_one(self.feature_map(state), X, self.chunk_size, self.device, check)
        if X.requires_grad:  # gradients for the inputs too: a checkpointed graph per chunk
            features = self.feature_map(state)
            return torch.cat([checkpoint(features, Xc, use_reentrant=False)
                              for (Xc,) in chunks_on(self.device, self.chunk_size, X)])
        params = [p for p in self.parameters() if p.requires_grad]
        return _ChunkedFeatures.apply(self.feature_map, tuple(state), self.chunk_size, self.device, check, X,
                                      *state.values(), *params)

    def check_held_features(self, shape: tuple[int, int], dtype: torch.dtype, copies: int) -> None:
        """Raise :class:`~gpscale.memory.InsufficientMemoryError` where Phi of ``shape`` [n, r] and ``dtype``, held
        whole, does not fit in the free memory of the model's device with its ``copies`` (2 with its gradient)."""
        check_tensors_fit(shape, dtype, copies=copies, device=self.device,
                          what=f"The features Phi of {shape[0]:,} rows held whole", advice=self.held_features_advice)

    def statistics(self, X: Tensor, y: Tensor, comm: Comm = LOCAL,
                   state: dict[str, Tensor] | None = None) -> Statistics:
        """``Phi^T Phi``, ``Phi^T y``, y^T y and n in one streamed pass over (X [n, d], y [n]) (memory
        O(chunk x r)); with a whitened map the Gram matrix is whitened once, on the core. Differentiable (the
        Cholesky solver's training objective goes through it): call it under ``torch.no_grad()`` for statistics
        alone."""
        state = self.feature_state() if state is None else state
        features, prior_diag, y = self.feature_map(state), self._prior_diag(), y.to(CORE)
        sums = None
        # over several chunks no chunk's graph is kept (_StreamedStatistics); with gradients for the inputs too, all are
        if torch.is_grad_enabled() and X.shape[0] > self.chunk_size and not X.requires_grad:
            params = [p for p in self.parameters() if p.requires_grad]
            sums = _StreamedStatistics.apply(self.feature_map, prior_diag, tuple(state), self.chunk_size, self.device,
                                             X, y, *state.values(), *params)
        return accumulate(features.raw, X, y, chunk_size=self.chunk_size, prior_diag=prior_diag,
                          whitening_factor=features.whitening_factor, comm=comm, device=self.device, sums=sums)

    def solver_for(self, X: Tensor, posterior: bool) -> str:
        """The solver of a pass over X: ``'auto'`` takes Cholesky only for a float64 training objective."""
        if self.solver != "auto":
            return self.solver
        return "cholesky" if X.dtype == CORE and not posterior else "qr"

    def weight_posterior(self, X: Tensor, y: Tensor, comm: Comm = LOCAL, state: dict[str, Tensor] | None = None, *,
                         posterior: bool = False, stats: Statistics | None = None) -> WeightPosterior:
        """The posterior of w from one streamed pass over (X [n, d], y [n]) (``posterior``: for the posterior fit);
        the Cholesky solver takes already accumulated ``stats`` instead of that pass."""
        state = self.feature_state() if state is None else state
        if self.solver_for(X, posterior) == "qr":
            return weight_posterior_qr(self.feature_map(state), X, y, self.noise, chunk_size=self.chunk_size,
                               prior_diag=self._prior_diag(), comm=comm, device=self.device)
        stats = self.statistics(X, y, comm, state) if stats is None else stats
        return weight_posterior_cholesky(stats, self.noise)

    def weight_posterior_of(self, Phi: Tensor, y: Tensor, comm: Comm = LOCAL, noise: Tensor | None = None,
                            row_scale: Tensor | None = None) -> WeightPosterior:
        """The posterior of w from features Phi [n, r] held in memory and targets y [n] (every process's rows), by
        Cholesky in float64, at the model's noise or ``noise``; with ``row_scale`` s [n], that of the rows
        ``s_i phi_i`` and targets ``s_i y_i`` (without gradients, :func:`held_statistics`). Its statistics' gradient
        in Phi is formed in Phi's dtype, which the residual evidence (:meth:`evidence_of`) allows: differentiate it
        through that."""
        stats = held_statistics(Phi, y, chunk_size=self.chunk_size, comm=comm, row_scale=row_scale)
        return weight_posterior_cholesky(stats, self.noise if noise is None else noise)

    def evidence_of(self, Phi: Tensor, y: Tensor, comm: Comm = LOCAL) -> Tensor:
        """``log N(y | 0, Phi Phi^T + sigma^2 I)`` for features Phi [n, r] held in memory, with the data fit in
        residual form (float64 scalar, differentiable)."""
        post = self.weight_posterior_of(Phi, y, comm)
        quad = residual_quad(Phi, y, post.weight_mean, self.noise, chunk_size=self.chunk_size, comm=comm)
        return log_evidence(replace(post, quad=quad), self.noise)

    def log_marginal_likelihood(self, X: Tensor, y: Tensor, comm: Comm = LOCAL) -> Tensor:
        """``log N(y | 0, Phi Phi^T + sigma^2 I)`` over every process's rows (float64 scalar, differentiable): from
        Phi held in memory with the residual data fit (``residual_evidence``, while Phi fits:
        :meth:`holds_features`), else from one streamed pass."""
        if self.residual_evidence and self.holds_features(X, comm):
            return self.evidence_of(self.phi(X), y, comm)
        return log_evidence(self.weight_posterior(X, y, comm), self.noise)

    def holds_features(self, X: Tensor, comm: Comm = LOCAL) -> bool:
        """Whether Phi [n, r] of a process's share of the rows fits in ``HELD_FEATURES_BYTES`` (float64 features,
        r = :meth:`feature_width`) and, with its gradient, in ``HELD_MEMORY_FRACTION`` of the free memory of the
        process that has least; the same answer on every process (a collective), from the global row count."""
        n_per_process = math.ceil(global_count(X.shape[0], comm) / comm.world_size)
        held = n_per_process * self.feature_width(X) * CORE.itemsize
        # Phi and its gradient, in the free memory of the process that has least
        return held <= HELD_FEATURES_BYTES and 2 * held <= HELD_MEMORY_FRACTION * per_process_bytes(self.device, comm)

    @torch.no_grad()
    def feature_width(self, X: Tensor) -> int:
        """r, the number of features, from one row of X [n, d] (a method that knows r overrides this)."""
        return self.feature_map(self.feature_state())(X[:1]).shape[-1]

    def objective(self, X: Tensor, y: Tensor, comm: Comm = LOCAL) -> Tensor:
        """What full-batch training maximises; default :meth:`log_marginal_likelihood`."""
        return self.log_marginal_likelihood(X, y, comm)

    def loss(self, X: Tensor, y: Tensor, num_data: int, comm: Comm = LOCAL, share: float = 1.0) -> Tensor:
        return -self.objective(X, y, comm) / num_data

    @torch.no_grad()
    def fit_posterior(self, X: Tensor, y: Tensor, comm: Comm = LOCAL) -> None:
        """The posterior of w from the final hyperparameters (not the last batch's) in one streamed pass, with the
        noise calibrated as ``calibrate_noise`` says; the cache keeps the feature state, ``L_B`` and E[w | y]."""
        held_out = self.take_held_out_noise()  # taken first: an error below must not leave it for another fit
        self.check_posterior_options()  # posterior options may have been set as attributes since construction
        self.clear_cache()  # a previous calibration must not be the starting point of this one
        state = self.feature_state()
        if self.calibrate_noise is None:
            post = self.weight_posterior(X, y, comm, state, posterior=True)
            self.cache = {**state, "L_B": post.L_B, "w_mean": post.weight_mean}
            return
        # one pass for Phi^T Phi and Phi^T y: the noise search, and the posterior under the calibrated noise
        stats = self.statistics(X, y, comm, state)
        trained = self.weight_posterior(X, y, comm, state, posterior=True, stats=stats) \
            if self.calibrate_noise == "variance" else None
        self.set_calibrated_noise(self.evidence_optimal_noise(stats) if held_out is None else held_out)
        # Cholesky is safe here whatever the solver: the calibrated noise is the evidence's optimum, far above
        # the tiny training noise that made the normal matrix ill-conditioned
        calibrated = weight_posterior_cholesky(stats, self.noise)
        mean_from = trained if trained is not None else calibrated
        self.cache.update(**state, L_B=calibrated.L_B, w_mean=mean_from.weight_mean)

    @torch.no_grad()
    def calibrate_on_held_out(self, X_fit: Tensor, y_fit: Tensor, X_held: Tensor, y_held: Tensor,
                              comm: Comm = LOCAL) -> None:
        """With ``calibrate_noise`` set, have the next :meth:`fit_posterior` calibrate to the held-out rows'
        sigma^2 (:meth:`held_out_optimal_noise`) instead of the evidence's on the rows it fits: trained features
        fit their training rows more closely than new ones, so those rows understate the noise at new inputs."""
        if self.calibrate_noise is not None:
            self.held_out_noise = self.held_out_optimal_noise(X_fit, y_fit, X_held, y_held, comm)

    def take_held_out_noise(self) -> float | None:
        """The sigma^2 :meth:`calibrate_on_held_out` set for this posterior fit, if any, forgotten once taken: a
        later fit calibrates on the evidence of the rows it fits unless the held-out rows are given again (as the
        estimators' ``refit_posterior`` does)."""
        noise, self.held_out_noise = self.held_out_noise, None
        return noise

    @torch.no_grad()
    def held_out_optimal_noise(self, X_fit: Tensor, y_fit: Tensor, X_held: Tensor, y_held: Tensor,
                               comm: Comm = LOCAL) -> float:
        """``argmax_{sigma^2} sum_h log N(y_h | E[f_h], Var[f_h] + sigma^2)`` over every process's held-out rows
        (X_held [n_h, d], y_held [n_h]), w's posterior from (X_fit, y_fit) at sigma^2 (E[f_h] at the training
        noise with ``calibrate_noise='variance'``): :func:`held_out_maximising_noise`."""
        self.clear_cache()
        state = self.feature_state()
        stats = self.statistics(X_fit, y_fit, comm, state)
        Phi_held = self.phi(X_held, state).to(CORE)
        fixed_mean = None
        if self.calibrate_noise == "variance":
            fixed_mean = Phi_held @ self.weight_posterior(X_fit, y_fit, comm, state, posterior=True,
                                                          stats=stats).weight_mean
        extra = self.predictive_extra(Phi_held)
        if self.trace_term:  # what the features leave of k(x, x)
            extra = (0 if extra is None else extra) + self.prior_variance(X_held).to(CORE) - (Phi_held ** 2).sum(1)
        return held_out_maximising_noise(stats, Phi_held, y_held, *self.noise_search_bounds(float(stats.yy) / stats.n),
                                         fixed_mean=fixed_mean, extra=extra, comm=comm)

    def evidence_optimal_noise(self, stats: Statistics, bounds: tuple[float, float] | None = None) -> float:
        """``argmax_{sigma^2} log N(y | 0, Phi Phi^T + sigma^2 I)`` with the features fixed, within ``bounds``
        (default :meth:`~gpscale.models.base.GPModel.noise_search_bounds`): O(r) per evaluation after one
        eigendecomposition of ``Phi^T Phi`` (:func:`evidence_maximising_noise`)."""
        bounds = self.noise_search_bounds(float(stats.yy) / stats.n) if bounds is None else bounds
        return evidence_maximising_noise(stats, *bounds)

    def predictive_factors(self, X: Tensor) -> PredictiveFactors:
        """The weights' posterior at ``phi(x)``, with ``k(x, x') - phi(x)^T phi(x')`` (what the features do not
        explain) where they approximate a kernel, and :meth:`predictive_extra`."""
        Phi = self.feature_map(self.cache)(X).to(CORE)  # [c, r]
        mean, _, U, _ = weight_space_factors(self.cache["L_B"], self.cache["w_mean"], Phi)
        return PredictiveFactors(mean, Phi.T if self.trace_term else None, U, self.predictive_extra(Phi))


def _rows_into_one(features, X: Tensor, chunk_size: int, device, check) -> Tensor:
    """features(X) [n, r], ``chunk_size`` rows of X at a time (on ``device``), written into one tensor: a list of
    chunks joined by ``torch.cat`` holds Phi twice. ``check(shape, dtype)`` sees Phi's shape and dtype, known from
    the first chunk, before Phi is allocated (it raises where Phi would not fit)."""
    Phi, start = None, 0
    for (Xc,) in chunks_on(device, chunk_size, X):
        Pc = features(Xc)
        if Phi is None:
            check((X.shape[0], *Pc.shape[1:]), Pc.dtype)
            Phi = Pc.new_empty((X.shape[0], *Pc.shape[1:]))
        Phi[start:start + Pc.shape[0]] = Pc
        start += Pc.shape[0]
    return Phi


class _ChunkedFeatures(torch.autograd.Function):
    """Phi = phi(X) [n, r] held in memory, computed ``chunk_size`` rows at a time into one tensor with no autograd
    graph; the backward pass rebuilds one chunk's graph at a time and backpropagates that chunk's rows of dPhi.

    One autograd node for the whole pass rather than a checkpointed graph per chunk: a checkpointed chunk keeps its
    graph's nodes (small allocations) alive until the backward pass, and glibc puts them in the holes its freed
    chunk-sized temporaries left, so each chunk's temporaries would take fresh heap and the heap would grow by
    several chunks' worth per chunk."""

    @staticmethod
    def forward(ctx, feature_map, keys, chunk_size, device, check, X, *tensors):
        Phi = _rows_into_one(feature_map(dict(zip(keys, tensors[:len(keys)]))), X, chunk_size, device, check)
        ctx.feature_map, ctx.keys, ctx.chunk_size, ctx.device = feature_map, keys, chunk_size, device
        ctx.params = tensors[len(keys):]  # leaves (the model's parameters): the recomputation uses them as they are
        ctx.save_for_backward(X, *tensors[:len(keys)])
        return Phi

    @staticmethod
    def backward(ctx, grad: Tensor):
        X, *state_values = ctx.saved_tensors

        def seeds(features, Xc, yc, rows):
            return [features(Xc)], [grad[rows]]

        return (None, None, None, None, None, None, *_backward_by_chunk(ctx, X, None, state_values, seeds))


class _StreamedStatistics(torch.autograd.Function):
    """This process's (Phi^T Phi, Phi^T y, sum_i k(x_i, x_i) or 0, y^T y) over X [n, d], y [n] (float64) in chunks
    with no autograd graph, for the evidence's gradient over more rows than one chunk; the backward pass rebuilds
    one chunk's graph at a time and backpropagates ``dPhi_c = Phi_c (G_A + G_A^T) + y_c g_b^T`` and the trace's
    gradient into the features' state and the model's parameters.

    One node rather than a checkpointed graph per chunk, for the reason :class:`_ChunkedFeatures` gives: a graph
    per chunk grows the heap with every chunk."""

    @staticmethod
    def forward(ctx, feature_map, prior_diag, keys, chunk_size, device, X, y, *tensors):
        with torch.no_grad():
            sums = chunk_sums(feature_map(dict(zip(keys, tensors[:len(keys)]))).raw, X, y, chunk_size=chunk_size,
                              prior_diag=prior_diag, device=device)
        ctx.feature_map, ctx.prior_diag, ctx.keys = feature_map, prior_diag, keys
        ctx.chunk_size, ctx.device, ctx.params = chunk_size, device, tensors[len(keys):]
        ctx.save_for_backward(X, y, *tensors[:len(keys)])
        return sums

    @staticmethod
    def backward(ctx, grad_A: Tensor, grad_b: Tensor, grad_trace: Tensor, _grad_yy: Tensor):
        X, y, *state_values = ctx.saved_tensors
        G = grad_A + grad_A.T

        def seeds(features, Xc, yc, rows):
            Phi = features.raw(Xc)
            outputs, grads = [Phi], [gram_and_cross_grad(Phi.detach(), G, yc, grad_b)]
            if ctx.prior_diag is not None:
                outputs.append(ctx.prior_diag(Xc).sum().to(CORE))
                grads.append(grad_trace)
            return outputs, grads

        return (None, None, None, None, None, None, None, *_backward_by_chunk(ctx, X, y, state_values, seeds))


def _backward_by_chunk(ctx, X: Tensor, y: Tensor | None, state_values: list[Tensor], seeds) -> list[Tensor | None]:
    """The gradients of a chunked pass's state values and ``ctx.params`` (in that order; None where not required),
    summed over the chunks of X (and y): the features are rebuilt from detached state, and ``seeds(features, Xc,
    yc, rows)`` gives each chunk's outputs and their incoming gradients, backpropagated one chunk at a time."""
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(t.requires_grad) for t in state_values]
        features = ctx.feature_map(dict(zip(ctx.keys, leaves)))
        inputs = [t for t in (*leaves, *ctx.params) if t.requires_grad]
        totals: list[Tensor | None] = [None] * len(inputs)
        start = 0
        for Xc, *rest in chunks_on(ctx.device, ctx.chunk_size, X, *([] if y is None else [y])):
            rows = slice(start, start + Xc.shape[0])
            start = rows.stop
            # an output may not depend on the state: VFF's features of rows inside its box are phi(x) whatever the
            # hyperparameters, so a chunk of such rows has nothing to backpropagate through them
            outputs, grads = seeds(features, Xc, rest[0] if rest else None, rows)
            kept = [i for i, output in enumerate(outputs) if output.requires_grad]
            if not kept or not inputs:
                continue
            # retain_graph: feature_map may build a graph that every chunk shares (GRIEF's eigenpairs)
            parts = torch.autograd.grad([outputs[i] for i in kept], inputs, [grads[i] for i in kept],
                                        retain_graph=True, allow_unused=True)
            totals = [t if g is None else g if t is None else t + g for t, g in zip(totals, parts)]
    given = iter(totals)
    return [next(given) if t.requires_grad else None for t in (*leaves, *ctx.params)]


def _check_engine_options(solver, calibrate_noise) -> None:
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {', '.join(map(repr, SOLVERS))}, got {solver!r}.")
    if calibrate_noise not in CALIBRATION_MODES:
        raise ValueError(f"calibrate_noise must be one of {CALIBRATION_MODES}, got {calibrate_noise!r}.")

"""The weight-space view of a GP (Rasmussen & Williams 2006, Section 2.1) in the form the linear engine streams it.

A Bayesian linear model ``f(x) = phi(x)^T w``, ``w ~ N(0, I)``, ``y = f + eps``, ``eps ~ N(0, sigma^2)``, needs
of its n rows only the sufficient statistics

    A = sum_i phi_i phi_i^T  [r, r],   b = sum_i phi_i y_i  [r],   yy = sum_i y_i^2,   n,

accumulated over row chunks (memory O(chunk x r), never n x n) and summed across processes by ``comm``.
With ``B = I + A / sigma^2 = L_B L_B^T`` and ``c = L_B^{-1} b / sigma^2``:

    log p(y) = -n/2 log(2 pi sigma^2) - log|L_B| - 1/2 (yy / sigma^2 - c^T c)
    w | y ~ N(L_B^{-T} c, B^{-1}),

the *weight posterior* (:class:`WeightPosterior`), from the statistics by Cholesky
(:func:`weight_posterior_cholesky`). The stable path (:func:`weight_posterior_qr`) never forms A: it takes the TSQR of
``[Phi / sigma, y / sigma; I, 0]``, whose R factor holds ``L_B^T``, ``c`` and the residual, so small noise does not
square the condition number.
Everything here is float64 (the r x r core); features come in the caller's dtype.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from scipy.optimize import minimize_scalar
from torch import Tensor
from torch.autograd.function import once_differentiable

from ...device import chunks_on
from ...distributed import LOCAL, Comm, global_count
from ...linalg import CORE, StreamingQR, cholesky, logdet_from_cholesky, qr_r, solve_lower
from ..base import PredictiveFactors

__all__ = ["Statistics", "WeightPosterior", "FeatureMap", "accumulate", "gram_and_cross_grad",
           "weight_posterior_cholesky", "weight_posterior_qr", "held_statistics", "residual_quad", "log_evidence",
           "weight_space_factors", "weight_space_predictive", "evidence_maximising_noise", "held_out_log_density",
           "held_out_maximising_noise", "maximise_over_noise"]

FeatureMap = Callable[[Tensor], Tensor]  # X [c, d] -> Phi [c, r]


@dataclass
class Statistics:
    """Sufficient statistics of a Bayesian linear model over n rows (all float64)."""

    A: Tensor  # [r, r], Phi^T Phi
    b: Tensor  # [r], Phi^T y
    yy: Tensor  # [], y^T y
    n: int
    prior_trace: Tensor  # [], sum_i k(x_i, x_i) when the method supplies it (the trace term), else 0


@dataclass
class WeightPosterior:
    """The weight posterior p(w | y) = N(L_B^{-T} c, (L_B L_B^T)^{-1}) in factored form, with the evidence's data fit
    and traces."""

    L_B: Tensor  # [r, r] lower, L_B L_B^T = I + Phi^T Phi / sigma^2
    c: Tensor  # [r], L_B^{-1} Phi^T y / sigma^2
    quad: Tensor  # [], y^T (Phi Phi^T + sigma^2 I)^{-1} y = yy / sigma^2 - c^T c
    n: int
    feature_trace: Tensor  # [], tr(Phi^T Phi) = sum_i ||phi_i||^2
    prior_trace: Tensor  # [], sum_i k(x_i, x_i) when the method supplies it, else 0

    @property
    def weight_mean(self) -> Tensor:
        """E[w | y] = L_B^{-T} c, [r]."""
        return torch.linalg.solve_triangular(self.L_B.T, self.c.unsqueeze(-1), upper=True).squeeze(-1)


class _GramAndCross(torch.autograd.Function):
    """``(Phi^T Phi, Phi^T y)`` in float64 for a chunk Phi [c, r] of any dtype, y [c] float64, saving only Phi
    itself: the float64 copy of a float32 chunk is made again in the backward pass instead of kept. The backward is
    one product, ``dPhi = Phi (G + G^T) + y g^T``."""

    @staticmethod
    def forward(ctx, Phi: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        ctx.save_for_backward(Phi, y)
        P = Phi.to(CORE)
        return P.T @ P, P.T @ y

    @staticmethod
    def backward(ctx, grad_A: Tensor, grad_b: Tensor):
        Phi, y = ctx.saved_tensors
        return gram_and_cross_grad(Phi, grad_A + grad_A.T, y, grad_b), None


def gram_and_cross_grad(Phi: Tensor, G: Tensor, y: Tensor, g: Tensor) -> Tensor:
    """``dPhi = Phi G + y g^T`` [c, r] in Phi's dtype (computed in float64), the gradient through ``(Phi^T Phi,
    Phi^T y)`` of a chunk Phi [c, r], for a symmetric G [r, r] (``dL/dA + dL/dA^T``), y [c] and g = dL/db [r].

    The product is taken in Phi's own layout: inducing features are ``K_uf^T``, a transposed view, whose product
    with G runs slower than ``G K_uf``, which gives the transpose of the same result since G is symmetric.
    ``y g^T`` joins in place as a rank-one update rather than an [c, r] outer product and a sum."""
    P = Phi.to(CORE)
    grad = (G @ P.T).T if P.T.is_contiguous() else P @ G
    return grad.addr_(y, g).to(Phi.dtype)


def _chunk_statistics(features: FeatureMap, prior_diag: FeatureMap | None, Xc: Tensor, yc: Tensor):
    """(Phi^T Phi, Phi^T y, sum_i k(x_i, x_i) or 0) of one chunk (float64), y_c float64."""
    Phi = features(Xc)  # [c, r]
    A, b = _GramAndCross.apply(Phi, yc.to(CORE))
    trace = prior_diag(Xc).sum().to(CORE) if prior_diag is not None else torch.zeros((), dtype=CORE, device=A.device)
    return A, b, trace


def accumulate(features: FeatureMap, X: Tensor, y: Tensor, *, chunk_size: int, prior_diag: FeatureMap | None = None,
               whitening_factor: Tensor | None = None, comm: Comm = LOCAL, device: torch.device | None = None,
               sums: tuple[Tensor, Tensor, Tensor, Tensor] | None = None) -> Statistics:
    """Sufficient statistics of (X [n, d], y [n]) in chunks of ``chunk_size`` rows, computed on ``device`` (default
    X's), to which host rows are copied chunk by chunk (:func:`gpscale.device.chunks_on`).

    With ``whitening_factor = L`` [r, r] (lower triangular, float64), ``features`` returns raw features ``psi`` and the
    model's features are ``phi = L^{-1} psi``: the statistics are whitened once on the r x r core,
    ``A = L^{-1} (Psi^T Psi) L^{-T}``, instead of solving with L on every row. In float64 this costs half the
    flops of whitening each chunk; the rounding of ``Psi^T Psi`` is amplified by cond(L)^2, so float32 models
    (and tiny noise) should use :func:`weight_posterior_qr`, which whitens row by row.

    Differentiable through ``features`` by autograd over every chunk: for features held in memory (``X`` is Phi
    itself) or small data. A model differentiating its features over many rows passes ``sums`` instead: this
    process's unwhitened (Phi^T Phi, Phi^T y, prior trace, y^T y), from the linear engine's streamed pass, which
    keeps no chunk's graph.
    """
    A, b, trace, yy = sums if sums is not None else chunk_sums(features, X, y, chunk_size=chunk_size,
                                                                prior_diag=prior_diag, device=device)
    A, b, yy, trace = (comm.all_reduce_sum(t) for t in (A, b, yy, trace))
    if whitening_factor is not None:
        A = solve_lower(whitening_factor, solve_lower(whitening_factor, A).T)  # L^{-1} A L^{-T} (A is symmetric)
        b = solve_lower(whitening_factor, b.unsqueeze(-1)).squeeze(-1)
    n = global_count(X.shape[0], comm)
    return Statistics(A=A, b=b, yy=yy, n=n, prior_trace=trace)


def chunk_sums(features: FeatureMap, X: Tensor, y: Tensor, *, chunk_size: int, prior_diag: FeatureMap | None = None,
               device: torch.device | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(Phi^T Phi, Phi^T y, sum_i k(x_i, x_i) or 0, y^T y) over this process's rows, chunk by chunk (float64)."""
    A = b = trace = yy = None
    for Xc, yc in chunks_on(X.device if device is None else device, chunk_size, X, y):
        parts = (*_chunk_statistics(features, prior_diag, Xc, yc), (yc.to(CORE) ** 2).sum())
        A, b, trace, yy = parts if A is None else (A + parts[0], b + parts[1], trace + parts[2], yy + parts[3])
    return A, b, trace, yy


def weight_posterior_cholesky(stats: Statistics, noise: Tensor) -> WeightPosterior:
    """Posterior from the statistics by Cholesky of ``B = I + A / sigma^2`` (fast; fine unless sigma^2 is tiny)."""
    s2 = noise.to(CORE)
    r = stats.A.shape[0]
    B = torch.eye(r, dtype=CORE, device=stats.A.device) + stats.A / s2
    L_B = cholesky(B, what="posterior precision I + Phi^T Phi / sigma^2")
    c = solve_lower(L_B, stats.b.unsqueeze(-1)).squeeze(-1) / s2
    return WeightPosterior(L_B=L_B, c=c, quad=stats.yy / s2 - c @ c, n=stats.n,
                     feature_trace=stats.A.diagonal().sum(), prior_trace=stats.prior_trace)


def weight_posterior_qr(features: FeatureMap, X: Tensor, y: Tensor, noise: Tensor, *, chunk_size: int,
                        prior_diag: FeatureMap | None = None, comm: Comm = LOCAL,
                        device: torch.device | None = None) -> WeightPosterior:
    """Posterior by streamed QR of ``[Phi / sigma, y / sigma; I, 0]``: stable for any noise level. Computed on
    ``device`` (default X's), to which host rows are copied chunk by chunk (:func:`gpscale.device.chunks_on`).

    The R factor [r + 1, r + 1] of that matrix is ``[[L_B^T, c], [0, sqrt(quad)]]``. The prior rows come first,
    ``[I, 0] / sqrt(W)`` on each of the W processes (their stack contributes I to R^T R), so that every factorisation
    is of a matrix of full column rank: rows of features that are linearly dependent (a constant input column makes
    some features equal on every row) would otherwise make a chunk's QR, whose gradient needs a non-zero diagonal
    of R, return NaN gradients.
    """
    device = X.device if device is None else device
    sigma = noise.to(CORE).sqrt()
    qr = StreamingQR()
    feature_trace = prior_trace = torch.zeros((), dtype=CORE, device=device)
    for Xc, yc in chunks_on(device, chunk_size, X, y):
        Phi = features(Xc).to(CORE)
        feature_trace = feature_trace + (Phi**2).sum()
        if prior_diag is not None:
            prior_trace = prior_trace + prior_diag(Xc).sum().to(CORE)
        if qr.R is None:
            r = Phi.shape[1]
            qr.update(torch.eye(r, r + 1, dtype=CORE, device=device) / math.sqrt(comm.world_size))
        qr.update(torch.cat([Phi, yc.to(CORE).unsqueeze(-1)], dim=1) / sigma)
    R = qr.R
    if comm.world_size > 1:  # TSQR across processes: the R of the ranks' stacked R factors
        R = qr_r(comm.all_gather(R))
        feature_trace, prior_trace = comm.all_reduce_sum(feature_trace), comm.all_reduce_sum(prior_trace)
    r = R.shape[1] - 1
    n = global_count(X.shape[0], comm)
    return WeightPosterior(L_B=R[:r, :r].T, c=R[:r, r], quad=R[r, r] ** 2, n=n,
                     feature_trace=feature_trace, prior_trace=prior_trace)


def held_statistics(Phi: Tensor, y: Tensor, *, chunk_size: int, comm: Comm = LOCAL,
                    row_scale: Tensor | None = None) -> Statistics:
    """Sufficient statistics of features Phi [n, r] held in memory and targets y [n] (float64; summed over processes
    by ``comm``), differentiable in Phi through one autograd node for all its chunks (:class:`_HeldGramAndCross`).

    With ``row_scale`` s [n] (float64), those of the rows ``s_i phi_i`` and targets ``s_i y_i``, scaled a chunk at a
    time, without gradients: a noise search that reweights every row at each of its steps then makes no scaled copy
    of Phi."""
    y = y.to(CORE)
    if row_scale is None:
        A, b = _HeldGramAndCross.apply(Phi, y, chunk_size)
    elif torch.is_grad_enabled() and (Phi.requires_grad or y.requires_grad or row_scale.requires_grad):
        raise ValueError("held_statistics takes row_scale without gradients; scale the rows themselves to "
                         "differentiate through the scale.")
    else:
        A, b = _held_sums(Phi, y, chunk_size, row_scale)
        y = y * row_scale
    yy = comm.all_reduce_sum((y**2).sum())
    return Statistics(A=comm.all_reduce_sum(A), b=comm.all_reduce_sum(b), yy=yy, n=global_count(Phi.shape[0], comm),
                      prior_trace=torch.zeros((), dtype=CORE, device=Phi.device))


def residual_quad(Phi: Tensor, y: Tensor, weight_mean: Tensor, noise: Tensor, *, chunk_size: int,
                  comm: Comm = LOCAL) -> Tensor:
    """``y^T (Phi Phi^T + sigma^2 I)^{-1} y`` in residual form, for features Phi [n, r] held in memory:

        quad = (||y - Phi mu||^2 + sigma^2 ||mu||^2) / sigma^2,    mu = E[w | y] [r].

    Both terms are non-negative, so nothing cancels, unlike ``yy / sigma^2 - c^T c`` (two numbers of order
    n / sigma^2 whose difference can be O(1) when sigma^2 is tiny). An error in mu enters only to second order,
    because mu minimises the numerator. Differentiable (:class:`_HeldResidualSum`); rows are cast to float64 one
    chunk at a time, and the residual sum is reduced over processes by ``comm``.
    """
    s2 = noise.to(CORE)
    rss = _HeldResidualSum.apply(Phi, y.to(CORE), weight_mean, chunk_size)
    return (comm.all_reduce_sum(rss) + s2 * (weight_mean @ weight_mean)) / s2


# Sums over the rows of features held in memory. Autograd over chunk views keeps every chunk's gradient alive until
# it joins them into Phi's gradient: a heap of Phi's size (with Phi's float64 copies made chunk by chunk), which glibc
# gives back when it is freed and faults in afresh at the next evaluation. Each sum below is one node, whose
# backward pass writes the gradient of every chunk into one tensor as it goes.
class _HeldGramAndCross(torch.autograd.Function):
    """``(Phi^T Phi, Phi^T y)`` in float64 over features Phi [n, r] of any dtype and y [n] (float64), ``chunk_size``
    rows at a time; backward ``dPhi = Phi (G + G^T) + y g^T`` and ``dy = Phi g`` for incoming gradients (G, g).
    Only Phi and y are saved: no float64 copy of a float32 Phi is kept.

    dPhi is formed in Phi's dtype. That is safe for the residual evidence, which is what differentiates these
    sums: its data fit reaches them only through mu = E[w | y], which minimises that fit, so (G, g) is the log
    determinant's ``-B^{-1} / (2 sigma^2)`` and round-off, and no two large terms of dPhi cancel. (The data fit
    ``yy / sigma^2 - c^T c`` would send ``Phi mu mu^T / sigma^2`` and ``-y mu^T / sigma^2`` here, which do.)"""

    @staticmethod
    def forward(ctx, Phi: Tensor, y: Tensor, chunk_size: int) -> tuple[Tensor, Tensor]:
        ctx.save_for_backward(Phi, y)
        ctx.chunk_size = chunk_size
        return _held_sums(Phi, y, chunk_size)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_A: Tensor | None, grad_b: Tensor | None):
        Phi, y = ctx.saved_tensors
        r = Phi.shape[-1]
        G = torch.zeros(r, r, dtype=CORE, device=Phi.device) if grad_A is None else grad_A + grad_A.T
        g = torch.zeros(r, dtype=CORE, device=Phi.device) if grad_b is None else grad_b
        need_Phi, need_y = ctx.needs_input_grad[:2]
        dPhi = torch.empty_like(Phi) if need_Phi else None
        dy = torch.empty_like(y) if need_y else None
        G_low, g_low = G.to(Phi.dtype), g.to(Phi.dtype)
        for start in range(0, Phi.shape[0], ctx.chunk_size):
            rows = slice(start, start + ctx.chunk_size)
            if need_Phi:
                torch.addmm(torch.outer(y[rows].to(Phi.dtype), g_low), Phi[rows], G_low, out=dPhi[rows])
            if need_y:
                dy[rows] = Phi[rows].to(CORE) @ g
        return dPhi, dy, None


def _held_sums(Phi: Tensor, y: Tensor, chunk_size: int, row_scale: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``(Phi^T Phi, Phi^T y)`` in float64 over Phi [n, r] and y [n] (float64), ``chunk_size`` rows at a time; with
    ``row_scale`` s [n], over the rows ``s_i phi_i`` and ``s_i y_i``."""
    r = Phi.shape[-1]
    A = torch.zeros(r, r, dtype=CORE, device=Phi.device)
    b = torch.zeros(r, dtype=CORE, device=Phi.device)
    for start in range(0, Phi.shape[0], chunk_size):
        rows = slice(start, start + chunk_size)
        P, yc = Phi[rows].to(CORE), y[rows]
        if row_scale is not None:
            P, yc = P * row_scale[rows].unsqueeze(-1), yc * row_scale[rows]
        A.addmm_(P.T, P)
        b.addmv_(P.T, yc)
    return A, b


class _HeldResidualSum(torch.autograd.Function):
    """``||y - Phi mu||^2`` in float64 over features Phi [n, r] of any dtype, y [n] and mu [r] (float64), ``chunk_size``
    rows at a time; backward ``dPhi = -2 g e mu^T``, ``dy = 2 g e`` and ``dmu = -2 g Phi^T e`` with the residuals
    ``e = y - Phi mu``, formed again chunk by chunk."""

    @staticmethod
    def forward(ctx, Phi: Tensor, y: Tensor, weight_mean: Tensor, chunk_size: int) -> Tensor:
        ctx.save_for_backward(Phi, y, weight_mean)
        ctx.chunk_size = chunk_size
        rss = torch.zeros((), dtype=CORE, device=Phi.device)
        for Pc, yc in zip(Phi.split(chunk_size), y.split(chunk_size)):
            rss += ((yc - Pc.to(CORE) @ weight_mean) ** 2).sum()
        return rss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        Phi, y, mu = ctx.saved_tensors
        need_Phi, need_y, need_mu = ctx.needs_input_grad[:3]
        dPhi = torch.empty_like(Phi) if need_Phi else None
        dy = torch.empty_like(y) if need_y else None
        dmu = torch.zeros_like(mu) if need_mu else None
        for start in range(0, Phi.shape[0], ctx.chunk_size):
            rows = slice(start, start + ctx.chunk_size)
            P = Phi[rows].to(CORE)
            e = 2 * grad * (y[rows] - P @ mu)  # the gradient of the chunk's sum with respect to its residuals
            if need_Phi:
                torch.outer(e.to(Phi.dtype), -mu.to(Phi.dtype), out=dPhi[rows])
            if need_y:
                dy[rows] = e
            if need_mu:
                dmu.addmv_(P.T, e, alpha=-1)
        return dPhi, dy, dmu, None


def log_evidence(post: WeightPosterior, noise: Tensor) -> Tensor:
    """``log N(y | 0, Phi Phi^T + sigma^2 I)`` (float64 scalar)."""
    return -0.5 * post.n * (math.log(2 * math.pi) + torch.log(noise.to(CORE))) \
        - 0.5 * logdet_from_cholesky(post.L_B) - 0.5 * post.quad


def weight_space_factors(L_B: Tensor, weight_mean: Tensor, Phi: Tensor) -> PredictiveFactors:
    """``phi(x*)^T w`` under the posterior N(weight_mean, (L_B L_B^T)^{-1}) at features Phi [c, r] (float64): mean
    ``Phi weight_mean`` and covariance ``U^T U`` with ``U = L_B^{-1} Phi^T`` [r, c], no prior term."""
    Phi = Phi.to(CORE)
    return PredictiveFactors(Phi @ weight_mean, None, solve_lower(L_B, Phi.T))


def weight_space_predictive(L_B: Tensor, weight_mean: Tensor, Phi: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and variance [c] of ``phi(x*)^T w`` under the posterior N(weight_mean, (L_B L_B^T)^{-1}),
    for features Phi [c, r]."""
    mean, _, U, _ = weight_space_factors(L_B, weight_mean, Phi)
    return mean, (U * U).sum(0)  # ||L_B^{-1} phi||^2 >= 0 by construction


def evidence_maximising_noise(stats: Statistics, lower: float, upper: float, grid_points: int = 400) -> float:
    """``argmax_{sigma^2 in [lower, upper]} log N(y | 0, Phi Phi^T + sigma^2 I)`` with the features fixed.

    From the streamed statistics ``A = Phi^T Phi = V diag(lam) V^T``, ``b = Phi^T y`` and ``yy``, with
    ``g = V^T b``, every evaluation is O(r):

        log p = -n/2 log(2 pi sigma^2) - 1/2 sum_i log(1 + lam_i / sigma^2)
                - 1/2 (yy / sigma^2 - sum_i g_i^2 / (sigma^2 (sigma^2 + lam_i))).
    """
    lam, V = torch.linalg.eigh(stats.A.to(CORE))
    lam = lam.clamp_min(0.0).cpu().numpy()  # A is a Gram matrix; negative eigenvalues are round-off
    g2 = ((V.T @ stats.b.to(CORE)) ** 2).cpu().numpy()
    yy, n = float(stats.yy), stats.n

    def log_evidence_at(s2: float) -> float:
        return -0.5 * (n * math.log(2 * math.pi * s2) + np.log1p(lam / s2).sum()
                       + yy / s2 - (g2 / (s2 * (s2 + lam))).sum())

    return maximise_over_noise(log_evidence_at, lower, upper, grid_points)


def held_out_log_density(y: Tensor, mean: Tensor, var: Tensor, comm: Comm = LOCAL) -> float:
    """``sum_h log N(y_h | mean_h, var_h)`` over every process's held-out rows (vectors [n_h], float64)."""
    return float(comm.all_reduce_sum(-0.5 * ((y - mean) ** 2 / var + var.log() + math.log(2 * math.pi)).sum()))


def held_out_maximising_noise(stats: Statistics, Phi_held: Tensor, y_held: Tensor, lower: float, upper: float, *,
                              fixed_mean: Tensor | None = None, extra: Tensor | None = None,
                              comm: Comm = LOCAL) -> float:
    """``argmax_{sigma^2 in [lower, upper]} sum_h log N(y_h | mu_h, v_h + sigma^2)`` over held-out rows with
    features Phi_held [n_h, r] and targets y_held [n_h], under the weight posterior at sigma^2 from the statistics
    of other rows. With ``A = V diag(lam) V^T``, ``g = V^T b`` and ``P = Phi_held V``, every evaluation is
    O(n_h r):

        mu_h = sum_j P_hj g_j / (lam_j + sigma^2),     v_h = sum_j P_hj^2 sigma^2 / (lam_j + sigma^2) + extra_h,

    the posterior mean and variance of ``phi_h^T w`` (``w | y ~ N(V diag(1 / (lam + sigma^2)) g,
    V diag(sigma^2 / (lam + sigma^2)) V^T)``); ``fixed_mean`` [n_h] replaces mu_h where the predictive mean does not
    take the calibrated noise, and ``extra`` [n_h] is a latent variance the features leave out."""
    lam, V = torch.linalg.eigh(stats.A.to(CORE))
    lam = lam.clamp_min(0.0)  # A is a Gram matrix; negative eigenvalues are round-off
    g, P = V.T @ stats.b.to(CORE), Phi_held.to(CORE) @ V
    y_held = y_held.to(CORE)
    extra = torch.zeros_like(y_held) if extra is None else extra.to(CORE)

    def log_density_at(s2: float) -> float:
        mean = P @ (g / (lam + s2)) if fixed_mean is None else fixed_mean
        return held_out_log_density(y_held, mean, (P * P) @ (s2 / (lam + s2)) + extra + s2, comm)

    return maximise_over_noise(log_density_at, lower, upper, grid_points=60)


def maximise_over_noise(objective: Callable[[float], float], lower: float, upper: float,
                        grid_points: int = 400) -> float:
    """``argmax_{sigma^2 in [lower, upper]} objective(sigma^2)``: a grid of ``grid_points`` in log sigma^2, then
    Brent's method between the best point's neighbours. Evidences in sigma^2 can have more than one local maximum,
    and the grid keeps the search off a poor one."""

    def negative(log_s2: float) -> float:
        return -objective(math.exp(log_s2))

    grid = np.linspace(math.log(lower), math.log(upper), grid_points)
    values = [negative(t) for t in grid]
    best = int(np.argmin(values))
    refined = minimize_scalar(negative, bounds=(grid[max(best - 1, 0)], grid[min(best + 1, grid_points - 1)]),
                              method="bounded", options={"xatol": 1e-10})
    return math.exp(min((refined.fun, refined.x), (values[best], grid[best]))[1])

r"""Iterative exact-GP inference from matrix products alone (BBMM: Gardner et al., 2018; Wang et al., 2019) and the
LOVE predictive-variance cache (Pleiss et al., 2018).

The kernel matrix K [n, n] (symmetric positive semi-definite) is never formed. An operator (see
:class:`RowPartitioned`) gives products with it, its diagonal and some of its columns, each process holding the
rows ``[offset, offset + n_r)``. Every n-sized vector or matrix here is row-partitioned the same way ([n_r, t] on
each rank), and every inner product is summed over the ranks, so that one process and W processes give the same
numbers to round-off. The noisy matrix is ``Khat = K + sigma^2 I`` (``noise = sigma^2 > 0``).

Preconditioner. The greedy pivoted Cholesky factor (Harbrecht et al., 2012) L [n, k], ``L L^T ~ K``, gives

    P = L L^T + sigma^2 I,
    P^{-1} B = (B - L C^{-1} L^T B / sigma^2) / sigma^2,      C = I_k + L^T L / sigma^2      (Woodbury),
    log|P| = n log sigma^2 + log|C|                                                        (determinant lemma),

and draws ``z = L e_1 + sigma e_2 ~ N(0, P)`` for e_1 ~ N(0, I_k), e_2 ~ N(0, I_n).

Solves. Batched preconditioned conjugate gradients (mBCG) solve ``Khat X = B`` for t columns at once, one product
with K per iteration for all of them. With step sizes alpha_j and direction updates beta_j (``d_{j+1} = z_{j+1} +
beta_j d_j``), the run on a column b is Lanczos in disguise: the tridiagonal

    T[0, 0] = 1 / alpha_0,   T[j, j] = 1 / alpha_j + beta_{j-1} / alpha_{j-1},   T[j, j+1] = sqrt(beta_j) / alpha_j

is the Lanczos tridiagonal of ``P^{-1/2} Khat P^{-1/2}`` started at ``P^{-1/2} b / ||P^{-1/2} b||`` (Saad, 2003,
sec. 6.7.3), with ``||P^{-1/2} b||^2 = b^T P^{-1} b``. For any f, ``b^T P^{-1/2} f(P^{-1/2} Khat P^{-1/2})
P^{-1/2} b ~ (b^T P^{-1} b) e_1^T f(T) e_1`` (Gauss quadrature; exact for f(x) = 1/x at convergence).

Log-determinant (stochastic Lanczos quadrature). With probes z_i ~ N(0, P), i = 1..t,

    log|Khat| = log|P| + log|P^{-1} Khat|,
    log|P^{-1} Khat| = E[u^T log(P^{-1/2} Khat P^{-1/2}) u],  u = P^{-1/2} z ~ N(0, I)
                     ~ (1/t) sum_i (z_i^T P^{-1} z_i) e_1^T log(T_i) e_1.

One mBCG run on ``[y, z_1 .. z_t]`` gives ``Khat^{-1} y``, the T_i and, for the gradient,
``w_i = Khat^{-1} z_i`` and ``q_i = P^{-1} z_i``: since E[w q^T] = Khat^{-1} E[z z^T] P^{-1} = Khat^{-1},

    d log|Khat| = tr(Khat^{-1} dKhat) ~ (1/t) sum_i w_i^T dKhat q_i      (unbiased),

which is the whole derivative (log|P|'s included); see :func:`solve_and_logdet`.

Predictive variances (LOVE). k steps of Lanczos on Khat with full reorthogonalisation give an orthonormal Q [n, k]
and ``T = Q^T Khat Q`` [k, k]. With ``T = L_T L_T^T`` and ``R = Q L_T^{-T}``, ``R R^T = Q T^{-1} Q^T``, which
equals Khat^{-1} when k = n and otherwise satisfies ``Q T^{-1} Q^T <= Khat^{-1}`` (Loewner order, because
``Q (Q^T A Q)^{-1} Q^T`` is the A-orthogonal projection onto span Q, in the A^{-1} inner product); so
``||R^T k_*||^2`` never exceeds ``k_*^T Khat^{-1} k_*`` and grows with k (the Krylov spaces are nested), and the
variance ``k_** - ||R^T k_*||^2`` errs on the side of too large.

Nothing here is differentiated: everything runs without autograd, and the gradient is built by the caller from the
returned vectors. The small cores (k x k matrices, tridiagonals, the CG coefficients) are float64
(:data:`gpscale.linalg.CORE`); n-sized vectors stay in the operator's dtype, their inner products accumulated in
float64.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from .distributed import Comm
from .linalg import CORE, NumericalWarning, cho_solve, cholesky, logdet_from_cholesky

__all__ = [
    "CGResult",
    "LanczosVariance",
    "Preconditioner",
    "RowPartitioned",
    "SolveAndLogdet",
    "cg",
    "lanczos_logdet",
    "pivoted_cholesky",
    "solve_and_logdet",
]


class RowPartitioned(Protocol):
    """A symmetric PSD K [n, n] known through products, each process holding rows ``[offset, offset + n_local)``.

    ``matmul``, ``columns`` and the communicator's reductions are collective: every rank calls them together."""

    comm: Comm
    offset: int
    n_local: int
    n_global: int
    dtype: torch.dtype
    device: torch.device

    def matmul(self, V: Tensor) -> Tensor:
        """This rank's rows of ``K V`` [n_r, t], for V [n_r, t] this rank's rows of a global [n, t]."""

    def diagonal(self) -> Tensor:
        """This rank's rows of ``diag(K)`` [n_r]."""

    def columns(self, index: Tensor) -> Tensor:
        """``K[this rank's rows, index]`` [n_r, k] for ``index`` [k] of global row indices."""


def _noise(noise: float | Tensor, dtype: torch.dtype, device: torch.device) -> Tensor:
    """sigma^2 as a detached 0-dim tensor of ``dtype`` (a python float converted once, straight to ``dtype``)."""
    return torch.as_tensor(noise, dtype=dtype, device=device).detach()


def _khat(op: RowPartitioned, noise: Tensor, V: Tensor) -> Tensor:
    """This rank's rows of ``(K + sigma^2 I) V`` [n_r, t]."""
    return op.matmul(V) + noise * V


def _dots(comm: Comm, *pairs: tuple[Tensor, Tensor]) -> Tensor:
    """``[a_c^T b_c]`` [len(pairs), t] float64 for each pair of row-partitioned (A, B) [n_r, t], summed over ranks
    in one reduction. The products are accumulated in float64 whatever the vectors' dtype."""
    local = torch.stack([(A * B).sum(0, dtype=CORE) for A, B in pairs])
    return comm.all_reduce_sum(local)


def _default_tol(dtype: torch.dtype) -> float:
    """A relative tolerance a little above the round-off of ``dtype`` (2e-13 in float64, 1e-4 in float32)."""
    return 1e3 * torch.finfo(dtype).eps


def _global_normal(op: RowPartitioned, rows: int, t: int, generator: torch.Generator) -> Tensor:
    """This rank's rows of a global [rows, t] standard normal matrix drawn from ``generator`` in ``op.dtype``: every
    rank draws all of it and keeps its own rows, so the draws do not depend on the number of processes."""
    draws = torch.randn(rows, t, generator=generator, dtype=op.dtype, device=generator.device)
    return draws[op.offset:op.offset + op.n_local].to(op.device)


# ------------------------------------------------------------------------------------------------ pivoted Cholesky


def _global_pivot(residual: Tensor, chosen: Tensor, op: RowPartitioned) -> tuple[float, int, float]:
    """The largest remaining residual diagonal over all ranks (ties to the lowest global index), its global index,
    and the trace of the residual, from one all-gather of each rank's (max, index, trace)."""
    candidates = residual.masked_fill(chosen, -math.inf)
    if op.n_local:
        local = int(candidates.argmax())  # the first of equal maxima: the lowest index
        value, index = candidates[local].to(CORE), float(op.offset + local)
    else:
        value, index = torch.tensor(-math.inf, dtype=CORE, device=residual.device), math.inf
    mine = torch.stack([value, torch.tensor(index, dtype=CORE, device=residual.device),
                        residual.sum(dtype=CORE)]).unsqueeze(0)
    every = op.comm.all_gather(mine).cpu()  # [W, 3], the same on every rank
    best = every[:, 0].max()
    pivot = every[every[:, 0] == best, 1].min()
    return float(best), int(pivot) if math.isfinite(pivot) else -1, float(every[:, 2].sum())


@torch.no_grad()
def pivoted_cholesky(op: RowPartitioned, rank: int, *, tol: float | None = None) -> Tensor:
    """This rank's rows of the greedy partial pivoted Cholesky factor L [n_r, k] of K, ``L L^T ~ K``, k <= rank.

    Step m picks the pivot p with the largest residual diagonal ``d_p = K_pp - ||L_p||^2`` over all ranks (ties to
    the lowest global index, so the factor is the same on any number of processes) and appends the column

        l = (K[:, p] - L L_p^T) / sqrt(d_p),        d <- d - l^2.

    It stops early once ``trace(K - L L^T) = sum(d) <= tol * trace(K)`` (default ``1e3 * eps`` of the operator's
    dtype) or no positive residual is left; then trace(K - L L^T) is the smallest the greedy choice reaches.
    Cost: O(n k^2) flops, k calls of ``op.columns`` with one index each, and two small collectives a step.
    """
    tol = _default_tol(op.dtype) if tol is None else tol
    rank = min(rank, op.n_global)
    residual = op.diagonal().clone()  # [n_r]
    chosen = torch.zeros(op.n_local, dtype=torch.bool, device=op.device)
    L = torch.zeros(op.n_local, rank, dtype=op.dtype, device=op.device)
    trace = None
    for m in range(rank):
        value, pivot, residual_trace = _global_pivot(residual, chosen, op)
        trace = residual_trace if trace is None else trace  # the first residual is K's diagonal
        if value <= 0 or residual_trace <= tol * trace:
            return L[:, :m]
        local = pivot - op.offset
        owner = 0 <= local < op.n_local
        row = L[local, :m] if owner else L.new_zeros(m)
        row = op.comm.all_reduce_sum(row)  # L_p, from the rank that holds row p
        column = op.columns(torch.tensor([pivot], device=op.device))[:, 0]
        l = (column - L[:, :m] @ row) / math.sqrt(value)
        # exact arithmetic gives 0 at the pivots already taken and sqrt(d_p) at p: set them, so that L is triangular
        # in pivot order and the taken rows leave no round-off behind in the residual
        l.masked_fill_(chosen, 0.0)
        if owner:
            l[local] = math.sqrt(value)
        L[:, m] = l
        residual -= l * l
        if owner:
            residual[local] = 0.0
            chosen[local] = True
    return L


# ---------------------------------------------------------------------------------------------- preconditioner


class Preconditioner:
    """``P = L L^T + sigma^2 I`` for a row-partitioned L [n_r, k] (k may be 0, then P = sigma^2 I); see the module
    docstring for the formulas. :meth:`from_operator` builds L by :func:`pivoted_cholesky`."""

    def __init__(self, op: RowPartitioned, noise: float | Tensor, factor: Tensor) -> None:
        self.op = op
        self.factor = factor  # L [n_r, k]
        self.noise = _noise(noise, op.dtype, op.device)
        self.noise_core = _noise(noise, CORE, op.device)
        k = factor.shape[1]
        gram = op.comm.all_reduce_sum(factor.mT.to(CORE) @ factor.to(CORE))  # L^T L [k, k]
        capacitance = torch.eye(k, dtype=CORE, device=op.device) + gram / self.noise_core
        # C is I plus a PSD matrix: positive definite for any L, its smallest eigenvalue at least 1
        self.capacitance_factor = cholesky(capacitance, what="preconditioner capacitance") if k else capacitance

    @classmethod
    def from_operator(cls, op: RowPartitioned, noise: float | Tensor, rank: int, *,
                      tol: float | None = None) -> Preconditioner:
        """The preconditioner of the rank-``rank`` pivoted Cholesky factor of K (:func:`pivoted_cholesky`)."""
        return cls(op, noise, pivoted_cholesky(op, rank, tol=tol))

    @property
    def rank(self) -> int:
        """k, the number of columns of L."""
        return self.factor.shape[1]

    @torch.no_grad()
    def solve(self, B: Tensor) -> Tensor:
        """This rank's rows of ``P^{-1} B`` [n_r, t] for B [n_r, t]:
        ``(B - L C^{-1} L^T B / sigma^2) / sigma^2`` (one k x t all-reduce)."""
        if not self.rank:
            return B / self.noise
        LtB = self.op.comm.all_reduce_sum(self.factor.mT.to(CORE) @ B.to(CORE))  # [k, t]
        S = cho_solve(self.capacitance_factor, LtB) / self.noise_core
        return (B - self.factor @ S.to(B.dtype)) / self.noise

    def logdet(self) -> Tensor:
        """``log|P| = n log sigma^2 + log|C|``, a float64 scalar."""
        log_capacitance = logdet_from_cholesky(self.capacitance_factor) if self.rank else 0.0
        return self.op.n_global * self.noise_core.log() + log_capacitance

    @torch.no_grad()
    def sample(self, t: int, generator: torch.Generator) -> Tensor:
        """This rank's rows of t draws from N(0, P) [n_r, t]: ``L e_1 + sigma e_2`` with ``e_1 = randn(k, t)`` then
        ``e_2 = randn(n, t)`` from ``generator`` (on its device, in the operator's dtype), every rank drawing all
        of e_2 and keeping its rows, so the draws are the same on any number of processes (O(n t) memory)."""
        e1 = torch.randn(self.rank, t, generator=generator, dtype=self.op.dtype, device=generator.device)
        e2 = _global_normal(self.op, self.op.n_global, t, generator)
        return self.factor @ e1.to(self.op.device) + self.noise.sqrt() * e2


# ------------------------------------------------------------------------------------------------------- mBCG


@dataclass
class CGResult:
    """What :func:`cg` returns.

    solution:        X [n_r, t], this rank's rows of the approximate ``Khat^{-1} B``.
    iterations:      the number of products with K (iterations of the longest-running column).
    residual:        [t] float64, each column's relative residual ``||b - Khat x|| / ||b||`` as the CG recurrence
                     tracks it (0 for a zero column).
    preconditioned:  ``P^{-1} B`` [n_r, t] (B itself without a preconditioner), the first CG search directions.
    rhs_norms:       [t] float64, ``b^T P^{-1} b``: the squared norm of the Lanczos start vector ``P^{-1/2} b``.
    tridiagonal:     with ``lanczos=True``, [t, m, m] float64 with m = ``iterations``: column c's Lanczos
                     tridiagonal in its leading ``lanczos_steps[c]`` rows and columns, padded with the identity,
                     decoupled from it, so that ``e_1^T f(T) e_1`` is that of the leading block for every f (and
                     ``f(1) = log 1 = 0`` for the padding's eigenvalues). None otherwise.
    lanczos_steps:   with ``lanczos=True``, [t] long: the iterations column c ran before it converged (froze).
    """

    solution: Tensor
    iterations: int
    residual: Tensor
    preconditioned: Tensor
    rhs_norms: Tensor
    tridiagonal: Tensor | None = None
    lanczos_steps: Tensor | None = None


def _lanczos_tridiagonals(alphas: Tensor, betas: Tensor, steps: Tensor) -> Tensor:
    """The Lanczos tridiagonals [t, m, m] float64 from the CG coefficients alpha, beta [t, m] of each column's
    first ``steps`` [t] iterations (see :class:`CGResult` for the padding)."""
    m = alphas.shape[1]
    own = torch.arange(m, device=alphas.device) < steps.unsqueeze(1)  # [t, m]
    alphas = torch.where(own, alphas, 1.0)  # the padding is never divided by
    betas = torch.where(own, betas, 0.0)
    diagonal = 1.0 / alphas
    diagonal[:, 1:] += betas[:, :-1] / alphas[:, :-1]
    diagonal = torch.where(own, diagonal, 1.0)
    # T[j, j+1] couples two of the column's own steps only when j + 1 < steps
    off = torch.where(own[:, 1:], betas[:, :-1].sqrt() / alphas[:, :-1], 0.0)
    return torch.diag_embed(diagonal) + torch.diag_embed(off, 1) + torch.diag_embed(off, -1)


@torch.no_grad()
def cg(op: RowPartitioned, noise: float | Tensor, B: Tensor, *, preconditioner: Preconditioner | None = None,
       tol: float = 1e-4, max_iterations: int = 1000, lanczos: bool = False) -> CGResult:
    """Solve ``(K + sigma^2 I) X = B`` for B [n_r, t] by batched preconditioned conjugate gradients (mBCG) from
    X = 0: one ``op.matmul`` and one preconditioner solve per iteration for all columns, and two all-reduces of
    2t float64 numbers.

    A column whose relative residual ``||r|| / ||b||`` reaches ``tol`` is frozen: its step sizes become 0, so its
    solution and residual no longer change (and its Lanczos tridiagonal uses its own iterations only). The run
    ends when every column is frozen, or after ``max_iterations`` with a :class:`NumericalWarning`. With
    ``lanczos=True`` the result carries each column's Lanczos tridiagonal (see the module docstring and
    :class:`CGResult`). Each iteration reads one boolean on the host (whether a column is still running).
    """
    comm = op.comm
    sigma2 = _noise(noise, op.dtype, op.device)
    precondition = preconditioner.solve if preconditioner is not None else (lambda V: V)
    X = torch.zeros_like(B)
    R = B.clone()
    Z = precondition(R)
    preconditioned = Z
    D = Z
    rz, rr = _dots(comm, (R, Z), (R, R))  # [t] each
    rhs_norms = rz.clone()
    b_norms = rr.sqrt()
    scale = torch.where(b_norms > 0, b_norms, 1.0)
    residual = b_norms / scale
    active = residual > tol
    alphas, betas, steps = [], [], torch.zeros(B.shape[1], dtype=torch.long, device=B.device)
    iterations = 0
    while iterations < max_iterations and bool(active.any()):
        V = _khat(op, sigma2, D)
        (dKd,) = _dots(comm, (D, V))
        alpha = torch.where(active, rz / torch.where(active, dKd, 1.0), 0.0)  # frozen columns take no step
        X += D * alpha.to(B.dtype)
        R = R - V * alpha.to(B.dtype)  # not in place: without a preconditioner Z and D share R's memory
        Z = precondition(R)
        rz_new, rr = _dots(comm, (R, Z), (R, R))
        beta = torch.where(active, rz_new / torch.where(active, rz, 1.0), 0.0)
        D = Z + D * beta.to(B.dtype)
        rz = torch.where(active, rz_new, rz)
        alphas.append(alpha)
        betas.append(beta)
        steps += active
        iterations += 1
        residual = torch.where(active, rr.sqrt() / scale, residual)
        active = active & (residual > tol)
    if bool(active.any()):
        warnings.warn(
            f"Conjugate gradients stopped after {iterations} iterations (max_iterations) with {int(active.sum())} of "
            f"{B.shape[1]} columns above tol = {tol:.1e}: the largest relative residual is "
            f"{float(residual.max()):.2e}. Raise max_iterations, loosen tol, or raise the preconditioner's rank.",
            NumericalWarning, stacklevel=2)
    tridiagonal = None
    if lanczos:
        shape = (B.shape[1], iterations)
        empty = torch.zeros(shape, dtype=CORE, device=B.device)
        tridiagonal = _lanczos_tridiagonals(torch.stack(alphas, 1) if alphas else empty,
                                            torch.stack(betas, 1) if betas else empty, steps)
    return CGResult(X, iterations, residual, preconditioned, rhs_norms, tridiagonal, steps if lanczos else None)


# -------------------------------------------------------------------------------------------- log-determinant


def lanczos_logdet(result: CGResult, preconditioner: Preconditioner | None = None,
                   columns: slice | Tensor | None = None) -> Tensor:
    """Stochastic Lanczos quadrature for ``log|Khat|`` (float64 scalar) from a ``cg(..., lanczos=True)`` run whose
    ``columns`` (default all) were probes z_i ~ N(0, P) (N(0, I) without a preconditioner, where log|P| = 0):

        log|Khat| ~ log|P| + (1/t) sum_i (z_i^T P^{-1} z_i) e_1^T log(T_i) e_1,

    each ``e_1^T log(T) e_1 = sum_j U[0, j]^2 log(lambda_j)`` from the eigendecomposition ``T = U diag(lambda) U^T``.
    Pass the same preconditioner the run used. The estimate is unbiased up to the quadrature error (which
    vanishes as the run converges); its standard deviation falls as 1 / sqrt(t), and with P close to Khat."""
    if result.tridiagonal is None:
        raise ValueError("lanczos_logdet needs the tridiagonals: run cg(..., lanczos=True).")
    selected = slice(None) if columns is None else columns
    T, weights = result.tridiagonal[selected], result.rhs_norms[selected]
    if T.shape[0] == 0:
        raise ValueError("lanczos_logdet needs at least one probe column.")
    if T.shape[-1]:
        eigenvalues, eigenvectors = torch.linalg.eigh(T)
        # T is positive definite in exact arithmetic (Khat is): a non-positive Ritz value is round-off
        logs = eigenvalues.clamp_min(torch.finfo(CORE).tiny).log()
        quadratures = (eigenvectors[:, 0, :] ** 2 * logs).sum(-1)  # e_1^T log(T) e_1, [t]
    else:
        quadratures = torch.zeros_like(weights)
    estimate = (weights * quadratures).mean()
    return estimate + preconditioner.logdet() if preconditioner is not None else estimate


@dataclass
class SolveAndLogdet:
    """What :func:`solve_and_logdet` returns (every n-sized tensor this rank's rows).

    solution:              ``Khat^{-1} Y`` [n_r, s].
    inv_quad:              ``y_c^T Khat^{-1} y_c`` [s] float64, summed over ranks.
    logdet:                the stochastic estimate of ``log|Khat|``, a float64 scalar.
    probes:                Z [n_r, t], z_i ~ N(0, P) (N(0, I) without a preconditioner).
    probe_solutions:       W = Khat^{-1} Z [n_r, t].
    probe_preconditioned:  Q = P^{-1} Z [n_r, t] (Z without a preconditioner).
    cg:                    the mBCG run on ``[Y, Z]``.
    """

    solution: Tensor
    inv_quad: Tensor
    logdet: Tensor
    probes: Tensor
    probe_solutions: Tensor
    probe_preconditioned: Tensor
    cg: CGResult


@torch.no_grad()
def solve_and_logdet(op: RowPartitioned, noise: float | Tensor, Y: Tensor, *, num_probes: int,
                     generator: torch.Generator, preconditioner: Preconditioner | None = None, tol: float = 1e-4,
                     max_iterations: int = 1000) -> SolveAndLogdet:
    """One mBCG run on ``[Y, z_1 .. z_t]`` (Y [n_r, s], t = ``num_probes`` probes from ``generator``, see
    :meth:`Preconditioner.sample`) for what an exact GP's marginal likelihood and its gradient need:

        log p(y) = -1/2 y^T Khat^{-1} y - 1/2 log|Khat| - n/2 log(2 pi),
        d/dtheta: 1/2 alpha^T dKhat alpha - 1/2 (1/t) sum_i w_i^T dKhat q_i,

    with alpha = ``solution``, w_i = ``probe_solutions[:, i]`` and q_i = ``probe_preconditioned[:, i]``; the probe
    term is unbiased for ``tr(Khat^{-1} dKhat)`` because E[w q^T] = Khat^{-1}."""
    if preconditioner is not None:
        Z = preconditioner.sample(num_probes, generator)
    else:
        Z = _global_normal(op, op.n_global, num_probes, generator)
    s = Y.shape[1]
    run = cg(op, noise, torch.cat([Y, Z], dim=1), preconditioner=preconditioner, tol=tol,
             max_iterations=max_iterations, lanczos=True)
    solution = run.solution[:, :s]
    (inv_quad,) = _dots(op.comm, (Y, solution))
    logdet = lanczos_logdet(run, preconditioner, columns=slice(s, None))
    return SolveAndLogdet(solution, inv_quad, logdet, Z, run.solution[:, s:], run.preconditioned[:, s:], run)


# ---------------------------------------------------------------------------------------- predictive variances


class LanczosVariance:
    """The LOVE cache: ``R`` [n_r, k] with ``R R^T = Q T^{-1} Q^T ~ Khat^{-1}`` from k steps of Lanczos on Khat
    started at ``start`` [n_r] (with full reorthogonalisation, twice a step), so that a predictive variance is
    ``k_** - ||R^T k_*||^2`` at the cost of one k x c all-reduce.

    Accuracy (module docstring): exact when k = n; otherwise ``||R^T k_*||^2 <= k_*^T Khat^{-1} k_*``, growing
    with k, exact for k_* in the Krylov space ``span{b, Khat b, .., Khat^{k-1} b}``. The run stops early, with
    fewer columns, when the next Lanczos vector's norm beta falls to ``tol`` (default ``1e3 * eps``) times the
    largest diagonal of T: the Krylov space is then invariant, and Khat^{-1} exact on it.
    """

    @torch.no_grad()
    def __init__(self, op: RowPartitioned, noise: float | Tensor, start: Tensor, rank: int, *,
                 tol: float | None = None) -> None:
        self.op = op
        tol = _default_tol(op.dtype) if tol is None else tol
        sigma2 = _noise(noise, op.dtype, op.device)
        rank = min(rank, op.n_global)
        q = start.reshape(-1, 1)
        norm = _dots(op.comm, (q, q))[0, 0].sqrt()
        if not norm > 0:
            raise ValueError("LanczosVariance needs a non-zero start vector.")
        q = q / norm.to(op.dtype)
        Q = torch.zeros(op.n_local, rank, dtype=op.dtype, device=op.device)
        alphas, betas = [], []
        for j in range(rank):
            Q[:, j:j + 1] = q
            v = _khat(op, sigma2, q)
            alpha = _dots(op.comm, (q, v))[0, 0]
            v = v - alpha.to(op.dtype) * q
            if betas:
                v = v - betas[-1].to(op.dtype) * Q[:, j - 1:j]
            for _ in range(2):  # Gram-Schmidt twice keeps Q orthonormal to working precision
                coefficients = op.comm.all_reduce_sum(Q[:, :j + 1].mT.to(CORE) @ v.to(CORE))
                v = v - Q[:, :j + 1] @ coefficients.to(op.dtype)
            alphas.append(alpha)
            if j == rank - 1:
                break
            beta = _dots(op.comm, (v, v))[0, 0].sqrt()
            if beta <= tol * torch.stack(alphas).abs().max():
                break
            betas.append(beta)
            q = v / beta.to(op.dtype)
        k = len(alphas)
        self.basis = Q[:, :k]  # Q [n_r, k]
        off = torch.stack(betas) if betas else torch.zeros(0, dtype=CORE, device=op.device)
        self.tridiagonal = (torch.diag_embed(torch.stack(alphas)) + torch.diag_embed(off, 1)
                            + torch.diag_embed(off, -1))  # T [k, k] float64
        self.tridiagonal_factor = cholesky(self.tridiagonal, what="Lanczos tridiagonal")  # L_T

    @property
    def rank(self) -> int:
        """k, the Lanczos steps taken (fewer than asked when the Krylov space became invariant)."""
        return self.basis.shape[1]

    @property
    def factor(self) -> Tensor:
        """``R = Q L_T^{-T}`` [n_r, k] in the operator's dtype."""
        inverse = torch.linalg.solve_triangular(self.tridiagonal_factor,
                                                torch.eye(self.rank, dtype=CORE, device=self.basis.device),
                                                upper=False)
        return self.basis @ inverse.mT.to(self.basis.dtype)

    @torch.no_grad()
    def project(self, Kxs: Tensor) -> Tensor:
        """``R^T K_x*`` [k, c] float64 for Kxs [n_r, c] (this rank's rows of k(X, x_*)), summed over ranks:
        ``L_T^{-1} (Q^T K_x*)``, the triangular solve in float64."""
        QtK = self.op.comm.all_reduce_sum(self.basis.mT.to(CORE) @ Kxs.to(CORE))
        return torch.linalg.solve_triangular(self.tridiagonal_factor, QtK, upper=False)

    def explained(self, Kxs: Tensor) -> Tensor:
        """``||R^T k_*||^2`` [c] float64 per test column, so that the predictive variance is ``k_** - explained``."""
        return (self.project(Kxs) ** 2).sum(0)

r"""The pivoted-Cholesky preconditioner of ``Khat = K + sigma^2 I``. The greedy pivoted Cholesky factor (Harbrecht
et al., 2012) L [n, k], ``L L^T ~ K``, gives

    P = L L^T + sigma^2 I,
    P^{-1} B = (B - L C^{-1} L^T B / sigma^2) / sigma^2,      C = I_k + L^T L / sigma^2      (Woodbury),
    log|P| = n log sigma^2 + log|C|                                                        (determinant lemma),

and draws ``z = L e_1 + sigma e_2 ~ N(0, P)`` for e_1 ~ N(0, I_k), e_2 ~ N(0, I_n).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from ..linalg import CORE, cho_solve, cholesky, logdet_from_cholesky
from .operator import RowPartitioned, as_noise, default_tol, global_normal

__all__ = ["pivoted_cholesky", "Preconditioner"]


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
    tol = default_tol(op.dtype) if tol is None else tol
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


class Preconditioner:
    """``P = L L^T + sigma^2 I`` for a row-partitioned L [n_r, k] (k may be 0, then P = sigma^2 I); see the module
    docstring for the formulas. :meth:`from_operator` builds L by :func:`pivoted_cholesky`."""

    def __init__(self, op: RowPartitioned, noise: float | Tensor, factor: Tensor) -> None:
        self.op = op
        self.factor = factor  # L [n_r, k]
        self.noise = as_noise(noise, op.dtype, op.device)
        self.noise_core = as_noise(noise, CORE, op.device)
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
        e2 = global_normal(self.op, self.op.n_global, t, generator)
        return self.factor @ e1.to(self.op.device) + self.noise.sqrt() * e2

r"""Predictive variances by LOVE (Pleiss et al., 2018). k steps of Lanczos on Khat with full reorthogonalisation
give an orthonormal Q [n, k] and ``T = Q^T Khat Q`` [k, k]. With ``T = L_T L_T^T`` and ``R = Q L_T^{-T}``,
``R R^T = Q T^{-1} Q^T``, which equals Khat^{-1} when k = n and otherwise satisfies ``Q T^{-1} Q^T <= Khat^{-1}``
(Loewner order, because ``Q (Q^T A Q)^{-1} Q^T`` is the A-orthogonal projection onto span Q, in the A^{-1} inner
product); so ``||R^T k_*||^2`` never exceeds ``k_*^T Khat^{-1} k_*`` and grows with k (the Krylov spaces are
nested), and the variance ``k_** - ||R^T k_*||^2`` errs on the side of too large.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..linalg import CORE, cholesky
from .operator import RowPartitioned, as_noise, default_tol, dots, khat_matmul

__all__ = ["LanczosVariance"]


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
        tol = default_tol(op.dtype) if tol is None else tol
        sigma2 = as_noise(noise, op.dtype, op.device)
        rank = min(rank, op.n_global)
        q = start.reshape(-1, 1)
        norm = dots(op.comm, (q, q))[0, 0].sqrt()
        if not norm > 0:
            raise ValueError("LanczosVariance needs a non-zero start vector.")
        q = q / norm.to(op.dtype)
        Q = torch.zeros(op.n_local, rank, dtype=op.dtype, device=op.device)
        alphas, betas = [], []
        for j in range(rank):
            Q[:, j:j + 1] = q
            v = khat_matmul(op, sigma2, q)
            alpha = dots(op.comm, (q, v))[0, 0]
            v = v - alpha.to(op.dtype) * q
            if betas:
                v = v - betas[-1].to(op.dtype) * Q[:, j - 1:j]
            for _ in range(2):  # Gram-Schmidt twice keeps Q orthonormal to working precision
                coefficients = op.comm.all_reduce_sum(Q[:, :j + 1].mT.to(CORE) @ v.to(CORE))
                v = v - Q[:, :j + 1] @ coefficients.to(op.dtype)
            alphas.append(alpha)
            if j == rank - 1:
                break
            beta = dots(op.comm, (v, v))[0, 0].sqrt()
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

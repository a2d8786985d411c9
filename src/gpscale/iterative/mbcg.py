r"""Batched preconditioned conjugate gradients (mBCG) for ``Khat X = B``, t columns at once, one product with K per
iteration for all of them. With step sizes alpha_j and direction updates beta_j (``d_{j+1} = z_{j+1} +
beta_j d_j``), the run on a column b is Lanczos in disguise: the tridiagonal

    T[0, 0] = 1 / alpha_0,   T[j, j] = 1 / alpha_j + beta_{j-1} / alpha_{j-1},   T[j, j+1] = sqrt(beta_j) / alpha_j

is the Lanczos tridiagonal of ``P^{-1/2} Khat P^{-1/2}`` started at ``P^{-1/2} b / ||P^{-1/2} b||`` (Saad, 2003,
sec. 6.7.3), with ``||P^{-1/2} b||^2 = b^T P^{-1} b``. For any f, ``b^T P^{-1/2} f(P^{-1/2} Khat P^{-1/2})
P^{-1/2} b ~ (b^T P^{-1} b) e_1^T f(T) e_1`` (Gauss quadrature; exact for f(x) = 1/x at convergence).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

from ..linalg import CORE, NumericalWarning
from .operator import RowPartitioned, as_noise, dots, khat_matmul
from .preconditioner import Preconditioner

__all__ = ["CGResult", "cg"]


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
    sigma2 = as_noise(noise, op.dtype, op.device)
    precondition = preconditioner.solve if preconditioner is not None else (lambda V: V)
    X = torch.zeros_like(B)
    R = B.clone()
    Z = precondition(R)
    preconditioned = Z
    D = Z
    rz, rr = dots(comm, (R, Z), (R, R))  # [t] each
    rhs_norms = rz.clone()
    b_norms = rr.sqrt()
    scale = torch.where(b_norms > 0, b_norms, 1.0)
    residual = b_norms / scale
    active = residual > tol
    alphas, betas, steps = [], [], torch.zeros(B.shape[1], dtype=torch.long, device=B.device)
    iterations = 0
    while iterations < max_iterations and bool(active.any()):
        V = khat_matmul(op, sigma2, D)
        (dKd,) = dots(comm, (D, V))
        alpha = torch.where(active, rz / torch.where(active, dKd, 1.0), 0.0)  # frozen columns take no step
        X += D * alpha.to(B.dtype)
        R = R - V * alpha.to(B.dtype)  # not in place: without a preconditioner Z and D share R's memory
        Z = precondition(R)
        rz_new, rr = dots(comm, (R, Z), (R, R))
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

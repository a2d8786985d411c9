r"""The log-determinant by stochastic Lanczos quadrature, and the one mBCG run that gives an exact GP's marginal
likelihood and its gradient. With probes z_i ~ N(0, P), i = 1..t,

    log|Khat| = log|P| + log|P^{-1} Khat|,
    log|P^{-1} Khat| = E[u^T log(P^{-1/2} Khat P^{-1/2}) u],  u = P^{-1/2} z ~ N(0, I)
                     ~ (1/t) sum_i (z_i^T P^{-1} z_i) e_1^T log(T_i) e_1.

One mBCG run on ``[y, z_1 .. z_t]`` gives ``Khat^{-1} y``, the T_i and, for the gradient,
``w_i = Khat^{-1} z_i`` and ``q_i = P^{-1} z_i``: since E[w q^T] = Khat^{-1} E[z z^T] P^{-1} = Khat^{-1},

    d log|Khat| = tr(Khat^{-1} dKhat) ~ (1/t) sum_i w_i^T dKhat q_i      (unbiased),

which is the whole derivative (log|P|'s included); see :func:`solve_and_logdet`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..linalg import CORE
from .mbcg import CGResult, cg
from .operator import RowPartitioned, dots, global_normal
from .preconditioner import Preconditioner

__all__ = ["lanczos_logdet", "SolveAndLogdet", "solve_and_logdet"]


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
        Z = global_normal(op, op.n_global, num_probes, generator)
    s = Y.shape[1]
    run = cg(op, noise, torch.cat([Y, Z], dim=1), preconditioner=preconditioner, tol=tol,
             max_iterations=max_iterations, lanczos=True)
    solution = run.solution[:, :s]
    (inv_quad,) = dots(op.comm, (Y, solution))
    logdet = lanczos_logdet(run, preconditioner, columns=slice(s, None))
    return SolveAndLogdet(solution, inv_quad, logdet, Z, run.solution[:, s:], run.preconditioned[:, s:], run)

"""The algebra of a Gaussian q(u) = N(m, S) over inducing features, as pure functions: its KL divergences from the
prior, whitened (prior N(0, I)) or not (prior N(0, Kuu)), and one natural-gradient step.

Everything here is float64 (``linalg.CORE``); S is always carried as its lower Cholesky factor L, S = L L^T.
"""
from __future__ import annotations

import warnings

import torch
from torch import Tensor

from ...linalg import CORE, NotPSDError, NumericalWarning, inverse_cholesky, logdet_from_cholesky, solve_lower

__all__ = ["gauss_kl_whitened", "gauss_kl", "projected_moments", "natural_gradient_update", "warn_skipped_step"]


def gauss_kl_whitened(q_mu: Tensor, q_sqrt: Tensor) -> Tensor:
    """``KL(N(m, S S^T) || N(0, I)) = 1/2 (m^T m + tr(S S^T) - M - log|S S^T|)`` for lower-triangular S; with
    blocks (q_mu [T, m], q_sqrt [T, m, m]) the sum of the blocks' KLs."""
    mahalanobis = (q_mu * q_mu).sum()
    trace = (q_sqrt**2).sum()
    logdet_qcov = logdet_from_cholesky(q_sqrt).sum()
    return 0.5 * (mahalanobis + trace - q_mu.numel() - logdet_qcov)


def gauss_kl(q_mu: Tensor, L: Tensor, Kuu) -> Tensor:
    """``KL(N(m, L L^T) || N(0, Kuu)) = 1/2 (tr(Kuu^{-1} S) - M + log|Kuu| - log|S| + m^T Kuu^{-1} m)`` for q_mu [M],
    L [M, M] and ``Kuu`` an operator (:mod:`gpscale.operators`); tr(Kuu^{-1} S) comes from L, never forming S."""
    return 0.5 * (Kuu.inv_quad(L) - L.shape[0] + Kuu.logdet() - logdet_from_cholesky(L)
                  + q_mu @ Kuu.solve(q_mu.unsqueeze(-1)).squeeze(-1))


def projected_moments(Kuf: Tensor, Kff_diag: Tensor, Lu: Tensor, q_mu: Tensor,
                      q_sqrt: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and variance [b] of a whitened q(f) = N(a^T m, kff - a^T a + a^T S S^T a), a = L^{-1} k_u(x), with the
    m x m algebra done once per batch:

        a = L^{-T} m,   P = L^{-T} (S S^T - I) L^{-1},   mean = Kfu a,   var = kff + diag(Kfu P Kuf),

    for Kuf [(T,) m, b] (blocks summed), Kff_diag [b] and the Cholesky factor Lu of Kuu. The data-sized work is one
    [m, m] x [m, b] matmul forward and two backward (6 m^2 b flops), against a triangular solve and a matmul forward
    and their backward (10 m^2 b); the m x m part costs O(m^3), so this pays when m is well below the batch size.
    The variance is a difference of O(1) terms, not a squared norm, and its rounding grows with cond(Kuu): it
    serves a float64 training objective, not prediction."""
    eye = torch.eye(Lu.shape[-1], dtype=CORE, device=Lu.device)
    L_inv = solve_lower(Lu, eye)
    S = q_sqrt.to(CORE)
    a = (L_inv.mT @ q_mu.to(CORE).unsqueeze(-1)).squeeze(-1)
    P = L_inv.mT @ (S @ S.mT - eye) @ L_inv
    mean = torch.einsum("...mc,...m->c", Kuf, a.to(Kuf.dtype))
    variance = P.to(Kuf.dtype) @ Kuf * Kuf
    return mean, Kff_diag + variance.reshape(-1, variance.shape[-1]).sum(0)


def natural_gradient_update(m: Tensor, S_inv: Tensor, g_m: Tensor, data_term: Tensor, prior_precision: Tensor,
                            rho: float) -> tuple[Tensor, Tensor, Tensor] | None:
    """One natural-gradient step of size ``rho`` on q = N(m, S) [..., M] (float64, any leading axes), from the
    ELBO's gradients (Salimbeni, Eleftheriadis & Hensman, "Natural gradients in practice", AISTATS 2018):

        theta_1 = S^{-1} m + rho (g_m - 2 g_S m),    theta_2 = -1/2 S^{-1} + rho g_S,
        S <- (-2 theta_2)^{-1},    m <- S theta_1,

    where ``g_m`` = dELBO / dm (the KL's part included) and ``g_S = data_term + 1/2 (S^{-1} - K^{-1})``: S enters
    the ELBO through the batch's variances, ``data_term = A diag(dELBO / dvar) A^T``, and the KL's ``tr(K^{-1} S)``
    and ``log|S|``, with K^{-1} the ``prior_precision`` (I for a whitened q). A step whose -2 theta_2 is not positive
    definite is halved, down to rho / 512. Returns (m, lower L with L L^T = S, the new precision S^{-1}), or None when
    every step failed."""
    g_S = data_term + 0.5 * (S_inv - prior_precision)
    g_S = 0.5 * (g_S + g_S.mT)
    for _ in range(10):
        theta_1 = (S_inv @ m.unsqueeze(-1)).squeeze(-1) + rho * (g_m - 2 * (g_S @ m.unsqueeze(-1)).squeeze(-1))
        precision = S_inv - 2 * rho * g_S  # -2 theta_2
        try:
            L = inverse_cholesky(precision, what="new S^{-1}")
        except NotPSDError:
            rho /= 2
            continue
        return (L @ (L.mT @ theta_1.unsqueeze(-1))).squeeze(-1), L, precision
    return None


def warn_skipped_step(rho: float) -> None:
    warnings.warn(f"A natural-gradient step on q was skipped: S would not stay positive definite even at 1/512 of "
                  f"the step. Pass a smaller natgrad_step (now {rho}) or a larger jitter.", NumericalWarning,
                  stacklevel=4)

"""The unwhitened parametrisation of the variational engine's q (:class:`~gpscale.models._variational.VariationalGP`
with ``whiten=False``): q(u) = N(m, S) against the prior N(0, Kuu), where Kuu is only ever solved with, through its
operator, so a structured Kuu (Fourier features') keeps its structure:

    q(f(x)) = N(phi^T w,  k(x, x) - phi^T Kuu^{-1} phi + phi^T Kuu^{-1} S Kuu^{-1} phi),
    w = Kuu^{-1} m,  phi = Kuf(x) = Cov(u, f(x)).

A mean basis outside the features (:mod:`gpscale.models.decoupled`) enters through three hooks: ``mean_weights``,
``add_mean_basis`` and ``mean_basis_kl``.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..linalg import CORE, cholesky, cholesky_inverse, solve_lower, solve_upper
from ._gaussian_q import gauss_kl
from .base import PredictiveFactors

__all__ = ["UnwhitenedQ", "MeanWeights"]


class MeanWeights(NamedTuple):
    """The unwhitened mean's coefficients: w = Kuu^{-1} (m - c) on the features [M], and, with a mean basis gamma
    [M_g, d] (:mod:`gpscale.models.decoupled`), its weights a [M_g] and c = K_u,gamma a [M] (else a and gamma are
    None and c = 0)."""

    a: Tensor | None
    w: Tensor
    c: Tensor
    gamma: Tensor | None = None


def _projection(Kux: Tensor, Kff_diag: Tensor, Kuu) -> tuple[Tensor, Tensor]:
    """A = Kuu^{-1} phi [M, b] and the residual k(x, x) - phi^T Kuu^{-1} phi [b] (float64), which neither q nor the
    mean basis enters: a training step's natural-gradient step and loss share them."""
    A = Kuu.solve(Kux)
    # >= 0 in exact arithmetic; the clamp removes round-off only
    return A, (Kff_diag.to(CORE) - (Kux * A).sum(0)).clamp_min(0.0)


class UnwhitenedQ:
    """The unwhitened q's algebra, for :class:`~gpscale.models._variational.VariationalGP`, which holds the
    features, the likelihood and q itself (``q_mu``, ``q_sqrt``)."""

    def Kuu_operator(self):
        """Kuu + jitter I as an operator (float64); structured features keep their structure. Shared within a
        training step (``step_shared``), with the factorisation it caches."""
        return self.step_shared("Kuu", None, lambda: self.features.Kuu_operator(self.jitter))

    def mean_weights(self, Kuu, q_mu: Tensor) -> MeanWeights:
        """The mean's coefficients w = Kuu^{-1} m (float64), computed once per objective: the moments and the KL
        both need them."""
        return MeanWeights(None, Kuu.solve(q_mu.unsqueeze(-1)).squeeze(-1), torch.zeros_like(q_mu))

    def add_mean_basis(self, X: Tensor, mean: Tensor, a: Tensor | None, gamma: Tensor | None) -> Tensor:
        """The mean at X [b] plus any part of it outside the features (none here; the decoupled mean basis)."""
        return mean

    def mean_basis_kl(self, Kuu, weights: MeanWeights) -> Tensor | float:
        """The KL's term of a mean basis outside the features (none here)."""
        return 0.0

    def projections(self, X: Tensor, Kuu, weights: MeanWeights) -> tuple[Tensor, Tensor, Tensor]:
        """What q(f) at X [b, d] needs besides q's covariance (float64): the mean [b], the residual
        k(x, x) - phi^T Kuu^{-1} phi [b] and A = Kuu^{-1} phi(x) [M, b], with ``weights`` from m. The variance is
        ``residual + diag(A^T S A)``."""
        Kux, Kff_diag = self.batch_kernels(X)
        Kux = Kux.to(CORE)  # [M, b]
        A, residual = self.step_shared("A, residual", X, lambda: _projection(Kux, Kff_diag, Kuu))
        mean = self.add_mean_basis(X, Kux.T @ weights.w, weights.a, weights.gamma)
        return mean, residual, A

    def unwhitened_elbo(self, X: Tensor, y: Tensor, num_data: int, q_mu: Tensor, L: Tensor) -> Tensor:
        Kuu = self.Kuu_operator()
        weights = self.mean_weights(Kuu, q_mu)
        mean, residual, A = self.projections(X, Kuu, weights)
        var = residual + (L.T @ A).square().sum(0)
        expected = self.likelihood.expected_log_prob(y.to(CORE), mean, var).sum()
        kl = gauss_kl(q_mu, L, Kuu) + self.mean_basis_kl(Kuu, weights)
        return (num_data / X.shape[0]) * expected - kl

    def unwhitened_kl(self, q_mu: Tensor, L: Tensor) -> Tensor:
        """KL(N(m, L L^T) || N(0, Kuu)) plus a mean basis's term (float64)."""
        Kuu = self.Kuu_operator()
        return gauss_kl(q_mu, L, Kuu) + self.mean_basis_kl(Kuu, self.mean_weights(Kuu, q_mu))

    def unwhitened_gradients(self, X, y, num_data, comm, share):
        """The terms of a natural-gradient step (see :meth:`VariationalGP.natural_gradient_step`): m, L, the global
        batch's ``dELBO / dm`` (by autograd through the batch's means and the KL's ``m^T Kuu^{-1} m / 2``) and data
        term, K^{-1} = Kuu^{-1} and S^{-1}."""
        with torch.no_grad():
            L = self.q_sqrt.to(CORE)
            m = self.q_mu.detach().to(CORE).clone().requires_grad_(True)
        # with its graph, and with gradients on wherever it factorises (it caches its factors), for the loss of this
        # step to take (step_shared)
        Kuu = self.Kuu_operator()
        if X.shape[0]:
            weights = self.mean_weights(Kuu, m)
            mean, residual, A = self.projections(X, Kuu, weights)
            A = A.detach()
            feature_var = (L.T @ A).square().sum(0).requires_grad_(True)
            expected = self.likelihood.expected_log_prob(y.to(CORE), mean, residual.detach() + feature_var).sum()
            kl_m = 0.5 * m @ Kuu.solve(m.unsqueeze(-1)).squeeze(-1)  # the only other term with m in it
            g_m, g_v = torch.autograd.grad((num_data / X.shape[0]) * expected - kl_m, [m, feature_var])
            g_m, data_term = share * g_m, (A * (share * g_v)) @ A.T
        else:  # none of the global batch's rows are here
            g_m, data_term = torch.zeros_like(m), torch.zeros(L.shape, dtype=CORE, device=L.device)
        g_m, data_term = comm.all_reduce_sum(g_m), comm.all_reduce_sum(data_term)
        eye = torch.eye(L.shape[0], dtype=CORE, device=L.device)
        return m.detach(), L, g_m, data_term, Kuu.solve(eye), self._S_inverse(L)

    def _q_sqrt_state(self) -> tuple:
        raw = self.q_sqrt_raw
        return raw.data_ptr(), raw._version, raw.device, raw.dtype

    def _S_inverse(self, L: Tensor) -> Tensor:
        """S^{-1} [M, M] (float64): the precision the last natural-gradient step factored, while nothing has
        written to L since (its version counter says so), which saves a cholesky_inverse (2/3 M^3 flops) per
        step; otherwise from L."""
        state, precision = getattr(self, "_precision", None) or (None, None)
        return precision if state == self._q_sqrt_state() else cholesky_inverse(L)

    def unwhitened_posterior(self) -> dict[str, Tensor]:
        """The posterior cache: Kuu's Cholesky factor, L_S and the mean's weights (float64)."""
        Kuu = self.Kuu_operator()
        weights = self.mean_weights(Kuu, self.q_mu.to(CORE))
        cache = {"Lu": cholesky(Kuu.to_dense(), what="Kuu"), "q_sqrt": self.q_sqrt.detach().to(CORE).clone(),
                 "w": weights.w}
        if weights.a is not None:  # the mean basis, fixed with the rest of the posterior
            cache["a"], cache["gamma"] = weights.a.clone(), weights.gamma.detach().clone()
        return cache

    def unwhitened_predictive_factors(self, X: Tensor) -> PredictiveFactors:
        """Mean ``phi^T w`` (plus a mean basis) and covariance ``K - V^T V + (L_S^T A)^T (L_S^T A)`` with
        ``V = L^{-1} phi`` (so ``V^T V = phi^T Kuu^{-1} phi``) and ``A = Kuu^{-1} phi``."""
        Lu = self.cache["Lu"]
        Kux = self.features.Kuf(X).to(CORE)
        V = solve_lower(Lu, Kux)
        A = solve_upper(Lu.T, V)
        mean = self.add_mean_basis(X, Kux.T @ self.cache["w"], self.cache.get("a"), self.cache.get("gamma"))
        return PredictiveFactors(mean, V, self.cache["q_sqrt"].T @ A)

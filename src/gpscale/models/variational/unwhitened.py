"""The unwhitened parametrisation of the variational engine's q: q(u) = N(m, S) against the prior N(0, Kuu), where
Kuu is only ever solved with, through its operator (the model's ``Kuu_operator``), so a structured Kuu (Fourier
features') keeps its structure:

    q(f(x)) = N(phi^T w,  k(x, x) - phi^T Kuu^{-1} phi + phi^T Kuu^{-1} S Kuu^{-1} phi),
    w = Kuu^{-1} m,  phi = Kuf(x) = Cov(u, f(x)).

A mean basis outside the features (:class:`~gpscale.models.variational.decoupled.DecoupledQ`) enters through three
hooks: :meth:`UnwhitenedQ.mean_weights`, :meth:`UnwhitenedQ.add_mean_basis` and :meth:`UnwhitenedQ.mean_basis_kl`.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ...distributed import Comm
from ...linalg import CORE, cholesky, solve_lower, solve_upper
from ..base import GPModel, PredictiveFactors
from .gaussian_q import gauss_kl
from .parametrisation import NaturalGradientTerms, QParametrisation

__all__ = ["UnwhitenedQ", "MeanWeights"]


class MeanWeights(NamedTuple):
    """The unwhitened mean's coefficients: w = Kuu^{-1} (m - c) on the features [M], and, with a mean basis gamma
    [M_g, d] (:mod:`gpscale.models.variational.decoupled`), its weights a [M_g] and c = K_u,gamma a [M] (else a and
    gamma are None and c = 0)."""

    a: Tensor | None
    w: Tensor
    c: Tensor
    gamma: Tensor | None = None


def projection(Kux: Tensor, Kff_diag: Tensor, Kuu) -> tuple[Tensor, Tensor]:
    """A = Kuu^{-1} phi [M, b] and the residual k(x, x) - phi^T Kuu^{-1} phi [b] (float64), which neither q nor the
    mean basis enters: a training step's natural-gradient step and loss share them."""
    A = Kuu.solve(Kux)
    # >= 0 in exact arithmetic; the clamp removes round-off only
    return A, (Kff_diag.to(CORE) - (Kux * A).sum(0)).clamp_min(0.0)


class UnwhitenedQ(QParametrisation):
    """q(u) = N(m, L L^T) against the prior N(0, Kuu) (see the module docstring); one block of features and one
    latent function: q_mu [M], q_sqrt [M, M]."""

    def check(self, model, blocks: int | None) -> None:
        if blocks is not None or model.n_latent > 1:
            raise ValueError(f"{model.key or type(model).__name__} with whiten=False takes one block of features "
                             f"and one latent function (this one has {blocks or 1} and {model.n_latent}): pass "
                             "whiten=True.")

    def prior_sqrt(self, model) -> Tensor:
        return cholesky(model.Kuu_operator().to_dense(), what="Kuu")

    # --- hooks of a mean basis outside the features -----------------------------------------------------------
    def mean_weights(self, model, Kuu, q_mu: Tensor) -> MeanWeights:
        """The mean's coefficients w = Kuu^{-1} m (float64), computed once per objective: the moments and the KL
        both need them."""
        return MeanWeights(None, Kuu.solve(q_mu.unsqueeze(-1)).squeeze(-1), torch.zeros_like(q_mu))

    def add_mean_basis(self, model, X: Tensor, mean: Tensor, a: Tensor | None, gamma: Tensor | None) -> Tensor:
        """The mean at X [b] plus any part of it outside the features (none here)."""
        return mean

    def mean_basis_kl(self, model, Kuu, weights: MeanWeights) -> Tensor | float:
        """The KL's term of a mean basis outside the features (none here)."""
        return 0.0

    # --- the objective ----------------------------------------------------------------------------------------
    def projections(self, model, X: Tensor, Kuu, weights: MeanWeights) -> tuple[Tensor, Tensor, Tensor]:
        """What q(f) at X [b, d] needs besides q's covariance (float64): the mean [b], the residual
        k(x, x) - phi^T Kuu^{-1} phi [b] and A = Kuu^{-1} phi(x) [M, b], with ``weights`` from m. The variance is
        ``residual + diag(A^T S A)``."""
        Kux, Kff_diag = model.batch_kernels(X)
        Kux = Kux.to(CORE)  # [M, b]
        A, residual = model.step_shared("A, residual", X, lambda: projection(Kux, Kff_diag, Kuu))
        mean = self.add_mean_basis(model, X, Kux.T @ weights.w, weights.a, weights.gamma)
        return mean, residual, A

    def elbo(self, model, X: Tensor, y: Tensor, num_data: int, q_mu: Tensor, q_sqrt: Tensor) -> Tensor:
        q_mu, L = q_mu.to(CORE), q_sqrt.to(CORE)
        Kuu = model.Kuu_operator()
        weights = self.mean_weights(model, Kuu, q_mu)
        mean, residual, A = self.projections(model, X, Kuu, weights)
        var = residual + (L.T @ A).square().sum(0)
        expected = model.likelihood.expected_log_prob(y.to(CORE), mean, var).sum()
        kl = gauss_kl(q_mu, L, Kuu) + self.mean_basis_kl(model, Kuu, weights)
        return (num_data / X.shape[0]) * expected - kl

    def kl(self, model, q_mu: Tensor, L: Tensor) -> Tensor:
        """KL(N(m, L L^T) || N(0, Kuu)) plus a mean basis's term (float64)."""
        Kuu = model.Kuu_operator()
        return gauss_kl(q_mu, L, Kuu) + self.mean_basis_kl(model, Kuu, self.mean_weights(model, Kuu, q_mu))

    def natural_gradient_terms(self, model, X: Tensor, y: Tensor, num_data: int, comm: Comm,
                               share: float) -> NaturalGradientTerms:
        """m, L, the global batch's ``dELBO / dm`` (by autograd through the batch's means and the KL's
        ``m^T Kuu^{-1} m / 2``) and data term, and K^{-1} = Kuu^{-1}."""
        with torch.no_grad():
            L = model.q_sqrt.to(CORE)
            m = model.q_mu.detach().to(CORE).clone().requires_grad_(True)
        # with its graph, and with gradients on wherever it factorises (it caches its factors), for the loss of this
        # training step to take (VariationalGP.step_shared)
        Kuu = model.Kuu_operator()
        if X.shape[0]:
            weights = self.mean_weights(model, Kuu, m)
            mean, residual, A = self.projections(model, X, Kuu, weights)
            A = A.detach()
            feature_var = (L.T @ A).square().sum(0).requires_grad_(True)
            expected = model.likelihood.expected_log_prob(y.to(CORE), mean, residual.detach() + feature_var).sum()
            kl_m = 0.5 * m @ Kuu.solve(m.unsqueeze(-1)).squeeze(-1)  # the only other term with m in it
            g_m, g_v = torch.autograd.grad((num_data / X.shape[0]) * expected - kl_m, [m, feature_var])
            g_m, data_term = share * g_m, (A * (share * g_v)) @ A.T
        else:  # none of the global batch's rows are here
            g_m, data_term = torch.zeros_like(m), torch.zeros(L.shape, dtype=CORE, device=L.device)
        g_m, data_term = comm.all_reduce_sum(g_m), comm.all_reduce_sum(data_term)
        eye = torch.eye(L.shape[0], dtype=CORE, device=L.device)
        return m.detach(), L, g_m, data_term, Kuu.solve(eye)

    # --- posterior ----------------------------------------------------------------------------------------------
    def posterior(self, model) -> dict[str, Tensor]:
        """Kuu's Cholesky factor, L_S and the mean's weights (float64)."""
        Kuu = model.Kuu_operator()
        weights = self.mean_weights(model, Kuu, model.q_mu.to(CORE))
        cache = {"Lu": cholesky(Kuu.to_dense(), what="Kuu"), "q_sqrt": model.q_sqrt.detach().to(CORE).clone(),
                 "w": weights.w}
        if weights.a is not None:  # the mean basis, fixed with the rest of the posterior
            cache["a"], cache["gamma"] = weights.a.clone(), weights.gamma.detach().clone()
        return cache

    def predict_chunk(self, model, X: Tensor) -> tuple[Tensor, Tensor]:
        # the diagonal of the predictive factors' covariance, as any model's
        return GPModel.predict_chunk(model, X)

    def predictive_factors(self, model, X: Tensor) -> PredictiveFactors:
        """Mean ``phi^T w`` (plus a mean basis) and covariance ``K - V^T V + (L_S^T A)^T (L_S^T A)`` with
        ``V = L^{-1} phi`` (so ``V^T V = phi^T Kuu^{-1} phi``) and ``A = Kuu^{-1} phi``."""
        Lu = model.cache["Lu"]
        Kux = model.features.Kuf(X).to(CORE)
        V = solve_lower(Lu, Kux)
        A = solve_upper(Lu.T, V)
        mean = self.add_mean_basis(model, X, Kux.T @ model.cache["w"], model.cache.get("a"), model.cache.get("gamma"))
        return PredictiveFactors(mean, V, model.cache["q_sqrt"].T @ A)

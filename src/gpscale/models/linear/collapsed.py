"""Titsias' collapsed bound on the linear engine: :class:`CollapsedGP`, whose features are whitened inducing features
and whose objective adds the trace term. *Collapsed* names this one thing in gpscale. Users: ``sgpr`` and ``vff``."""
from __future__ import annotations

import torch
from torch import Tensor

from ...distributed import LOCAL, Comm
from ...linalg import CORE, cholesky, solve_lower
from ..inducing import InducingFeatures, jittered_cholesky
from .engine import Features, FeatureSpaceGP
from .weight_space import log_evidence

__all__ = ["CollapsedGP"]


class CollapsedGP(FeatureSpaceGP):
    """Titsias' collapsed bound for any inducing features: ``phi(x) = L^{-1} k_u(x)`` with ``L L^T = K_uu +
    jitter I``, so ``Phi Phi^T`` is the Nyström approximation ``K_fu K_uu^{-1} K_uf`` and

        log p(y) >= log N(y | 0, Q + sigma^2 I) - (tr K_ff - tr Q) / (2 sigma^2).

    A subclass sets ``self.features`` (an :class:`~gpscale.models.inducing.InducingFeatures`) and ``self.jitter``.
    In float32 take ``solver='qr'`` (what ``'auto'`` does): whitening the Gram matrix amplifies its rounding by
    cond(K_uu)^2, which learned inducing points can make large, where QR whitens row by row.
    """

    trace_term = True
    features: InducingFeatures
    jitter: float = 0.0

    def feature_state(self) -> dict[str, Tensor]:
        """``{"Lu": L}``, the Cholesky factor of K_uu + jitter I (float64)."""
        return {"Lu": jittered_cholesky(self.features.Kuu(), self.jitter)}

    def feature_map(self, state: dict[str, Tensor]) -> Features:
        """``x -> L^{-1} k_u(x)``, whitened on the core by the Cholesky solver (computed in the data dtype)."""
        return Features(lambda X: self.features.Kuf(X).to(X.dtype).T, whitening_factor=state["Lu"])

    def prior_variance(self, X: Tensor) -> Tensor:
        return self.features.Kff_diag(X)

    def elbo(self, X: Tensor, y: Tensor, comm: Comm = LOCAL) -> Tensor:
        """Titsias' bound on log p(y) (float64 scalar), the training objective."""
        post = self.weight_posterior(X, y, comm)
        trace_term = (post.prior_trace - post.feature_trace) / self.noise.to(CORE)
        return log_evidence(post, self.noise) - 0.5 * trace_term

    def objective(self, X: Tensor, y: Tensor, comm: Comm = LOCAL) -> Tensor:
        return self.elbo(X, y, comm)

    def optimal_q(self, X: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """The optimal whitened q(v) = N(mean [m], S S^T), S [m, m] lower; SVGP with it attains this bound."""
        post = self.weight_posterior(X, y)
        eye = torch.eye(post.L_B.shape[0], dtype=post.L_B.dtype, device=post.L_B.device)
        L_B_inv = solve_lower(post.L_B, eye)  # S S^T = B^{-1} = L_B^{-T} L_B^{-1}
        return post.weight_mean, cholesky(L_B_inv.T @ L_B_inv, what="optimal q(v) covariance")

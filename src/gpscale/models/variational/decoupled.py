"""The orthogonally decoupled mean basis (Salimbeni et al. 2018a; with Fourier features as beta, Azzimonti et al.'s
ODVFF): an extension of the variational engine's unwhitened q.

Beside the inducing features beta (q(beta) = N(m, S), which carry the covariance), inducing inputs gamma [M_g, d]
with weights a carry the part of the mean that lies in the orthogonal complement of beta:

    mean(x) = k(x, gamma) a + phi(x)^T Kbb^{-1} (m - Kbg a),       phi(x) = Kuf(x) = Cov(beta, f(x))
    var(x)  = k(x, x) - phi^T Kbb^{-1} phi + phi^T Kbb^{-1} S Kbb^{-1} phi
    KL      = KL(N(m, S) || N(0, Kbb)) + 1/2 (a^T Kgg a - (Kbg a)^T Kbb^{-1} (Kbg a))

No M_g x M_g matrix is ever factorised, so M_g can be large.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ...linalg import CORE
from .engine import VariationalGP
from .unwhitened import MeanWeights, UnwhitenedQ
from ..inducing import kmeans_centers

__all__ = ["DecoupledQ", "OrthogonallyDecoupledGP"]


class DecoupledQ(UnwhitenedQ):
    """The unwhitened q with the mean basis gamma of an :class:`OrthogonallyDecoupledGP` (its ``gamma`` [M_g, d],
    ``a_gamma`` [M_g] and ``mean_basis_sums``): the three hooks of :class:`UnwhitenedQ`."""

    def mean_weights(self, model, Kuu, q_mu: Tensor) -> MeanWeights:
        """a [M_g], w = Kbb^{-1} (m - Kbg a) [M_b] and c = Kbg a [M_b] (float64)."""
        a = model.a_gamma.to(CORE)
        if model.n_mean_inducing:
            c = model.mean_basis_sums(a)[0]
        else:
            c = torch.zeros_like(q_mu)
        return MeanWeights(a, Kuu.solve((q_mu - c).unsqueeze(-1)).squeeze(-1), c, model.gamma)

    def add_mean_basis(self, model, X: Tensor, mean: Tensor, a: Tensor | None, gamma: Tensor | None) -> Tensor:
        """``mean + k(x, gamma) a``."""
        if not model.n_mean_inducing:
            return mean
        return mean + model.step_shared("Kfg a", X, lambda: model.kernel.matvec(X, gamma, a))

    def mean_basis_kl(self, model, Kuu, weights: MeanWeights) -> Tensor | float:
        """``1/2 a^T (Kgg - Kgb Kbb^{-1} Kbg) a`` as two quadratic forms, never forming or factorising the
        M_g x M_g Schur complement; >= 0 in exact arithmetic, and the clamp removes round-off below 0."""
        if not model.n_mean_inducing:
            return 0.0
        a, c = weights.a, weights.c
        orthogonal = a @ model.mean_basis_sums(a)[1] - c @ Kuu.solve(c.unsqueeze(-1)).squeeze(-1)
        return 0.5 * orthogonal.clamp_min(0.0)


class OrthogonallyDecoupledGP(VariationalGP):
    """The variational engine's unwhitened q with the decoupled mean basis gamma (see the module docstring).

    Subclasses set ``self.features`` (the covariance basis beta) and call :meth:`initialise_q` once the sizes
    are known; ``initialise_from_data`` places gamma (:meth:`initialise_mean_basis`) and starts q at the prior.

    Args:
        n_mean_inducing: M_g, the inducing inputs of the mean basis gamma (0: an SVGP on the features).
        natural_gradients, natgrad_step, jitter: as :class:`~gpscale.models.variational.engine.VariationalGP` (natural
            gradients on (m, S) by default, as the paper).
    """

    likelihoods = ("gaussian", "bernoulli")
    unwhitened_q = DecoupledQ

    def __init__(self, n_features: int, *, n_mean_inducing: int = 0, whiten: bool = False, **kwargs):
        if whiten is not False:
            raise ValueError("The orthogonally decoupled mean basis needs an unwhitened q: whiten must be False.")
        super().__init__(n_features, whiten=False, **kwargs)
        if int(n_mean_inducing) != n_mean_inducing or n_mean_inducing < 0:
            raise ValueError(f"n_mean_inducing must be a non-negative integer, got {n_mean_inducing}.")
        self.n_mean_inducing = int(n_mean_inducing)
        self.gamma = nn.Parameter(torch.zeros(self.n_mean_inducing, self.n_features))
        self.a_gamma = nn.Parameter(torch.zeros(self.n_mean_inducing))

    def initialise_mean_basis(self, X: Tensor, seed: int) -> None:
        """gamma at k-means centres of the rows of X, a = 0."""
        if self.n_mean_inducing > X.shape[0]:
            raise ValueError(f"n_mean_inducing={self.n_mean_inducing} exceeds the {X.shape[0]} training rows; pass "
                             "at most one mean inducing point per row.")
        if self.n_mean_inducing:
            with torch.no_grad():
                self.gamma.copy_(kmeans_centers(X, self.n_mean_inducing, seed))
                self.a_gamma.zero_()

    def mean_basis_sums(self, a: Tensor) -> tuple[Tensor, Tensor]:
        """``c = K_beta,gamma a`` [M_b], from the features' Kuf(gamma), and ``K_gamma,gamma a`` [M_g], which a kernel
        with structure takes without forming K_gamma,gamma (:meth:`~gpscale.kernels.Kernel.matvec`); float64, shared
        within a training step. ODVGP, whose features are the kernel's own points, takes both in one product."""
        return self.step_shared("K_gamma a", None, lambda: (self.features.Kuf(self.gamma).to(CORE) @ a,
                                                            self.kernel.matvec(self.gamma, self.gamma, a)))

"""Engine for every SVGP-family method, generic over inducing features.

A method supplies an :class:`InducingFeatures` object with ``Kuu()``, ``Kuf(X)`` and ``Kff_diag(X)``. The
engine keeps a whitened ``q(v) = N(m, S S^T)`` with ``u = L v``, ``L L^T = Kuu``, so the prior is N(0, I) and

    q(f(x)) = N(a^T m,  k(x, x) - a^T a + a^T S S^T a),   a = L^{-1} k_u(x),
    ELBO    = num_data / b * sum_{i in batch} E_q log p(y_i | f_i) - KL(q(v) || N(0, I))

(Hensman et al. 2013). ``loss`` returns ``-ELBO / num_data`` so that the learning rate does not depend on n.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..distributed import LOCAL, Comm
from ..linalg import cholesky, logdet_from_cholesky, solve_lower
from .base import GPModel

__all__ = ["InducingFeatures", "VariationalGP", "gauss_kl_whitened"]

CORE = torch.float64


class InducingFeatures(nn.Module):
    """Inter-domain inducing features: the covariances the variational engine needs."""

    num_inducing: int

    def Kuu(self) -> Tensor:  # pragma: no cover - interface
        """[m, m]"""
        raise NotImplementedError

    def Kuf(self, X: Tensor) -> Tensor:  # pragma: no cover - interface
        """[m, n]"""
        raise NotImplementedError

    def Kff_diag(self, X: Tensor) -> Tensor:  # pragma: no cover - interface
        """[n]"""
        raise NotImplementedError


def gauss_kl_whitened(q_mu: Tensor, q_sqrt: Tensor) -> Tensor:
    """``KL(N(m, S S^T) || N(0, I)) = 1/2 (m^T m + tr(S S^T) - M - log|S S^T|)`` for lower-triangular S."""
    mahalanobis = q_mu @ q_mu
    trace = (q_sqrt**2).sum()
    logdet_qcov = logdet_from_cholesky(q_sqrt)
    return 0.5 * (mahalanobis + trace - q_mu.shape[0] - logdet_qcov)


class VariationalGP(GPModel):
    """A GP with a whitened Gaussian q over inducing features, trained on the minibatch ELBO.

    Subclasses set ``self.features`` (an :class:`InducingFeatures`) in ``__init__`` and call
    :meth:`init_variational` once its size is known.

    Args:
        jitter: added to the diagonal of Kuu (absolute).
    """

    def __init__(self, n_features: int, *, jitter: float = 1e-6, **kwargs):
        super().__init__(n_features, **kwargs)
        self.jitter = float(jitter)

    def init_variational(self, m: int) -> None:
        self.q_mu = nn.Parameter(torch.zeros(m))
        self.q_sqrt_raw = nn.Parameter(torch.eye(m))  # only its lower triangle is used

    @property
    def q_sqrt(self) -> Tensor:
        """S [m, m], lower triangular."""
        return torch.tril(self.q_sqrt_raw)

    def Lu(self) -> Tensor:
        """Cholesky factor of Kuu + jitter I [m, m], float64."""
        Kuu = self.features.Kuu().to(CORE)
        eye = torch.eye(Kuu.shape[0], dtype=CORE, device=Kuu.device)
        return cholesky(Kuu + self.jitter * eye, what="inducing covariance Kuu")

    def prior_kl(self, q_sqrt: Tensor | None = None) -> Tensor:
        q_sqrt = self.q_sqrt if q_sqrt is None else q_sqrt
        return gauss_kl_whitened(self.q_mu.to(CORE), q_sqrt.to(CORE))

    def conditional(self, X: Tensor, Lu: Tensor, q_mu: Tensor, q_sqrt: Tensor) -> tuple[Tensor, Tensor]:
        """Mean and variance [c] of q(f) at X [c, d], given L [m, m] and q(v) = N(q_mu, q_sqrt q_sqrt^T)."""
        A = solve_lower(Lu.to(X.dtype), self.features.Kuf(X))  # L^{-1} Kuf, [m, c]
        mean = A.T @ q_mu.to(X.dtype)
        SA = q_sqrt.to(X.dtype).T @ A  # S^T L^{-1} Kuf, [m, c]
        # k(x, x) - a^T a is the Nyström residual, >= 0 in exact arithmetic; clamping removes round-off only
        residual = (self.features.Kff_diag(X) - (A * A).sum(0)).clamp_min(0.0)
        return mean, residual + (SA * SA).sum(0)

    def projected_conditional(self, X: Tensor, Lu: Tensor, q_mu: Tensor, q_sqrt: Tensor) -> tuple[Tensor, Tensor]:
        """The moments of :meth:`conditional`, with the m x m algebra done once per batch:

            a = L^{-T} m,   P = L^{-T} (S S^T - I) L^{-1},   mean = Kfu a,   var = kff + diag(Kfu P Kuf).

        The data-sized work is one [m, m] x [m, b] matmul forward and two backward (6 m^2 b flops), against a
        triangular solve and a matmul forward and their backward (10 m^2 b); the m x m part costs O(m^3), so this
        pays when m is well below the batch size. The variance is a difference of O(1) terms, not a squared norm,
        and its rounding grows with cond(Kuu): it serves the float64 training objective only; prediction keeps
        :meth:`conditional`.
        """
        eye = torch.eye(Lu.shape[0], dtype=CORE, device=Lu.device)
        L_inv = solve_lower(Lu, eye)
        S = q_sqrt.to(CORE)
        a = L_inv.T @ q_mu.to(CORE)
        P = L_inv.T @ (S @ S.T - eye) @ L_inv
        Kuf = self.features.Kuf(X)  # [m, b]
        return Kuf.T @ a.to(X.dtype), self.features.Kff_diag(X) + (Kuf * (P.to(X.dtype) @ Kuf)).sum(0)

    def elbo(self, X: Tensor, y: Tensor, num_data: int) -> Tensor:
        """Unbiased minibatch estimate of the ELBO of a set of ``num_data`` points."""
        q_sqrt = self.q_sqrt
        projected = X.dtype == CORE and 2 * self.q_mu.shape[0] <= X.shape[0]
        conditional = self.projected_conditional if projected else self.conditional
        mean, var = conditional(X, self.Lu(), self.q_mu, q_sqrt)
        expected = self.likelihood.expected_log_prob(y, mean, var).sum()
        return (num_data / X.shape[0]) * expected.to(CORE) - self.prior_kl(q_sqrt)

    def loss(self, X: Tensor, y: Tensor, num_data: int) -> Tensor:
        return -self.elbo(X, y, num_data) / num_data

    @torch.no_grad()
    def fit_posterior(self, X: Tensor, y: Tensor, comm: Comm = LOCAL) -> None:
        # q(v) is the posterior; the cache fixes it together with the Cholesky factor of Kuu
        self.cache = {"Lu": self.Lu(), "q_mu": self.q_mu.detach().clone(), "q_sqrt": self.q_sqrt.detach().clone()}

    def predict_chunk(self, X: Tensor) -> tuple[Tensor, Tensor]:
        return self.conditional(X, self.cache["Lu"], self.cache["q_mu"], self.cache["q_sqrt"])

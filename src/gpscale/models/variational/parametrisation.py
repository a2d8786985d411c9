"""The interface of a parametrisation of the variational engine's q: what
:class:`~gpscale.models.variational.engine.VariationalGP` asks of its q, whitened
(:class:`~gpscale.models.variational.whitened.WhitenedQ`) or not
(:class:`~gpscale.models.variational.unwhitened.UnwhitenedQ`).

A parametrisation is stateless: q's parameters (``q_mu`` [..., m], ``q_sqrt_raw`` [..., m, m]) stay on the model,
with the features and the likelihood, and every method takes the model. The model chooses its parametrisation once,
at construction, from its ``whiten`` option.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

from torch import Tensor

from ...distributed import Comm
from ..base import PredictiveFactors

__all__ = ["QParametrisation", "NaturalGradientTerms"]

# (m, L, dELBO/dm, the data term of dELBO/dS, the prior precision K^{-1}), all float64: what
# gaussian_q.natural_gradient_update takes besides S^{-1}
NaturalGradientTerms = tuple[Tensor, Tensor, Tensor, Tensor, Tensor]


class QParametrisation(ABC):
    """How q's parameters (m, S = L L^T) define q(u), its KL from the prior and q(f)."""

    def check(self, model, blocks: int | None) -> None:
        """Refuse a model this parametrisation cannot take (``blocks`` independent blocks of features, the
        likelihood's latent functions); default: every model."""

    @abstractmethod
    def prior_sqrt(self, model) -> Tensor:
        """L with L L^T the prior covariance of q's variables, the S at which q = p(u)."""

    @abstractmethod
    def kl(self, model, q_mu: Tensor, q_sqrt: Tensor) -> Tensor:
        """KL(q || p(u)) (float64) at q = N(q_mu, q_sqrt q_sqrt^T), given in float64."""

    @abstractmethod
    def elbo(self, model, X: Tensor, y: Tensor, num_data: int, q_mu: Tensor, q_sqrt: Tensor) -> Tensor:
        """``num_data / b sum_i E_q log p(y_i | f_i) - KL(q || p(u))`` on a batch of b > 0 rows X [b, d], y [b]."""

    @abstractmethod
    def natural_gradient_terms(self, model, X: Tensor, y: Tensor, num_data: int, comm: Comm,
                               share: float) -> NaturalGradientTerms:
        """The terms of a natural-gradient step on the global batch (see
        :meth:`~gpscale.models.variational.engine.VariationalGP.natural_gradient_step`)."""

    @abstractmethod
    def posterior(self, model) -> dict[str, Tensor]:
        """The prediction cache: q fixed with the factors its predictive needs."""

    @abstractmethod
    def predict_chunk(self, model, X: Tensor) -> tuple[Tensor, Tensor]:
        """Mean and variance [c] (or [c, C]) of q(f) at X [c, d], from the cache."""

    @abstractmethod
    def predictive_factors(self, model, X: Tensor) -> PredictiveFactors:
        """q(f) at X [c, d] as a mean and low-rank factors of its covariance, from the cache."""

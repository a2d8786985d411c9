"""The whitened parametrisation of the variational engine's q: ``q(v) = N(m, S S^T)`` with ``u = L v``,
``L L^T = Kuu``, so that the prior is N(0, I) whatever the kernel and the features, and

    q(f(x)) = N(a^T m,  k(x, x) - a^T a + a^T S S^T a),   a = L^{-1} k_u(x).

It takes features in independent blocks and several latent functions. The features' side of it (``Lu``,
``conditional``, ``whitened_moments``, ``marginals``) is the model's, which a method specialises (blocks on several
devices, basis weights whose Kuu is I); this class maps q's parameters onto it.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ...distributed import Comm
from ...linalg import CORE, solve_lower, tril_outer
from ..base import PredictiveFactors
from .gaussian_q import gauss_kl_whitened
from .parametrisation import NaturalGradientTerms, QParametrisation

__all__ = ["WhitenedQ"]


class WhitenedQ(QParametrisation):
    """q(v) = N(m, S S^T) against the prior N(0, I) (see the module docstring); q_mu [(T,) (C,) m] and q_sqrt
    [(T,) (C,) m, m] over T blocks and C latent functions."""

    def prior_sqrt(self, model) -> Tensor:
        return torch.eye(model.q_mu.shape[-1]).expand_as(model.q_sqrt_raw)

    def kl(self, model, q_mu: Tensor, q_sqrt: Tensor) -> Tensor:
        return gauss_kl_whitened(q_mu, q_sqrt)

    def elbo(self, model, X: Tensor, y: Tensor, num_data: int, q_mu: Tensor, q_sqrt: Tensor) -> Tensor:
        conditional = model.projected_conditional if model.projects(X) else model.conditional
        mean, var = conditional(X, model.Lu(), q_mu, q_sqrt)
        expected = model.likelihood.expected_log_prob(y, mean, var).sum()
        return (num_data / X.shape[0]) * expected.to(CORE) - model.prior_kl(q_mu, q_sqrt)

    def natural_gradient_terms(self, model, X: Tensor, y: Tensor, num_data: int, comm: Comm,
                               share: float) -> NaturalGradientTerms:
        """With a = L^{-1} k_u(x) [(T,) m, b], the batch's means are ``a^T m``, so ``dELBO / dm = a g_mean - m``
        (K = I). The batch's terms are formed in its dtype, as the loss forms them (A, with its graph, is the
        loss's own within a training step: see :meth:`VariationalGP.step_shared`), and summed into the float64
        step."""
        with torch.no_grad():
            m, L = model.q_mu.detach().to(CORE), model.q_sqrt.detach().to(CORE)
        if X.shape[0]:
            Kuf, Kff_diag = model.batch_kernels(X)
            Lu = model.Lu()
            if isinstance(Lu, list):  # blocks placed on several devices (HVGP): the step runs on the batch's
                A = solve_lower(torch.cat([part.detach().to(X.device) for part in Lu]).to(X.dtype), Kuf.detach())
            else:
                A = model.whitened_Kuf(X, Lu, Kuf).detach()  # [(T,) m, b]
            with torch.no_grad():
                mean, variance, nystrom = (t.to(CORE) for t in model.whitened_moments(A, m.to(A.dtype),
                                                                                      L.to(A.dtype)))
            mean.requires_grad_(True)
            variance.requires_grad_(True)
            f_mean, f_var = model.marginals(Kff_diag.detach().to(CORE), mean, variance, nystrom)
            expected = model.likelihood.expected_log_prob(y.to(CORE), f_mean, f_var).sum()
            g_mean, g_var = torch.autograd.grad((num_data / X.shape[0]) * expected, [mean, variance])
            if model.n_latent > 1:
                A = A.unsqueeze(-3)  # shared by the C latent functions
            g_m = share * (A * g_mean.to(A.dtype).unsqueeze(-2)).sum(-1).to(CORE)  # [(T,) (C,) m]
            lower = tril_outer(A * (share * g_var).to(A.dtype).unsqueeze(-2), A)  # of the symmetric A diag(g) A^T
            data_term = (lower + lower.tril(-1).mT).to(CORE)  # [(T,) (C,) m, m]
        else:  # none of the global batch's rows are here
            g_m, data_term = torch.zeros_like(m), torch.zeros_like(L)
        g_m, data_term = comm.all_reduce_sum(g_m) - m, comm.all_reduce_sum(data_term)  # - m: the KL's gradient
        return m, L, g_m, data_term, torch.eye(m.shape[-1], dtype=CORE, device=m.device)

    def posterior(self, model) -> dict[str, Tensor]:
        """Kuu's Cholesky factor and q(v)."""
        return {"Lu": model.Lu(), "q_mu": model.q_mu.detach().clone(), "q_sqrt": model.q_sqrt.detach().clone()}

    def predict_chunk(self, model, X: Tensor) -> tuple[Tensor, Tensor]:
        # the conditional of training: blocks on their devices, one column per latent function
        return model.conditional(X, model.cache["Lu"], model.cache["q_mu"], model.cache["q_sqrt"])

    def predictive_factors(self, model, X: Tensor) -> PredictiveFactors:
        """With ``a = L^{-1} Kuf`` over every block: mean ``a^T m`` and covariance ``K - a^T a + (S^T a)^T (S^T a)``
        (one latent function, blocks on one device)."""
        Lu = model.cache["Lu"]
        if model.n_latent > 1 or isinstance(Lu, list):
            raise NotImplementedError(f"The joint predictive of {model.key or type(model).__name__} is computed for "
                                      "one latent function with its blocks on one device; use the marginal "
                                      "predictive (predict) instead.")
        A = solve_lower(Lu.to(X.dtype), model.features.Kuf(X))  # [(T,) m, c]
        mean = (A * model.cache["q_mu"].to(A.dtype).unsqueeze(-1)).sum(-2)
        SA = model.cache["q_sqrt"].to(A.dtype).mT @ A
        if model.blocks is not None:
            mean = mean.sum(0)
        return PredictiveFactors(mean, A.reshape(-1, A.shape[-1]), SA.reshape(-1, SA.shape[-1]))

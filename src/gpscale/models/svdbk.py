"""SVDBK: a deep basis kernel GP with stochastic variational inference on its weights (Zhu, Yuchi & Xie 2025, the
paper's second model; the kernel, the variance correction and the shared options are :mod:`gpscale.models.dbk`'s).

In weight space ``f(x) = phi(x)^T w`` with ``w ~ N(0, I_r)``; SVDBK keeps ``q(w) = N(m, L L^T)`` and trains on
minibatches with the ELBO of the paper's eq. 9 (n / b scaling), predicting with its eq. 10
(``Var f* = ||L^T phi*||^2``), plus the correction c(x*) where it is on.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..distributed import LOCAL, Comm
from ..kernels import inverse_softplus
from ..kernels.deep_basis import prior_variance
from ..linalg import CORE
from ._gaussian_q import gauss_kl_whitened
from ._weight_space import maximise_over_noise
from .base import PredictiveFactors, register
from .dbk import DeepBasisModel, trace_penalty, variance_correction

__all__ = ["SVDBK"]


@register("svdbk")
class SVDBK(DeepBasisModel):
    """Deep basis kernel GP with stochastic variational inference on w (SVDBK), trained on minibatches.

    ``q(w) = N(m, L L^T)`` with ``L = tril(raw, -1) + diag(softplus(raw_diag))``, so diag(L) > 0 and log|L L^T| is
    finite; it starts at the prior (m = 0, L = I). Each step costs O(b r^2). Prediction needs k_max over the whole
    training set, which :meth:`fit_posterior` computes in one pass.

    Args: those of :class:`DeepBasisModel`.
    """

    def __init__(self, n_features: int, **kwargs):
        super().__init__(n_features, **kwargs)
        r = self.n_basis
        # the correction's k_max is the maximum over the whole batch, which every part of it needs
        self.data_parallel = "batch" if self.correction else "rows"
        self.q_mu = nn.Parameter(torch.zeros(r))
        self.q_sqrt_tril = nn.Parameter(torch.zeros(r, r))  # only the strict lower triangle is used
        self.q_sqrt_diag = nn.Parameter(inverse_softplus(torch.ones(r)))

    def init(self, X: Tensor, y: Tensor, seed: int = 0) -> None:
        super().init(X, y, seed)
        with torch.no_grad():  # q(w) = p(w), whatever an earlier fit left
            self.q_mu.zero_()
            self.q_sqrt_tril.zero_()
            self.q_sqrt_diag.copy_(inverse_softplus(torch.ones_like(self.q_sqrt_diag)))

    @property
    def q_sqrt(self) -> Tensor:
        """L [r, r], lower triangular with a positive diagonal."""
        return torch.tril(self.q_sqrt_tril, -1) + torch.diag(nn.functional.softplus(self.q_sqrt_diag))

    def elbo_from_basis(self, Phi: Tensor, y: Tensor, num_data: int) -> Tensor:
        """Eq. 9 from basis rows Phi [b, r] and targets y [b] (float64 scalar):

            (n / b) sum_i [log N(y_i | m^T phi_i, sigma^2) - ||L^T phi_i||^2 / (2 sigma^2)] - KL(q(w) || N(0, I)).
        """
        L = self.q_sqrt.to(Phi.dtype)
        mean = Phi @ self.q_mu.to(Phi.dtype)  # [b]
        # ||L^T phi_i||^2 as the squared norms of the rows phi_i^T L of Phi L (Phi L^T would give ||L phi_i||^2)
        var = ((Phi @ L) ** 2).sum(-1)
        expected = self.likelihood.expected_log_prob(y, mean, var).sum()
        return (num_data / Phi.shape[0]) * expected.to(CORE) - gauss_kl_whitened(self.q_mu.to(CORE), L.to(CORE))

    def elbo(self, X: Tensor, y: Tensor, num_data: int) -> Tensor:
        """Unbiased minibatch estimate of the ELBO (eq. 8) of a set of ``num_data`` points; tight at q = p(w | y)."""
        return self.elbo_from_basis(self.kernel.basis(X), y, num_data)

    def objective(self, X: Tensor, y: Tensor, num_data: int) -> Tensor:
        """The ELBO minus the batch trace penalty, or the ELBO without the correction."""
        Phi = self.kernel.basis(X)
        elbo = self.elbo_from_basis(Phi, y, num_data)
        return elbo - self.penalty(Phi, num_data) if self.correction else elbo

    def loss(self, X: Tensor, y: Tensor, num_data: int, comm: Comm = LOCAL, share: float = 1.0) -> Tensor:
        if comm.world_size == 1:
            return -self.objective(X, y, num_data) / num_data
        return -self.objective_part(X, y, num_data, comm, share) / num_data

    def objective_part(self, X: Tensor, y: Tensor, num_data: int, comm: Comm, share: float) -> Tensor:
        """This process's part of :meth:`objective` for a batch split over processes, X [b_r, d] holding a
        ``share`` b_r / B of its rows (possibly none): the parts, weighted by their shares, sum to the objective.

        k_max, the batch's maximum prior variance, comes from a forward all-gather. Its gradient is not
        differentiated through a collective, whose backward pass ranks with different graphs would interleave
        differently with DistributedDataParallel's reductions. The objective's derivative with respect to k_max is
        N / (2 sigma^2) whatever the split, so the rank holding the maximum adds a zero-valued term with exactly
        that gradient through its own maximum."""
        Phi = self.kernel.basis(X)
        k = prior_variance(Phi).to(CORE)
        local_max = k.max() if k.numel() else torch.tensor(-math.inf, dtype=CORE, device=k.device)
        maxima = comm.all_gather(local_max.detach().reshape(1))
        if not X.shape[0]:
            return torch.zeros((), dtype=CORE, device=k.device)
        k_max, noise = maxima.max(), self.noise.to(CORE)
        objective = self.elbo_from_basis(Phi, y, num_data) - trace_penalty(k, k_max, noise, num_data)
        if comm.rank == int(maxima.argmax()):
            objective = objective - num_data / (2 * noise.detach()) * (local_max - local_max.detach()) / share
        return objective

    @torch.no_grad()
    def fit_posterior(self, X: Tensor, y: Tensor, comm: Comm = LOCAL) -> None:
        # q(w) is the posterior; the correction also needs the training k_max
        self.clear_cache()  # a previous calibration must not be the starting point of this one
        self.record_training_box(X, comm)
        self.cache.update(q_mu=self.q_mu.detach().to(CORE), q_sqrt=self.q_sqrt.detach().to(CORE))
        if not self.calibrate_noise:
            if self.correction:
                self.cache["k_max"] = comm.all_reduce_max(self.max_prior_variance(X))
            return
        e, k = self.expected_squared_errors(X, y)  # one pass serves k_max and the noise search
        c = torch.zeros_like(k)
        if self.correction:
            self.cache["k_max"] = comm.all_reduce_max(k.max())
            c = variance_correction(k, self.cache["k_max"])
        self.set_calibrated_noise(self.expected_log_likelihood_optimal_noise(e, c, y, comm))

    @torch.no_grad()
    def expected_squared_errors(self, X: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """``e_i = E_q (y_i - phi_i^T w)^2 = (y_i - m^T phi_i)^2 + ||L^T phi_i||^2`` and the prior variances
        ``k_i = ||phi_i||^2`` of the rows X [n, d], y [n]: two [n] float64 vectors, in one chunked pass."""
        errors, variances = [], []
        for Xc, yc in zip(X.split(self.chunk_size), y.split(self.chunk_size)):
            Phi = self.kernel.basis(Xc).to(CORE)
            spread = ((Phi @ self.cache["q_sqrt"]) ** 2).sum(-1)
            errors.append((yc.to(CORE) - Phi @ self.cache["q_mu"]) ** 2 + spread)
            variances.append(prior_variance(Phi))
        return torch.cat(errors), torch.cat(variances)

    def expected_log_likelihood_optimal_noise(self, e: Tensor, c: Tensor, y: Tensor, comm: Comm = LOCAL) -> float:
        """``argmax_{sigma^2} sum_i E_q log N(y_i | phi_i^T w, sigma^2 + c_i)`` with q(w) and the network fixed,
        ``-1/2 sum_i [log 2 pi s_i + e_i / s_i]`` with ``s_i = sigma^2 + c_i``, from the expected squared errors
        e [n] and corrections c [n] of this process's rows y [n]: O(n) per evaluation."""
        total = comm.all_reduce_sum(torch.stack([(y.to(CORE) ** 2).sum(), torch.tensor(y.shape[0], dtype=CORE)]))
        bounds = self.noise_search_bounds(float(total[0] / total[1]))

        def expected_log_likelihood_at(s2: float) -> float:
            s = s2 + c
            return float(comm.all_reduce_sum(-0.5 * ((2 * math.pi * s).log() + e / s).sum()))

        return maximise_over_noise(expected_log_likelihood_at, *bounds, grid_points=60)

    def predictive_factors(self, X: Tensor) -> PredictiveFactors:
        """Mean ``m^T phi*`` and variance ``||L^T phi*||^2 + c(x*)`` (eq. 10 with sigma^2 -> sigma^2 + c(x*))."""
        Phi = self.kernel.basis(X).to(CORE)  # [c, r]
        return PredictiveFactors(Phi @ self.cache["q_mu"], None, (Phi @ self.cache["q_sqrt"]).T,
                                 self.predictive_extra(Phi))


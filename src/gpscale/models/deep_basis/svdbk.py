"""SVDBK: a deep basis kernel GP with stochastic variational inference on its weights (Zhu, Yuchi & Xie 2025, the
paper's second model; the kernel, the variance correction and the shared options are
:mod:`gpscale.models.deep_basis.dbk`'s).

In weight space ``f(x) = phi(x)^T w`` with ``w ~ N(0, I_r)``: the weights are inducing variables whose features are
the basis rows, ``Kuu = Cov(w) = I_r`` and ``Kuf = Cov(w, f(X)) = Phi^T`` (:class:`BasisWeights`). So SVDBK is the
variational engine (:class:`~gpscale.models.variational.engine.VariationalGP`) on the rows ``phi(X)`` of the network:
``q(w) = N(m, S S^T)`` (the whitened q, since Kuu = I), the minibatch ELBO of the paper's eq. 9 (n / b scaling),

    (n / b) sum_i E_q log p(y_i | phi_i^T w) - KL(q(w) || N(0, I)),

with ``E_q log N(y_i | phi_i^T w, sigma^2) = log N(y_i | m^T phi_i, sigma^2) - ||S^T phi_i||^2 / (2 sigma^2)``, and
the predictive of its eq. 10 (``Var f* = ||S^T phi*||^2``), plus the correction c(x*) where it is on. From the engine
it also takes natural-gradient steps on q and the classification likelihoods.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from ...defaults import TrainingDefaults
from ...device import chunks_on
from ...distributed import LOCAL, Comm
from ...kernels.deep_basis import prior_variance
from ...linalg import CORE
from ..variational.engine import VariationalGP
from ..linear.weight_space import maximise_over_noise
from ..base import BenchSize, PredictiveFactors, register
from .dbk import DeepBasisModel, trace_penalty, variance_correction
from ..inducing import InducingFeatures

__all__ = ["SVDBK", "BasisWeights"]


class BasisWeights(InducingFeatures):
    """The weights w ~ N(0, I_r) of ``f = phi^T w`` as inducing variables, on rows P [c, r] of basis values:
    ``Kuu = I_r``, ``Kuf(P) = P^T`` [r, c] and ``Kff_diag(P) = ||p||^2`` [c]."""

    def __init__(self, r: int):
        super().__init__()
        self.num_inducing = int(r)
        self.register_buffer("identity", torch.eye(r, dtype=CORE), persistent=False)

    def Kuu(self) -> Tensor:
        return self.identity

    def Kuf(self, P: Tensor) -> Tensor:
        return P.T

    def Kff_diag(self, P: Tensor) -> Tensor:
        return prior_variance(P)


@register("svdbk")
class SVDBK(DeepBasisModel, VariationalGP):
    """Deep basis kernel GP with stochastic variational inference on w (SVDBK), trained on minibatches.

    q(w) starts at the prior (m = 0, S = I). Each step costs O(b r^2) besides the network. Prediction needs k_max
    over the whole training set, which :meth:`fit_posterior` computes in one pass.

    Args:
        natural_gradients: move q(w) by natural-gradient steps (default False: Adam on m and S with the rest, the
            paper's training).
        jitter: added to Kuu = I (default 0: the identity needs none).
        whiten: only True: with Kuu = I the whitened q is q(w) itself.
        **kwargs: those of :class:`DeepBasisModel` and the engine's ``natgrad_step``.
    """

    # a network's small Adam steps (as dbk's), on small batches of cheap steps
    default_training = TrainingDefaults("adam", lr=1e-3, batch_size=256, max_steps=20_000)
    auto_dtype = "float32"  # faster than float64 at the same accuracy
    floor_sizes = {"small": BenchSize(2000, 8, {}, 256), "paper": BenchSize(13500, 26, {}, 1024)}

    calibration_modes = (None, "variance")

    def __init__(self, n_features: int, *, natural_gradients: bool = False, jitter: float = 0.0, whiten: bool = True,
                 **kwargs):
        if whiten is not True:
            raise ValueError(f"svdbk's q is over the weights w ~ N(0, I), for which whitening changes nothing: whiten "
                             f"takes only True, got {whiten!r}.")
        super().__init__(n_features, natural_gradients=natural_gradients, jitter=jitter, **kwargs)
        self.features = BasisWeights(self.n_basis)
        self.initialise_q(self.n_basis)

    def initialise_from_data(self, X: Tensor, y: Tensor, seed: int = 0) -> None:
        super().initialise_from_data(X, y, seed)
        self.initialise_q_at_prior()  # whatever an earlier fit left

    def prior_variance(self, X: Tensor) -> Tensor:
        return prior_variance(self.kernel.basis(X))

    # --- the engine with Kuu = I: its Cholesky factor is I and the whitened features are the basis rows -----------
    def Lu(self) -> Tensor:
        return self.features.identity

    def conditional(self, P: Tensor, Lu: Tensor, q_mu: Tensor, q_sqrt: Tensor) -> tuple[Tensor, Tensor]:
        """q(f) at basis rows P [c, r]: the engine's moments with ``A = L^{-1} Kuf = P^T``, no solve (a contiguous
        copy: the moments' element-wise products run slower on a transposed view), and no
        Nyström residual: k(x, x) = ||phi||^2 = a^T a, so the variance is ||S^T phi||^2 (eq. 10) and neither
        square norm is formed."""
        return self.marginals(None, *self.whitened_moments(P.T.contiguous(), q_mu, q_sqrt, nystrom=False))

    def projects(self, P: Tensor) -> bool:
        return False  # with A = P^T the plain moments cost r^2 b, less than the projection's r^3 + r^2 b

    # --- the objective: the engine's on the basis rows ----------------------------------------------------------
    def elbo(self, X: Tensor, y: Tensor, num_data: int, q_mu: Tensor | None = None,
             q_sqrt: Tensor | None = None) -> Tensor:
        """Unbiased minibatch estimate of the ELBO (eq. 8) of a set of ``num_data`` points; tight at q = p(w | y)."""
        return self.basis_elbo(self.kernel.basis(X), y, num_data, q_mu, q_sqrt)

    def basis_elbo(self, Phi: Tensor, y: Tensor, num_data: int, q_mu: Tensor | None = None,
                   q_sqrt: Tensor | None = None) -> Tensor:
        """The ELBO from the batch's basis rows Phi [b, r]."""
        return super().elbo(Phi, y, num_data, q_mu, q_sqrt)

    def objective(self, X: Tensor, y: Tensor, num_data: int, comm: Comm = LOCAL, share: float = 1.0,
                  q_mu: Tensor | None = None, q_sqrt: Tensor | None = None) -> Tensor:
        """This process's part of ``ELBO - tr(C) / (2 sigma^2)`` (eq. 9 minus eq. 11's penalty, with the batch's
        k_max), or the ELBO without the correction, for its ``share`` of a batch (see :meth:`GPModel.loss`)."""
        Phi = self.kernel.basis(X)
        elbo = self.basis_elbo(Phi, y, num_data, q_mu, q_sqrt)
        return elbo - self.penalty_part(Phi, num_data, comm, share) if self.correction else elbo

    def loss(self, X: Tensor, y: Tensor, num_data: int, comm: Comm = LOCAL, share: float = 1.0) -> Tensor:
        return -self.objective(X, y, num_data, comm, share, *self.q_for_loss()) / num_data

    def penalty_part(self, Phi: Tensor, num_data: int, comm: Comm, share: float) -> Tensor:
        """This process's part of the trace penalty of a batch whose basis rows are split over processes, Phi
        [b_r, r] holding a ``share`` b_r / B of them (possibly none): the parts, weighted by their shares, sum to
        the batch's penalty.

        k_max, the batch's maximum prior variance, comes from a forward all-gather. Its gradient is not
        differentiated through a collective, whose backward pass ranks with different graphs would interleave
        differently with DistributedDataParallel's reductions. The penalty's derivative with respect to k_max is
        N / (2 sigma^2) whatever the split, so the rank holding the maximum adds a zero-valued term with exactly
        that gradient through its own maximum."""
        k = prior_variance(Phi).to(CORE)
        if comm.world_size == 1:
            return trace_penalty(k, k.max(), self.noise.to(CORE), num_data)
        local_max = k.max() if k.numel() else torch.tensor(-math.inf, dtype=CORE, device=k.device)
        maxima = comm.all_gather(local_max.detach().reshape(1))
        if not k.numel():
            return torch.zeros((), dtype=CORE, device=k.device)
        noise = self.noise.to(CORE)
        penalty = trace_penalty(k, maxima.max(), noise, num_data)
        if comm.rank == int(maxima.argmax()):
            penalty = penalty + num_data / (2 * noise.detach()) * (local_max - local_max.detach()) / share
        return penalty

    def natural_gradient_step(self, X: Tensor, y: Tensor, num_data: int, comm: Comm = LOCAL,
                              share: float = 1.0) -> None:
        """The engine's step on q(w), from the batch's basis rows (the penalty does not depend on q)."""
        if self.natural_gradients:
            with torch.no_grad():
                Phi = self.kernel.basis(X)
            super().natural_gradient_step(Phi, y, num_data, comm, share)

    # --- posterior ----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def fit_posterior(self, X: Tensor, y: Tensor, comm: Comm = LOCAL) -> None:
        # q(w) is the posterior; the correction also needs the training k_max
        self.clear_cache()  # a previous calibration must not be the starting point of this one
        super().fit_posterior(X, y, comm)
        self.record_training_box(X, comm)
        if self.calibrate_noise is None:
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
        """``e_i = E_q (y_i - phi_i^T w)^2 = (y_i - m^T phi_i)^2 + ||S^T phi_i||^2`` and the prior variances
        ``k_i = ||phi_i||^2`` of the rows X [n, d], y [n]: two [n] float64 vectors, in one chunked pass."""
        errors, variances = [], []
        for Xc, yc in chunks_on(self.device, self.chunk_size, X, y):
            Phi = self.kernel.basis(Xc).to(CORE)
            mean, var = super().predict_chunk(Phi)
            errors.append((yc.to(CORE) - mean) ** 2 + var)
            variances.append(prior_variance(Phi))
        return torch.cat(errors), torch.cat(variances)

    def expected_log_likelihood_optimal_noise(self, e: Tensor, c: Tensor, y: Tensor, comm: Comm = LOCAL) -> float:
        """``argmax_{sigma^2} sum_i E_q log N(y_i | phi_i^T w, sigma^2 + c_i)`` with q(w) and the network fixed,
        ``-1/2 sum_i [log 2 pi s_i + e_i / s_i]`` with ``s_i = sigma^2 + c_i``, from the expected squared errors
        e [n] and corrections c [n] of this process's rows y [n]: O(n) per evaluation."""
        total = comm.all_reduce_sum(torch.stack([(y.to(CORE) ** 2).sum(),
                                                 torch.tensor(y.shape[0], dtype=CORE, device=y.device)]))
        bounds = self.noise_search_bounds(float(total[0] / total[1]))

        def expected_log_likelihood_at(s2: float) -> float:
            s = s2 + c
            return float(comm.all_reduce_sum(-0.5 * ((2 * math.pi * s).log() + e / s).sum()))

        return maximise_over_noise(expected_log_likelihood_at, *bounds, grid_points=60)

    def predict_chunk(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """q(f) at the basis rows of X (the engine's), its variance plus c(x*) (eq. 10 with sigma^2 -> sigma^2 +
        c(x*)); [c] or, with several latent functions, [c, C]."""
        Phi = self.kernel.basis(X).to(CORE)
        mean, var = super().predict_chunk(Phi)
        extra = self.predictive_extra(Phi)
        var = var + (extra if var.ndim == 1 else extra.unsqueeze(-1))
        return mean.to(X.dtype), var.to(X.dtype)

    def predictive_factors(self, X: Tensor) -> PredictiveFactors:
        """Mean ``m^T phi*``, spread ``S^T phi*`` and c(x*): f lies in the span of the bases, so no prior term."""
        Phi = self.kernel.basis(X).to(CORE)
        factors = super().predictive_factors(Phi)
        return PredictiveFactors(factors.mean, None, factors.spread, self.predictive_extra(Phi))

"""Engine for every SVGP-family method, generic over inducing features.

A method supplies an :class:`~gpscale.models.inducing.InducingFeatures` object with ``Kuu()``, ``Kuf(X)`` and
``Kff_diag(X)``.

:class:`VariationalGP` keeps a whitened ``q(v) = N(m, S S^T)`` with ``u = L v``, ``L L^T = Kuu``, so the prior is
N(0, I) and

    q(f(x)) = N(a^T m,  k(x, x) - a^T a + a^T S S^T a),   a = L^{-1} k_u(x),
    ELBO    = num_data / b * sum_{i in batch} E_q log p(y_i | f_i) - KL(q(v) || N(0, I))

(Hensman et al. 2013). ``loss`` returns ``-ELBO / num_data`` so that the learning rate does not depend on n.

:class:`OrthogonallyDecoupledGP` (Salimbeni et al. 2018a; with Fourier features as beta, Azzimonti et al.'s ODVFF)
adds a second basis for the mean only: inducing inputs gamma [M_g, d] with weights a, projected onto the orthogonal
complement of the features beta, whose q(beta) = N(m, S) is kept unwhitened (``Kbb`` is used through its
structured ``Kuu_operator()``):

    mean(x) = k(x, gamma) a + phi(x)^T Kbb^{-1} (m - Kbg a),       phi(x) = Kuf(x) = Cov(beta, f(x))
    var(x)  = k(x, x) - phi^T Kbb^{-1} phi + phi^T Kbb^{-1} S Kbb^{-1} phi
    KL      = KL(N(m, S) || N(0, Kbb)) + 1/2 (a^T Kgg a - (Kbg a)^T Kbb^{-1} (Kbg a))

No M_g x M_g matrix is ever factorised, so M_g can be large. (m, S) take natural-gradient steps by default
(:meth:`OrthogonallyDecoupledGP.natural_gradient_step`), everything else Adam.
"""
from __future__ import annotations

import warnings
from typing import NamedTuple

import torch
from torch import Tensor, nn

from ..distributed import LOCAL, Comm
from ..linalg import (CORE, NotPSDError, NumericalWarning, cholesky, inverse_cholesky, logdet_from_cholesky,
                      solve_lower, solve_upper)
from .base import GPModel, PredictiveFactors
from .inducing import jittered_cholesky, kmeans_centers

__all__ = ["VariationalGP", "OrthogonallyDecoupledGP", "gauss_kl_whitened"]


def gauss_kl_whitened(q_mu: Tensor, q_sqrt: Tensor) -> Tensor:
    """``KL(N(m, S S^T) || N(0, I)) = 1/2 (m^T m + tr(S S^T) - M - log|S S^T|)`` for lower-triangular S; with
    blocks (q_mu [T, m], q_sqrt [T, m, m]) the sum of the blocks' KLs."""
    mahalanobis = (q_mu * q_mu).sum()
    trace = (q_sqrt**2).sum()
    logdet_qcov = logdet_from_cholesky(q_sqrt).sum()
    return 0.5 * (mahalanobis + trace - q_mu.numel() - logdet_qcov)


def _sum_blocks(V: Tensor) -> Tensor:
    """[..., m, c] -> [c]: the sum over features and blocks."""
    return V.reshape(-1, V.shape[-1]).sum(0)


def natural_gradient_update(m: Tensor, S_inv: Tensor, g_m: Tensor, data_term: Tensor, prior_precision: Tensor,
                            rho: float) -> tuple[Tensor, Tensor, Tensor] | None:
    """One natural-gradient step of size ``rho`` on q = N(m, S) [..., M] (float64, any leading axes), from the
    ELBO's gradients (Salimbeni, Eleftheriadis & Hensman, "Natural gradients in practice", AISTATS 2018):

        theta_1 = S^{-1} m + rho (g_m - 2 g_S m),    theta_2 = -1/2 S^{-1} + rho g_S,
        S <- (-2 theta_2)^{-1},    m <- S theta_1,

    where ``g_m`` = dELBO / dm (the KL's part included) and ``g_S = data_term + 1/2 (S^{-1} - K^{-1})``: S enters
    the ELBO through the batch's variances, ``data_term = A diag(dELBO / dvar) A^T``, and the KL's ``tr(K^{-1} S)``
    and ``log|S|``, with K^{-1} the ``prior_precision`` (I for a whitened q). A step whose -2 theta_2 is not positive
    definite is halved, at most 10 times. Returns (m, lower L with L L^T = S, the new precision S^{-1}), or None when
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


class VariationalGP(GPModel):
    """A GP with a whitened Gaussian q over inducing features, trained on the minibatch ELBO.

    Subclasses set ``self.features`` (an :class:`InducingFeatures`) in ``__init__`` and call
    :meth:`init_variational` once its size is known. Two optional leading axes on q:

    - blocks: features in T independent blocks (the sub-GPs of HVGP) have Kuu [T, m, m] and Kuf [T, m, c]; q is
      block diagonal, q_mu [T, m] and q_sqrt [T, m, m], and f = sum_t f_t, each block whitened by its own
      Cholesky factor;
    - latent functions: a likelihood with ``n_latent`` = C > 1 (multiclass) has C independent GPs that share the
      features and the kernel, q_mu [(T,) C, m] and q_sqrt [(T,) C, m, m]; the moments are then [c, C].

    Args:
        jitter: added to the diagonal of Kuu (absolute).
        natural_gradients: move q(v) by natural-gradient steps (:meth:`natural_gradient_step`) before every Adam
            step, and leave it out of Adam (default True). A natural-gradient step follows q's own geometry: with a
            Gaussian likelihood, one step of size 1 on the full batch lands on the optimal q. Adam on the entries
            of m and S (``False``, as the papers' baselines and GPyTorch's examples) needs thousands of steps.
        natgrad_step: that step's size rho (default 0.1, for minibatches; see :func:`natural_gradient_update`).
    """

    likelihoods = ("gaussian", "bernoulli", "softmax", "robustmax")

    def __init__(self, n_features: int, *, jitter: float = 1e-6, natural_gradients: bool = True,
                 natgrad_step: float = 0.1, **kwargs):
        super().__init__(n_features, **kwargs)
        if not 0 < natgrad_step <= 1:
            raise ValueError(f"natgrad_step must be in (0, 1], got {natgrad_step}.")
        self.jitter = float(jitter)
        self.natural_gradients = bool(natural_gradients)
        self.natgrad_step = float(natgrad_step)
        self.n_latent = getattr(self.likelihood, "n_latent", 1)
        self.blocks: int | None = None

    def init_variational(self, m: int, blocks: int | None = None) -> None:
        """q(v) = N(0, I): q_mu [(blocks,) (C,) m] and q_sqrt [(blocks,) (C,) m, m]."""
        self.blocks = blocks
        batch = (() if blocks is None else (int(blocks),)) + (() if self.n_latent == 1 else (self.n_latent,))
        self.q_mu = nn.Parameter(torch.zeros(*batch, m))
        self.q_sqrt_raw = nn.Parameter(torch.eye(m).expand(*batch, m, m).clone())  # only its lower triangle is used

    @property
    def q_sqrt(self) -> Tensor:
        """S [m, m] (with the leading axes of q_mu), lower triangular."""
        return torch.tril(self.q_sqrt_raw)

    def Lu(self) -> Tensor:
        """Cholesky factor of Kuu + jitter I [m, m] (or [T, m, m]), float64."""
        return self.cholesky_Kuu(self.features.Kuu())

    def cholesky_Kuu(self, Kuu: Tensor) -> Tensor:
        """The Cholesky factor of ``Kuu + jitter I`` [..., m, m] in float64."""
        return jittered_cholesky(Kuu, self.jitter)

    def prior_kl(self, q_sqrt: Tensor | None = None, q_mu: Tensor | None = None) -> Tensor:
        q_sqrt = self.q_sqrt if q_sqrt is None else q_sqrt
        q_mu = self.q_mu if q_mu is None else q_mu
        return gauss_kl_whitened(q_mu.to(CORE), q_sqrt.to(CORE))

    def conditional(self, X: Tensor, Lu: Tensor, q_mu: Tensor, q_sqrt: Tensor) -> tuple[Tensor, Tensor]:
        """Mean and variance [c] (or [c, C]) of q(f) at X [c, d], given L [m, m] and q(v) = N(q_mu, q_sqrt q_sqrt^T)
        (blocks summed)."""
        A = solve_lower(Lu.to(X.dtype), self.features.Kuf(X))  # L^{-1} Kuf, [(T,) m, c]
        return self.marginals(X, *self.whitened_moments(A, q_mu, q_sqrt))

    def whitened_moments(self, A: Tensor, q_mu: Tensor, q_sqrt: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(a^T m, |S^T a|^2, |a|^2)`` [(C,) c], each summed over the blocks, for A = L^{-1} Kuf [(T,) m, c]."""
        if self.n_latent > 1:
            A = A.unsqueeze(-3)  # shared by the C latent functions: [(T,) 1, m, c]
        mean = (A * q_mu.to(A.dtype).unsqueeze(-1)).sum(-2)  # [(T,) (C,) c]
        SA = q_sqrt.to(A.dtype).mT @ A  # S^T L^{-1} Kuf, [(T,) (C,) m, c]
        moments = (mean, (SA * SA).sum(-2), (A * A).sum(-2))
        return moments if self.blocks is None else tuple(t.sum(0) for t in moments)

    def marginals(self, X: Tensor, mean: Tensor, variance: Tensor, nystrom: Tensor) -> tuple[Tensor, Tensor]:
        """q(f(X)) [c] (or [c, C]) from :meth:`whitened_moments`."""
        # k(x, x) - a^T a is the Nyström residual, >= 0 in exact arithmetic; clamping removes round-off only
        variance = (self.features.Kff_diag(X) - nystrom).clamp_min(0.0) + variance
        return (mean, variance) if self.n_latent == 1 else (mean.T, variance.T)

    def projects(self, X: Tensor) -> bool:
        """Whether the ELBO on the batch X takes :meth:`projected_conditional`: float64, one latent function and
        m at most half the batch."""
        return X.dtype == CORE and self.n_latent == 1 and 2 * self.q_mu.shape[-1] <= X.shape[0]

    def projected_conditional(self, X: Tensor, Lu: Tensor, q_mu: Tensor, q_sqrt: Tensor) -> tuple[Tensor, Tensor]:
        """The moments of :meth:`conditional`, with the m x m algebra done once per batch:

            a = L^{-T} m,   P = L^{-T} (S S^T - I) L^{-1},   mean = Kfu a,   var = kff + diag(Kfu P Kuf).

        The data-sized work is one [m, m] x [m, b] matmul forward and two backward (6 m^2 b flops), against a
        triangular solve and a matmul forward and their backward (10 m^2 b); the m x m part costs O(m^3), so this
        pays when m is well below the batch size. The variance is a difference of O(1) terms, not a squared norm,
        and its rounding grows with cond(Kuu): it serves the float64 training objective only; prediction keeps
        :meth:`conditional`.
        """
        eye = torch.eye(Lu.shape[-1], dtype=CORE, device=Lu.device)
        L_inv = solve_lower(Lu, eye)
        S = q_sqrt.to(CORE)
        a = (L_inv.mT @ q_mu.to(CORE).unsqueeze(-1)).squeeze(-1)
        P = L_inv.mT @ (S @ S.mT - eye) @ L_inv
        Kuf = self.features.Kuf(X)  # [m, b]
        mean = torch.einsum("...mc,...m->c", Kuf, a.to(X.dtype))
        return mean, self.features.Kff_diag(X) + _sum_blocks(Kuf * (P.to(X.dtype) @ Kuf))

    def elbo(self, X: Tensor, y: Tensor, num_data: int, q_mu: Tensor | None = None,
             q_sqrt: Tensor | None = None) -> Tensor:
        """Unbiased minibatch estimate of the ELBO of a set of ``num_data`` points, at q(v) = N(q_mu, q_sqrt
        q_sqrt^T) (default: the model's)."""
        q_mu = self.q_mu if q_mu is None else q_mu
        q_sqrt = self.q_sqrt if q_sqrt is None else q_sqrt
        conditional = self.projected_conditional if self.projects(X) else self.conditional
        mean, var = conditional(X, self.Lu(), q_mu, q_sqrt)
        expected = self.likelihood.expected_log_prob(y, mean, var).sum()
        return (num_data / X.shape[0]) * expected.to(CORE) - self.prior_kl(q_sqrt, q_mu)

    def loss(self, X: Tensor, y: Tensor, num_data: int) -> Tensor:
        if self.natural_gradients:  # q moves by natural-gradient steps alone: Adam needs no gradient for it
            return -self.elbo(X, y, num_data, self.q_mu.detach(), self.q_sqrt.detach()) / num_data
        return -self.elbo(X, y, num_data) / num_data

    def parameter_groups(self) -> list[dict]:
        natural = {id(self.q_mu), id(self.q_sqrt_raw)} if self.natural_gradients else set()
        return [{"params": [p for p in self.parameters() if p.requires_grad and id(p) not in natural]}]

    def natural_gradient_step(self, X: Tensor, y: Tensor, num_data: int, comm: Comm = LOCAL,
                              share: float = 1.0) -> None:
        """One natural-gradient step of size ``natgrad_step`` on every block's and latent function's whitened
        q(v) = N(m, S), the rest fixed (:func:`natural_gradient_update` with K = I). With a = L^{-1} k_u(x) [(T,) m,
        b], the batch's means are ``a^T m`` and its variances ``kff - |a|^2 + a^T S a``, summed over blocks, so
        ``dELBO / dm = a g_mean - m`` and the data term of ``dELBO / dS`` is ``a diag(g_var) a^T``, where g_mean and
        g_var are the expected log-likelihood's gradients with respect to the batch's means and variances. Under
        data parallelism the global batch's gradients are the sum over processes of ``share`` times each
        process's."""
        if not self.natural_gradients:
            return
        with torch.no_grad():
            Lu = self.Lu()
            if isinstance(Lu, list):  # blocks placed on several devices (HVGP): the step runs on the batch's
                Lu = torch.cat([part.to(X.device) for part in Lu])
            m, L = self.q_mu.detach().to(CORE), self.q_sqrt.detach().to(CORE)
        if X.shape[0]:
            with torch.no_grad():
                A = solve_lower(Lu, self.features.Kuf(X).to(CORE))  # [(T,) m, b]
                mean, variance, nystrom = self.whitened_moments(A, m, L)
            mean.requires_grad_(True)
            variance.requires_grad_(True)
            f_mean, f_var = self.marginals(X, mean, variance, nystrom)
            expected = self.likelihood.expected_log_prob(y.to(CORE), f_mean, f_var).sum()
            g_mean, g_var = torch.autograd.grad((num_data / X.shape[0]) * expected, [mean, variance])
            if self.n_latent > 1:
                A = A.unsqueeze(-3)  # shared by the C latent functions
            g_m = share * (A * g_mean.unsqueeze(-2)).sum(-1)  # [(T,) (C,) m]
            data_term = (A * (share * g_var).unsqueeze(-2)) @ A.mT  # [(T,) (C,) m, m]
        else:  # none of the global batch's rows are here
            g_m, data_term = torch.zeros_like(m), torch.zeros_like(L)
        g_m, data_term = comm.all_reduce_sum(g_m) - m, comm.all_reduce_sum(data_term)  # - m: the KL's gradient
        with torch.no_grad():
            eye = torch.eye(m.shape[-1], dtype=CORE, device=m.device)
            step = natural_gradient_update(m, torch.cholesky_inverse(L), g_m, data_term, eye, self.natgrad_step)
            if step is None:
                _warn_skipped_step(self.natgrad_step)
                return
            self.q_mu.copy_(step[0].to(self.q_mu))
            self.q_sqrt_raw.copy_(step[1].to(self.q_sqrt_raw))

    @torch.no_grad()
    def fit_posterior(self, X: Tensor, y: Tensor, comm: Comm = LOCAL) -> None:
        # q(v) is the posterior; the cache fixes it together with the Cholesky factor of Kuu
        self.cache = {"Lu": self.Lu(), "q_mu": self.q_mu.detach().clone(), "q_sqrt": self.q_sqrt.detach().clone()}

    def predict_chunk(self, X: Tensor) -> tuple[Tensor, Tensor]:
        # the conditional of training: blocks on their devices, one column per latent function
        return self.conditional(X, self.cache["Lu"], self.cache["q_mu"], self.cache["q_sqrt"])

    def prior_variance(self, X: Tensor) -> Tensor:
        return self.features.Kff_diag(X)

    def predictive_factors(self, X: Tensor) -> PredictiveFactors:
        """``q(f)`` at X [c, d] with ``a = L^{-1} Kuf`` over every block: mean ``a^T m`` and covariance
        ``K - a^T a + (S^T a)^T (S^T a)`` (one latent function, blocks on one device)."""
        Lu = self.cache["Lu"]
        if self.n_latent > 1 or isinstance(Lu, list):
            raise NotImplementedError(f"The joint predictive of {self.key or type(self).__name__} is computed for "
                                      "one latent function with its blocks on one device; use the marginal "
                                      "predictive (predict) instead.")
        A = solve_lower(Lu.to(X.dtype), self.features.Kuf(X))  # [(T,) m, c]
        mean = (A * self.cache["q_mu"].to(A.dtype).unsqueeze(-1)).sum(-2)
        SA = self.cache["q_sqrt"].to(A.dtype).mT @ A
        if self.blocks is not None:
            mean = mean.sum(0)
        return PredictiveFactors(mean, A.reshape(-1, A.shape[-1]), SA.reshape(-1, SA.shape[-1]))


def _warn_skipped_step(rho: float) -> None:
    warnings.warn(f"A natural-gradient step on q was skipped: S would not stay positive definite even at 1/1024 of "
                  f"the step. Pass a smaller natgrad_step (now {rho}) or a larger jitter.", NumericalWarning,
                  stacklevel=4)


class MeanWeights(NamedTuple):
    """The mean's coefficients: a on gamma [M_g], w on the features [M_b], and c = Kbg a [M_b]."""

    a: Tensor
    w: Tensor
    c: Tensor


class OrthogonallyDecoupledGP(GPModel):
    """The orthogonally decoupled SVGP (see the module docstring), trained on minibatches.

    Subclasses set ``self.features`` (the covariance basis beta, an :class:`InducingFeatures`) and call
    :meth:`init_variational` once the sizes are known; ``init`` places gamma.

    Args:
        n_mean_inducing: M_g, the inducing inputs of the mean basis gamma (0: an SVGP on the features).
        natural_gradients: take a natural-gradient step on (m, S) before every Adam step, and leave them out of
            Adam (default True, as the paper).
        natgrad_step: that step's size rho (default 0.1; 1 reaches the optimum of (m, S) in one step for a
            Gaussian likelihood on the full batch; minibatches need rho <= 0.1). A step that would make S
            indefinite is halved until it does not.
        jitter: added to the diagonal of a dense Kbb (inducing points), absolute.
    """

    likelihoods = ("gaussian", "bernoulli")

    sizes_capped_by_rows = ("n_mean_inducing",)

    def __init__(self, n_features: int, *, n_mean_inducing: int = 0, natural_gradients: bool = True,
                 natgrad_step: float = 0.1, jitter: float = 1e-6, **kwargs):
        super().__init__(n_features, **kwargs)
        if int(n_mean_inducing) != n_mean_inducing or n_mean_inducing < 0:
            raise ValueError(f"n_mean_inducing must be a non-negative integer, got {n_mean_inducing}.")
        if not 0 < natgrad_step <= 1:
            raise ValueError(f"natgrad_step must be in (0, 1], got {natgrad_step}.")
        self.n_mean_inducing = int(n_mean_inducing)
        self.natural_gradients = bool(natural_gradients)
        self.natgrad_step = float(natgrad_step)
        self.jitter = float(jitter)
        self.gamma = nn.Parameter(torch.zeros(self.n_mean_inducing, self.n_features))
        self.a_gamma = nn.Parameter(torch.zeros(self.n_mean_inducing))

    def init_variational(self, m: int) -> None:
        self.q_mu = nn.Parameter(torch.zeros(m))
        self.q_sqrt_raw = nn.Parameter(torch.eye(m))  # only its lower triangle is used

    def init_mean_basis(self, X: Tensor, seed: int) -> None:
        """gamma at k-means centres of the rows of X, a = 0."""
        if self.n_mean_inducing > X.shape[0]:
            raise ValueError(f"n_mean_inducing={self.n_mean_inducing} exceeds the {X.shape[0]} training rows; pass "
                             "at most one mean inducing point per row.")
        if self.n_mean_inducing:
            with torch.no_grad():
                self.gamma.copy_(kmeans_centers(X, self.n_mean_inducing, seed))
                self.a_gamma.zero_()

    def init_prior_covariance(self) -> None:
        """S = Kbb: q(beta) starts at the prior, so q(f) does."""
        with torch.no_grad():
            self.q_sqrt_raw.copy_(cholesky(self.Kbb().to_dense(), what="Kbb"))

    @property
    def q_sqrt(self) -> Tensor:
        """L_S [M_b, M_b], lower triangular, S = L_S L_S^T."""
        return torch.tril(self.q_sqrt_raw)

    def Kbb(self):
        """The covariance of the features, as an operator (float64)."""
        return self.features.Kuu_operator(self.jitter)

    def parameter_groups(self) -> list[dict]:
        natural = {id(self.q_mu), id(self.q_sqrt_raw)} if self.natural_gradients else set()
        return [{"params": [p for p in self.parameters() if p.requires_grad and id(p) not in natural]}]

    # --- the objective ------------------------------------------------------------------------------------
    def mean_weights(self, Kbb, q_mu: Tensor) -> MeanWeights:
        """a [M_g], w = Kbb^{-1} (m - Kbg a) [M_b] and c = Kbg a [M_b] (float64): computed once per objective, since
        the moments and the KL both need them."""
        a = self.a_gamma.to(CORE)
        c = self.features.Kuf(self.gamma).to(CORE) @ a if self.n_mean_inducing else torch.zeros_like(q_mu)
        return MeanWeights(a, Kbb.solve((q_mu - c).unsqueeze(-1)).squeeze(-1), c)

    def projections(self, X: Tensor, Kbb, weights: MeanWeights) -> tuple[Tensor, Tensor, Tensor]:
        """What q(f) at X [b, d] needs besides q(beta)'s covariance (float64): the mean [b], the residual
        k(x, x) - phi^T Kbb^{-1} phi [b] and A = Kbb^{-1} phi(x) [M_b, b], with ``weights`` from m. The variance is
        ``residual + diag(A^T S A)``."""
        Kbx = self.features.Kuf(X).to(CORE)  # [M_b, b]
        A = Kbb.solve(Kbx)
        mean = Kbx.T @ weights.w
        if self.n_mean_inducing:
            mean = mean + self.kernel(X, self.gamma).to(CORE) @ weights.a
        # k(x, x) - phi^T Kbb^{-1} phi >= 0 in exact arithmetic; the clamp removes round-off only
        residual = (self.features.Kff_diag(X).to(CORE) - (Kbx * A).sum(0)).clamp_min(0.0)
        return mean, residual, A

    def moments(self, X: Tensor, Kbb, weights: MeanWeights, L: Tensor) -> tuple[Tensor, Tensor]:
        """Mean and variance of q(f) at X [b, d] (float64) for q(beta) = N(m, L L^T), with ``weights`` from m."""
        mean, residual, A = self.projections(X, Kbb, weights)
        return mean, residual + (L.T @ A).square().sum(0)

    def prior_kl(self, Kbb, weights: MeanWeights, q_mu: Tensor, L: Tensor) -> Tensor:
        """KL(N(m, L L^T) || N(0, Kbb)) + the orthogonal term; tr(Kbb^{-1} S) from L, never forming S."""
        kl_beta = 0.5 * (Kbb.inv_quad(L) - L.shape[0] + Kbb.logdet() - logdet_from_cholesky(L)
                         + q_mu @ Kbb.solve(q_mu.unsqueeze(-1)).squeeze(-1))
        if not self.n_mean_inducing:
            return kl_beta
        # a^T (Kgg - Kgb Kbb^{-1} Kbg) a as two quadratic forms, never forming or factorising the M_g x M_g Schur
        # complement (so M_g can be large); it is >= 0 in exact arithmetic, and the clamp removes round-off below 0
        a, c = weights.a, weights.c
        Kgg = self.kernel(self.gamma, self.gamma).to(CORE)
        orthogonal = a @ Kgg @ a - c @ Kbb.solve(c.unsqueeze(-1)).squeeze(-1)
        return kl_beta + 0.5 * orthogonal.clamp_min(0.0)

    def _elbo(self, X: Tensor, y: Tensor, num_data: int, q_mu: Tensor, L: Tensor) -> Tensor:
        Kbb = self.Kbb()
        weights = self.mean_weights(Kbb, q_mu)
        mean, var = self.moments(X, Kbb, weights, L)
        expected = self.likelihood.expected_log_prob(y.to(CORE), mean, var).sum()
        return (num_data / X.shape[0]) * expected - self.prior_kl(Kbb, weights, q_mu, L)

    def elbo(self, X: Tensor, y: Tensor, num_data: int) -> Tensor:
        """Unbiased minibatch estimate of the ELBO of a set of ``num_data`` points (float64)."""
        return self._elbo(X, y, num_data, self.q_mu.to(CORE), self.q_sqrt.to(CORE))

    def loss(self, X: Tensor, y: Tensor, num_data: int) -> Tensor:
        m, L = self.q_mu.to(CORE), self.q_sqrt.to(CORE)
        if self.natural_gradients:  # (m, S) move by natural-gradient steps alone: Adam needs no gradient for them
            m, L = m.detach(), L.detach()
        return -self._elbo(X, y, num_data, m, L) / num_data

    # --- natural gradients --------------------------------------------------------------------------------
    def natural_gradient_step(self, X: Tensor, y: Tensor, num_data: int, comm: Comm = LOCAL,
                              share: float = 1.0) -> None:
        """One natural-gradient step of size ``natgrad_step`` on q(beta) = N(m, S), the rest fixed
        (:func:`natural_gradient_update`, with K = Kbb). S enters the ELBO through the batch's variances
        diag(A^T S A), so its data term ``A diag(g_v) A^T`` (``g_v = dELBO / dvar`` [b]) takes one [M_b, b] x
        [b, M_b] product where autograd through S would form S and differentiate an M_b x M_b solve. Under data
        parallelism the global batch's gradients are the sum over processes of ``share`` times each process's."""
        if not self.natural_gradients:
            return
        with torch.no_grad():
            L = self.q_sqrt.to(CORE)
            Kbb = self.Kbb()
            m = self.q_mu.detach().to(CORE).clone().requires_grad_(True)
        if X.shape[0]:
            weights = self.mean_weights(Kbb, m)
            mean, residual, A = self.projections(X, Kbb, weights)
            A = A.detach()
            feature_var = (L.T @ A).square().sum(0).requires_grad_(True)
            expected = self.likelihood.expected_log_prob(y.to(CORE), mean, residual.detach() + feature_var).sum()
            kl_m = 0.5 * m @ Kbb.solve(m.unsqueeze(-1)).squeeze(-1)  # the only other term with m in it
            g_m, g_v = torch.autograd.grad((num_data / X.shape[0]) * expected - kl_m, [m, feature_var])
            g_m, data_term = share * g_m, (A * (share * g_v)) @ A.T
        else:  # none of the global batch's rows are here
            g_m, data_term = torch.zeros_like(m), torch.zeros(L.shape, dtype=CORE, device=L.device)
        g_m, data_term = comm.all_reduce_sum(g_m), comm.all_reduce_sum(data_term)
        with torch.no_grad():
            eye = torch.eye(L.shape[0], dtype=CORE, device=L.device)
            step = natural_gradient_update(m.detach(), self._S_inverse(L), g_m, data_term, Kbb.solve(eye),
                                           self.natgrad_step)
            if step is None:
                _warn_skipped_step(self.natgrad_step)
                return
            m_new, L_new, precision = step
            self.q_sqrt_raw.copy_(L_new.to(self.q_sqrt_raw))
            self.q_mu.copy_(m_new.to(self.q_mu))
            self._precision = (self._q_sqrt_state(), precision)

    def _q_sqrt_state(self) -> tuple:
        raw = self.q_sqrt_raw
        return raw.data_ptr(), raw._version, raw.device, raw.dtype

    def _S_inverse(self, L: Tensor) -> Tensor:
        """S^{-1} [M_b, M_b] (float64): the precision the last natural-gradient step factored, while nothing has
        written to L_S since (its version counter says so), which saves a cholesky_inverse (2/3 M_b^3 flops) per
        step; otherwise from L."""
        state, precision = getattr(self, "_precision", (None, None))
        return precision if state == self._q_sqrt_state() else torch.cholesky_inverse(L)

    # --- posterior ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def fit_posterior(self, X: Tensor, y: Tensor, comm: Comm = LOCAL) -> None:
        # q is the posterior: cache Kbb's Cholesky factor, L_S, the mean weights and gamma
        Kbb = self.Kbb()
        w = self.mean_weights(Kbb, self.q_mu.to(CORE)).w
        self.cache = {"L_bb": cholesky(Kbb.to_dense(), what="Kbb"), "L_S": self.q_sqrt.detach().to(CORE).clone(),
                      "w": w, "a": self.a_gamma.detach().to(CORE).clone(), "gamma": self.gamma.detach().clone()}

    def prior_variance(self, X: Tensor) -> Tensor:
        return self.features.Kff_diag(X)

    def predictive_factors(self, X: Tensor) -> PredictiveFactors:
        """Mean ``phi^T w + k(x, gamma) a`` and covariance ``K - V^T V + (L_S^T A)^T (L_S^T A)`` with
        ``V = L_bb^{-1} phi`` (so ``V^T V = phi^T Kbb^{-1} phi``) and ``A = Kbb^{-1} phi``."""
        Kbx = self.features.Kuf(X).to(CORE)
        V = solve_lower(self.cache["L_bb"], Kbx)
        A = solve_upper(self.cache["L_bb"].T, V)
        mean = Kbx.T @ self.cache["w"]
        if self.n_mean_inducing:
            mean = mean + self.kernel(X, self.cache["gamma"]).to(CORE) @ self.cache["a"]
        return PredictiveFactors(mean, V, self.cache["L_S"].T @ A)


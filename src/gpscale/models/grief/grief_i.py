"""GP-GRIEF-I: type-I inference on re-weighted grid eigenfunctions (Evans & Nair, ICML 2018, Section 3.2).

The SE-ARD hyperparameters theta stay at their initialisation (an exact GP on a random subset of the rows, as the
paper's, :func:`~gpscale.models.grief.init.initialise_from_exact_gp`), so the features Phi are fixed; the initial noise
sigma_0^2 is by default the maximiser of the w = 1 GRIEF evidence at that theta (``init_noise="grief"``; the paper:
the exact GP's sigma^2). The evidences are :mod:`gpscale.models.grief.evidence`.
One streamed pass gives ``A = Phi^T Phi``, ``r = Phi^T y`` and y^T y; the chains then sample the weights and the noise of

    k~(x, z) = sum_i w_i phi_i(x) phi_i(z),    y = f + eps,  eps ~ N(0, sigma^2),

in ``x = (log u, log sigma^2)`` under the paper's log-normal priors (u_i: mode 1, variance 100; sigma^2: mode
sigma_0^2, variance 0.04), starting at their mode. Two samplers (the option ``sampler``): ``"hmc"`` (default,
:func:`gpscale.mcmc.hmc`), Hamiltonian Monte Carlo whose step size (dual averaging toward an acceptance rate of 0.8)
and diagonal mass matrix (the chains' pooled variances) adapt during burn-in, which moves all q + 1 coordinates at
their own scales; and ``"mala"`` (:func:`gpscale.mcmc.mala`), the paper's Langevin sampler, one isotropic step size
adapted during burn-in toward an acceptance rate of 0.574. Both then fix their kernel for the kept samples. Two
parametrisations of the weights the chains sample (the option ``parametrisation``), each with its own evaluation of
the evidence:

* ``"reweighted"``: eq. 18, u = w on the features themselves, O(p^3) per step; O(q^2 p) in the row space of Phi
  when its rank q is well below p (n < p), the same model.
* ``"orthogonal"``: the weights ``w~ = s^2 u`` on the orthogonalised basis ``Phi~ = U_s``, O(p) per
  step. The chain runs on the weights *relative to* ``s^2``: u = 1 is the w = 1 Nyström model, and the
  paper's (mode 1, variance 100) prior on u is the prior of w~ / s^2, so the start is again the prior mode and
  the w = 1 model. (A (mode 1, variance 100) prior on w~ itself would put the Nyström model, w~ = s^2 ~ n mu_i,
  far in the prior's tail.) It is a different model from eq. 16: its basis depends on the data.

Prediction: the predictive is an equal mixture over the S kept samples. Each sample's posterior of the
feature weights beta (``f(x) = phi(x)^T beta``) is Gaussian, ``N(P^{-1} r, sigma^2 P^{-1})`` with
``P = sigma^2 W^{-1} + A``, so by the law of total covariance the mixture of f* has

    mean = phi*^T m,   var f* = phi*^T C phi*,   m = mean_s m_s,   C = mean_s sigma_s^2 P_s^{-1} + cov_s(m_s),

i.e. the mean of the per-sample variances plus the variance of the per-sample means, exactly. The cache holds m
[p] and C [p, p] only: O(p^2) memory whatever S (per-sample Cholesky factors would take S p^2 numbers, S times
the cache's), and prediction costs what GP-GRIEF-II's does. After :meth:`fit_posterior` the likelihood's
sigma^2 is the posterior mean of sigma^2, so ``likelihood.predictive`` adds E[sigma^2] and gives the mixture's
variance of y* too; sigma_0^2 stays in the buffer ``noise0_``.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from ...distributed import LOCAL, Comm
from ...linalg import CORE, NotPSDError, solve_lower
from ...mcmc import ExpTransform, LogNormal, hmc, mala, transformed_log_target
from ..linear.weight_space import Statistics, weight_posterior_cholesky
from ..base import PredictiveFactors, register
from .grief_ii import GRIEFII
from .chains import check_mcmc_options, mcmc_settings, summarise, warn_if_unconverged
from .evidence import (
    orthogonal_log_likelihood,
    orthogonalise,
    reweighted_log_likelihood,
    row_space_factor,
    row_space_log_likelihood,
    weighted,
)

__all__ = ["GRIEFI", "ORTHOGONAL_ABOVE"]

ORTHOGONAL_ABOVE = 10**6  # "auto" takes the O(p) orthogonal form above this n, as the paper (only electric, n = 2M)
# The reweighted parametrisation evaluates eq. 18 in the row space of Phi when rank(Phi) = q < ROW_SPACE_BELOW p: the
# row space costs O(q^2 p) against the features' O(p^3), and the two cross a little above q = 0.65 p.
ROW_SPACE_BELOW = 0.65


# --- the two parametrisations ------------------------------------------------------------------------------------
class _Reweighted:
    """Eq. 18 on the features themselves: the chain's weights u are w [p]. Evaluated on ``A = Phi^T Phi`` in
    O(p^3), or in the row space of Phi in O(q^2 p) where its rank q is below ``ROW_SPACE_BELOW`` p (n < p: every
    set under 750 rows at the paper's p = 1000); ``form`` says which."""

    name = "reweighted"

    def __init__(self, stats: Statistics):
        self.stats = stats
        self.dim = stats.A.shape[0]
        basis = orthogonalise(stats)
        self.basis = basis if basis.s.shape[0] < ROW_SPACE_BELOW * self.dim else None

    @property
    def form(self) -> str:
        return "features" if self.basis is None else "row space"

    def log_likelihood(self, u: Tensor, noise: Tensor) -> Tensor:
        if self.basis is not None:
            return row_space_log_likelihood(u, noise, self.basis)
        return reweighted_log_likelihood(u, noise, self.stats)

    def weight_moments(self, u: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        """Mixture mean [p] and covariance [p, p] of beta over samples u [S, p], noise [S]; O(S p^3) time
        (O(S q p^2) in the row space), O(S p + p^2) memory."""
        posterior = self._row_space_posterior if self.basis is not None else self._features_posterior
        means, within = [], torch.zeros_like(self.stats.A)
        for w, s2 in zip(u, noise):
            mean, cov = posterior(w, s2)
            means.append(mean)
            within += cov
        return _mixture(torch.stack(means), within / len(means))

    def _features_posterior(self, w: Tensor, s2: Tensor) -> tuple[Tensor, Tensor]:
        """beta's posterior mean [p] and covariance ``sigma^2 P^{-1}`` [p, p] at one sample, from A."""
        post = weight_posterior_cholesky(weighted(self.stats, w), s2)
        root = w.sqrt()
        # sigma^2 P^{-1} = W^{1/2} B^{-1} W^{1/2}, B = L_B L_B^T = I + W^{1/2} A W^{1/2} / sigma^2: the engine's
        # well-conditioned B rather than P, whose sigma^2 / w diagonal can be tiny
        return root * post.weight_mean, root[:, None] * torch.cholesky_inverse(post.L_B) * root

    def _row_space_posterior(self, w: Tensor, s2: Tensor) -> tuple[Tensor, Tensor]:
        """The same in the row space: ``N(W G^T C^{-1} r~, W - W G^T C^{-1} G W)``, with ``B = L_C^{-1} G W`` the
        mean is ``B^T L_C^{-1} r~`` and the covariance ``W - B^T B``."""
        GW, L = row_space_factor(w, s2, self.basis)
        B = solve_lower(L, GW)
        return B.T @ solve_lower(L, self.basis.r.unsqueeze(-1)).squeeze(-1), torch.diag(w) - B.T @ B


class _Orthogonal:
    """Weights ``w~ = s^2 u`` [q] on the orthogonal basis ``phi~ = V^T phi / s``; O(q) per evaluation."""

    name = "orthogonal"

    def __init__(self, stats: Statistics):
        self.basis = orthogonalise(stats)
        self.dim = self.basis.s.shape[0]

    def log_likelihood(self, u: Tensor, noise: Tensor) -> Tensor:
        return orthogonal_log_likelihood(self.basis.s**2 * u, noise, self.basis)

    def weight_moments(self, u: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        """Mixture mean [p] and covariance [p, p] of beta over samples u [S, q], noise [S], mapped from the
        orthogonal basis by ``T = V / s`` [p, q] (``phi~ = T^T phi``, so beta = T beta~)."""
        w = self.basis.s**2 * u
        shrink = w / (w + noise[:, None])  # per sample, beta~ | y ~ N(shrink r~, diag(sigma^2 shrink))
        mean, cov = _mixture(shrink * self.basis.r, torch.diag((noise[:, None] * shrink).mean(0)))
        T = self.basis.V / self.basis.s
        return T @ mean, T @ cov @ T.T


def _mixture(means: Tensor, within: Tensor) -> tuple[Tensor, Tensor]:
    """Moments of an equal mixture of Gaussians with means [S, k] and average covariance ``within`` [k, k]:
    the mean of the means, and ``within`` plus the (population, divisor S) covariance of the means."""
    mean = means.mean(0)
    centred = means - mean
    return mean, within + centred.T @ centred / means.shape[0]


# --- the model ----------------------------------------------------------------------------------------------------
@register("grief-i")
class GRIEFI(GRIEFII):
    """GP-GRIEF-I: theta fixed at the exact-GP initialisation, MCMC over the eigenfunction weights and the noise.

    Training has nothing to optimise (``trainable = False``: :func:`gpscale.train.fit` skips its epochs).
    :meth:`fit_posterior` does the work: one streamed statistics pass, then ``n_chains`` chains seeded by fit's
    ``seed``.

    Args:
        n_eigen: p (default 1000, the paper's for type I; None gives type II's ``min(1000, 10^floor(log10 n))``).
        parametrisation: the weights the chains sample: ``"reweighted"`` (w on the features themselves, eq. 18,
            O(p^3) per step, O(n^2 p) for n < p), ``"orthogonal"`` (weights relative to s^2 on the orthogonal
            basis, O(p) per step) or ``"auto"`` (default): orthogonal when n > 10^6, as the paper.
        sampler: ``"hmc"`` (default): Hamiltonian Monte Carlo, step size and diagonal mass matrix adapted in
            burn-in (:func:`gpscale.mcmc.hmc`); ``"mala"``: the paper's Metropolis-adjusted Langevin sampler
            (:func:`gpscale.mcmc.mala`).
        n_iterations, burn_in, thin: iterations; iteration i is kept when ``i > burn_in and i % thin == 0``. None
            (default) takes the sampler's (:data:`~gpscale.models.grief.chains.SAMPLER_DEFAULTS`): HMC 300 / 150 /
            1 (149 samples per chain); MALA 10,000 / 1,000 / 50 (179 per chain, the paper's).
        n_chains: chains, all started at the prior mode; None: 4 for HMC, 2 for MALA (split R-hat compares chains).
        n_leapfrog: HMC's mean number of leapfrog steps per iteration (None: 8; MALA ignores it).
        step_size: the initial step; None: HMC's 0.1 (dual averaging then finds it), MALA's h = 0.4 (the
            official tutorial's).
        tune: ``"burn_in"`` (default): the step (and HMC's mass matrix) adapts during burn-in only, then stays
            fixed for the kept samples (MALA: Robbins-Monro toward an acceptance rate of 0.574 after every burn-in
            iteration); ``"never"``; for MALA also ``"always"``: the official code's rule (every 1000 iterations,
            x0.7 below 0.2 and x1.2 above 0.6 cumulative acceptance, never stopping: an adaptive chain).
        jacobian: include the exp transform's Jacobian ``sum(x)`` in the target (default True, the stated posterior);
            False drops it as the official code does (which samples softplus-transformed parameters).
        weight_prior_variance, noise_prior_variance: variances of the log-normal priors of u (mode 1) and sigma^2
            (mode sigma_0^2); the paper's 100 and 0.04.
        init_stretch: as :class:`GRIEFII`'s, but by default ``(1,)``: theta stays the exact GP's, as the paper
            (GRIEF-I never learns theta; a multi-start type-II fit of it would be a different method).
        **kwargs: the options of :class:`GRIEFII` (``grid_size``, ``init_exact_points``, ``init_iterations``,
            ``jitter``, ``kernel``, ``lengthscale``, ``outputscale``, ``noise``, ``chunk_size``, ...).

    After :meth:`fit_posterior`: ``mcmc_summary_`` (a dict of floats: acceptance rates, step sizes, split R-hat,
    classic and rank-normalised, and ESS, their worst values over (log u, log sigma^2), over the weights and
    sigma^2's own, the posterior mean of sigma^2), ``parametrisation_`` (the one used) and ``cache["samples"]``
    [C, S, q + 1] (the kept x = (log u, log sigma^2), saved with the model). A
    :class:`~gpscale.models.grief.chains.ConvergenceWarning` says when a chain accepted fewer than 5% of its
    proposals after burn-in, or the largest classic split R-hat over the weights and sigma^2 (all that is sampled:
    theta is fixed) exceeds 1.1 or is not finite.
    """

    trainable = False  # the chains run on the all-reduced statistics, identically seeded on every process
    # ``solver`` is the linear engine's algebra; the choice of the weights the chains sample is named for what it is
    renamed_options = {"solver": "parametrisation"}
    posterior_options = ("parametrisation", "sampler", "n_iterations", "burn_in", "thin", "n_chains", "n_leapfrog",
                         "step_size", "tune", "jacobian", "weight_prior_variance", "noise_prior_variance")
    default_training = None  # no optimiser: not GP-GRIEF-II's row
    floor_sizes = {}  # sampled by MCMC: no gradient step to time
    # the benchmark's warm-up: a short chain, since epochs do not shorten the MCMC of the posterior fit
    warm_up_options = {"n_iterations": 60, "burn_in": 20, "thin": 10}

    def __init__(self, n_features: int, n_eigen: int | None = 1000, *, parametrisation: str = "auto",
                 sampler: str = "hmc", n_iterations: int | None = None, burn_in: int | None = None,
                 thin: int | None = None, n_chains: int | None = None, n_leapfrog: int | None = None,
                 step_size: float | None = None, tune: str = "burn_in", jacobian: bool = True,
                 weight_prior_variance: float = 100.0, noise_prior_variance: float = 0.04,
                 init_stretch: tuple[float, ...] = (1.0,), **kwargs):
        super().__init__(n_features, n_eigen, init_stretch=init_stretch, **kwargs)
        self.parametrisation = parametrisation
        self.sampler = sampler
        self.n_iterations = n_iterations
        self.burn_in = burn_in
        self.thin = thin
        self.n_chains = n_chains
        self.n_leapfrog = n_leapfrog
        self.step_size = step_size
        self.tune = tune
        self.jacobian = jacobian
        self.weight_prior_variance = weight_prior_variance
        self.noise_prior_variance = noise_prior_variance
        check_mcmc_options(self)
        # sigma_0^2 (the noise prior's mode and the chain's start) and fit's seed travel with the model, so a loaded
        # model refits the same posterior; the likelihood's noise becomes E[sigma^2] after fit_posterior
        self.register_buffer("noise0_", self.noise.detach().clone())
        self.register_buffer("seed_", torch.tensor(0))
        self.parametrisation_: str | None = None
        self.mcmc_summary_: dict[str, float] = {}

    def check_posterior_options(self) -> None:
        check_mcmc_options(self)

    # --- initialisation and (no) training --------------------------------------------------------------------
    def initialise_from_data(self, X: Tensor, y: Tensor, seed: int = 0) -> None:
        """GRIEF's grid and exact-GP initialisation, which fixes theta and sigma_0^2; ``seed`` also seeds the
        MCMC."""
        super().initialise_from_data(X, y, seed)
        with torch.no_grad():
            self.noise0_.copy_(self.noise)
            self.seed_.fill_(int(seed))

    # --- the MCMC target ----------------------------------------------------------------------------------------
    def parametrised_evidence(self, stats: Statistics) -> _Reweighted | _Orthogonal:
        """The evidence in the parametrisation that ``self.parametrisation`` selects for statistics of n rows."""
        orthogonal = self.parametrisation == "orthogonal" or (self.parametrisation == "auto"
                                                              and stats.n > ORTHOGONAL_ABOVE)
        return _Orthogonal(stats) if orthogonal else _Reweighted(stats)

    def log_target(self, evidence: _Reweighted | _Orthogonal) -> Callable[[Tensor], Tensor]:
        """``x = (log u [q], log sigma^2) -> log p(y | u, sigma^2) + log p(u) + log p(sigma^2) (+ sum x)``, a
        differentiable float64 scalar for x [q + 1], or [C] for x [C, q + 1] (either form takes all chains at once);
        -inf (a rejected proposal) where the evidence fails or is not finite."""
        weight_prior = LogNormal.from_mode_variance(1.0, self.weight_prior_variance)
        noise_prior = LogNormal.from_mode_variance(float(self.noise0_), self.noise_prior_variance)
        reject = torch.tensor(-math.inf, dtype=CORE, device=self.noise0_.device)

        def log_posterior(f: Tensor) -> Tensor:
            u, noise = f[..., :-1], f[..., -1]
            try:
                lml = evidence.log_likelihood(u, noise)
            except NotPSDError:  # e.g. exp(x) overflowed: reject the proposal instead of stopping the chain
                return reject.expand(f.shape[:-1])
            lml = torch.where(torch.isfinite(lml), lml, reject)
            return lml + weight_prior.log_prob(u).sum(-1) + noise_prior.log_prob(noise)

        return transformed_log_target(log_posterior, ExpTransform, jacobian=self.jacobian)

    def start(self, evidence: _Reweighted | _Orthogonal) -> Tensor:
        """The prior mode ``x0 = (0 [q], log sigma_0^2)`` [q + 1]: u = 1, the w = 1 model of either form."""
        return torch.cat([torch.zeros(evidence.dim, dtype=CORE, device=self.noise0_.device),
                          self.noise0_.to(CORE).log().reshape(1)])

    # --- posterior ----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def fit_posterior(self, X: Tensor, y: Tensor, comm: Comm = LOCAL) -> None:
        """One statistics pass over (X, y), the chains, then the mixture moments of the weights (module
        docstring)."""
        self.check_posterior_options()  # posterior options may have been set as attributes since construction
        state = self.feature_state()  # kept: the cache must hold the eigenvectors (signs included) of Phi
        stats = self.statistics(X, y, comm, state)
        evidence = self.parametrised_evidence(stats)
        settings = mcmc_settings(self)
        budget = dict(n_iterations=int(settings["n_iterations"]), burn_in=int(settings["burn_in"]),
                      thin=int(settings["thin"]), step_size=float(settings["step_size"]), tune=self.tune,
                      n_chains=int(settings["n_chains"]), seed=int(self.seed_), vectorized=True)
        if self.sampler == "hmc":
            result = hmc(self.log_target(evidence), self.start(evidence), n_leapfrog=int(settings["n_leapfrog"]),
                         **budget)
        else:
            result = mala(self.log_target(evidence), self.start(evidence), **budget)
        x = result.flat_samples
        noise = x[:, -1].exp()
        mean, cov = evidence.weight_moments(x[:, :-1].exp(), noise)
        self.cache = {**state, "weight_mean": mean, "weight_cov": cov,
                      "samples": result.samples}
        # likelihood.predictive then adds E[sigma^2]: the mixture's variance of y* is E[var f*] + Var[mean f*] +
        # E[sigma^2]
        self.likelihood.set_noise(noise.mean())
        self.parametrisation_ = evidence.name
        self.mcmc_summary_ = summarise(result)
        warn_if_unconverged(self.mcmc_summary_, self)

    def predictive_factors(self, X: Tensor) -> PredictiveFactors:
        """The mixture's mean ``phi*^T m`` and covariance ``phi*^T C phi*'`` as ``U^T U``, ``U = C^{1/2} Phi^T``;
        O(c p^2)."""
        Phi = self.feature_map(self.cache)(X).to(CORE)
        return PredictiveFactors(Phi @ self.cache["weight_mean"], None, self.weight_cov_sqrt() @ Phi.T)

    def weight_cov_sqrt(self) -> Tensor:
        """``C^{1/2}`` [p, p], the symmetric root of the mixture's weight covariance (its eigenvalues, PSD up to
        round-off, clipped at 0), computed once per posterior."""
        if "weight_cov_sqrt" not in self.cache:
            eigenvalues, Q = torch.linalg.eigh(self.cache["weight_cov"].to(CORE))
            self.cache["weight_cov_sqrt"] = (Q * eigenvalues.clamp_min(0.0).sqrt()) @ Q.T
        return self.cache["weight_cov_sqrt"]

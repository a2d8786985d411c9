"""The MCMC pieces behind GP-GRIEF-I: spec §9 checks 15 (priors) and 16 (MALA), plus the Jacobian of pitfall 15,
the tuning/thinning rules of §3.10 and the convergence diagnostics."""
import math

import numpy as np
import pytest
import torch
from scipy import integrate, optimize, stats

from gpscale.mcmc import (
    ExpTransform,
    LogNormal,
    SoftplusTransform,
    effective_sample_size,
    hmc,
    kept_iterations,
    mala,
    split_rhat,
    transformed_log_target,
)
from gpscale.mcmc.hamiltonian import metric_windows

pytestmark = pytest.mark.usefixtures("one_thread")

f64 = torch.float64


def gaussian_target(mean, cov):
    """Vectorised log density of N(mean, cov) up to a constant: [C, D] -> [C]."""
    precision = torch.linalg.inv(cov)

    def log_target(x):
        d = x - mean
        return -0.5 * ((d @ precision) * d).sum(-1)

    return log_target


def ar1(rho, chains, draws, dim, seed):
    """AR(1) chains x_t = rho x_{t-1} + e_t, started in the stationary distribution. [chains, draws, dim]"""
    rng = np.random.default_rng(seed)
    e = rng.standard_normal((chains, draws, dim))
    x = np.empty_like(e)
    x[:, 0] = e[:, 0] / math.sqrt(1 - rho**2)
    for t in range(1, draws):
        x[:, t] = rho * x[:, t - 1] + e[:, t]
    return x


# ---------------------------------------------------------------------------------------------------------------
# Check 15: the log-normal prior from (mode, variance)
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode, variance, s, mu", [(1.0, 100.0, 1.1122, 1.2370), (0.1, 0.04, 0.7475, -1.7439)])
def test_lognormal_from_mode_variance_matches_the_papers_numbers(mode, variance, s, mu):
    prior = LogNormal.from_mode_variance(mode, variance)
    assert prior.s == pytest.approx(s, abs=5e-5) and prior.mu == pytest.approx(mu, abs=5e-5)
    # numerical mode of the density in x, found from log_prob itself
    res = optimize.minimize_scalar(
        lambda x: -prior.log_prob(torch.tensor(x, dtype=f64)).item(), bounds=(mode / 10, mode * 10),
        method="bounded", options={"xatol": 1e-10})
    assert res.x == pytest.approx(mode, rel=1e-4)
    # numerical moments of exp(log_prob) on x = e^t (dx = e^t dt): total mass 1, the stated variance
    t = torch.linspace(prior.mu - 14 * prior.s, prior.mu + 14 * prior.s, 200_001, dtype=f64)
    x = torch.exp(t)
    density_in_t = torch.exp(prior.log_prob(x) + t)
    mass, m1, m2 = (torch.trapezoid(density_in_t * x**k, t).item() for k in (0, 1, 2))
    assert mass == pytest.approx(1.0, rel=1e-8)
    assert m2 - m1**2 == pytest.approx(variance, rel=1e-6)


@pytest.mark.parametrize("mode, variance", [(1.0, 100.0), (3.0, 1e-12), (1e-3, 1e6), (2.5, 2.5)])
def test_lognormal_round_trips_mode_and_variance_over_scales(mode, variance):
    prior = LogNormal.from_mode_variance(mode, variance)
    assert prior.mode == pytest.approx(mode, rel=1e-12)
    assert prior.variance == pytest.approx(variance, rel=1e-9)


def test_lognormal_log_prob_matches_scipy_and_its_gradient_matches_finite_differences():
    prior = LogNormal.from_mode_variance(1.0, 100.0)
    x = torch.tensor([0.05, 0.7, 1.0, 3.4, 20.0, 150.0], dtype=f64, requires_grad=True)
    lp = prior.log_prob(x)
    expected = stats.lognorm.logpdf(x.detach().numpy(), prior.s, scale=math.exp(prior.mu))
    np.testing.assert_allclose(lp.detach().numpy(), expected, rtol=1e-12)
    (autograd,) = torch.autograd.grad(lp.sum(), x)
    eps = 1e-6 * x.detach()
    fd = (prior.log_prob(x.detach() + eps) - prior.log_prob(x.detach() - eps)) / (2 * eps)
    torch.testing.assert_close(autograd, fd, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(prior.grad_log_prob(x.detach()), fd, rtol=1e-6, atol=1e-9)
    assert abs(prior.grad_log_prob(torch.tensor(1.0, dtype=f64)).item()) < 1e-12  # zero at the mode


def test_lognormal_log_prob_is_minus_inf_off_the_support_with_a_finite_gradient():
    prior = LogNormal(mu=0.0, s=1.0)
    x = torch.tensor([-1.0, 0.0, 1.0], dtype=f64, requires_grad=True)
    lp = prior.log_prob(x)
    assert lp[0] == -math.inf and lp[1] == -math.inf and torch.isfinite(lp[2])
    (g,) = torch.autograd.grad(lp[2], x)
    assert torch.isfinite(g).all()


@pytest.mark.parametrize("mode, variance", [(0.0, 1.0), (-1.0, 1.0), (1.0, 0.0), (1.0, -2.0), (math.nan, 1.0),
                                            (1.0, math.inf)])
def test_lognormal_rejects_bad_mode_or_variance(mode, variance):
    with pytest.raises(ValueError, match="mode > 0 and variance > 0"):
        LogNormal.from_mode_variance(mode, variance)
    with pytest.raises(ValueError, match="s > 0"):
        LogNormal(mu=0.0, s=0.0)


# ---------------------------------------------------------------------------------------------------------------
# Check 16: MALA
# ---------------------------------------------------------------------------------------------------------------


def test_mala_recovers_the_mean_and_covariance_of_a_correlated_gaussian():
    mean = torch.tensor([1.0, -2.0], dtype=f64)
    cov = torch.tensor([[1.0, 0.8], [0.8, 1.0]], dtype=f64)
    res = mala(gaussian_target(mean, cov), torch.zeros(2, dtype=f64), n_iterations=3000, burn_in=500, thin=1,
               tune_every=100, n_chains=4, vectorized=True, seed=0)
    draws = res.flat_samples  # [4 * 2499, 2]
    assert res.samples.shape == (4, 2499, 2) and res.log_target.shape == (4, 2499)
    torch.testing.assert_close(draws.mean(0), mean, rtol=0, atol=0.1)
    torch.testing.assert_close(torch.cov(draws.T), cov, rtol=0, atol=0.15)
    torch.testing.assert_close(res.log_target, gaussian_target(mean, cov)(res.samples))
    assert ((res.acceptance_rate > 0.2) & (res.acceptance_rate < 0.95)).all()
    assert (split_rhat(res.samples) < 1.05).all()


def test_the_proposal_is_the_langevin_step_with_the_stated_drift_and_noise():
    # the chain draws xi first, so the second target evaluation must be x0 + (h^2/2) grad + h xi
    mean, h = torch.tensor([0.5, -1.0, 2.0], dtype=f64), 0.3
    seen = []

    def log_target(x):
        seen.append(x.detach().clone())
        return -0.5 * ((x - mean) ** 2 / torch.tensor([1.0, 4.0, 0.25], dtype=f64)).sum()

    x0 = torch.zeros(3, dtype=f64)
    mala(log_target, x0, n_iterations=3, burn_in=0, thin=1, step_size=h, seed=5)
    xi = torch.randn(1, 3, generator=torch.Generator().manual_seed(5), dtype=f64)[0]
    grad = (mean - x0) / torch.tensor([1.0, 4.0, 0.25], dtype=f64)
    torch.testing.assert_close(seen[0], x0)
    torch.testing.assert_close(seen[1], x0 + h**2 / 2 * grad + h * xi, rtol=0, atol=1e-14)


def test_dropping_the_hastings_correction_biases_a_skewed_target():
    # a log-normal sampled directly on x > 0 (proposals below 0 give -inf and must be rejected)
    prior = LogNormal(mu=0.0, s=0.5)

    def run(correct):
        res = mala(lambda x: prior.log_prob(x).sum(-1), torch.ones(1, dtype=f64), n_iterations=2000, burn_in=200,
                   thin=1, tune="never", n_chains=16, vectorized=True, seed=1, _hastings_correction=correct)
        return res.flat_samples[:, 0]

    right, wrong = run(True), run(False)
    assert (right > 0).all() and (wrong > 0).all()
    assert right.mean().item() == pytest.approx(prior.mean, abs=0.04)  # 1.133
    assert right.var().item() == pytest.approx(prior.variance, abs=0.06)  # 0.365
    assert wrong.var().item() < 0.6 * prior.variance  # about 0.15: visibly too narrow
    assert wrong.mean().item() < prior.mean - 0.08  # about 1.0


def test_vectorised_and_looped_targets_give_the_same_chains():
    mean = torch.tensor([0.3, -0.7], dtype=f64)

    def looped(x):  # [D] -> []
        return -0.5 * ((x - mean) ** 2).sum() - 0.1 * (x**4).sum()

    def batched(x):  # [C, D] -> [C]
        return -0.5 * ((x - mean) ** 2).sum(-1) - 0.1 * (x**4).sum(-1)

    kw = dict(n_iterations=200, burn_in=20, thin=1, tune_every=50, n_chains=3, init_jitter=0.5, seed=2)
    a = mala(looped, torch.zeros(2, dtype=f64), **kw)
    b = mala(batched, torch.zeros(2, dtype=f64), vectorized=True, **kw)
    torch.testing.assert_close(a.samples, b.samples)
    torch.testing.assert_close(a.step_size, b.step_size)
    assert not torch.equal(a.samples[0], a.samples[1])  # the chains are independent


def test_chains_start_at_x0_unless_jittered():
    starts = []

    def log_target(x):
        if not starts:
            starts.append(x.detach().clone())
        return -0.5 * (x**2).sum(-1)

    x0 = torch.tensor([1.0, 2.0], dtype=f64)
    mala(log_target, x0, n_iterations=3, burn_in=0, thin=1, n_chains=3, vectorized=True, seed=0)
    torch.testing.assert_close(starts[0], x0.expand(3, 2))
    starts.clear()
    mala(log_target, x0, n_iterations=3, burn_in=0, thin=1, n_chains=3, init_jitter=1.0, vectorized=True, seed=0)
    assert not torch.allclose(starts[0][0], x0) and not torch.allclose(starts[0][0], starts[0][1])


def test_thinning_keeps_iteration_i_when_past_burn_in_and_a_multiple_of_thin():
    assert len(kept_iterations(10_000, 1_000, 50)) == 179  # the paper's defaults (§3.10)
    assert kept_iterations(10_000, 1_000, 50)[[0, -1]].tolist() == [1050, 9950]
    target = gaussian_target(torch.zeros(2, dtype=f64), torch.eye(2, dtype=f64))
    kw = dict(n_iterations=1000, burn_in=100, tune_every=100, n_chains=2, vectorized=True, seed=3)
    every = mala(target, torch.ones(2, dtype=f64), thin=1, **kw)
    thinned = mala(target, torch.ones(2, dtype=f64), thin=50, **kw)
    assert thinned.iterations.tolist() == list(range(150, 1000, 50))
    assert every.iterations.tolist() == list(range(101, 1000))
    # thinning only selects states: the same chain, read at iterations 150, 200, ..., 950
    torch.testing.assert_close(thinned.samples, every.samples[:, thinned.iterations - 101])


@pytest.mark.parametrize("scale, factor", [(100.0, 1.2), (0.01, 0.7)])
def test_always_is_the_official_rule_and_never_keeps_h(scale, factor):
    # a very wide target accepts almost everything (h grows by 1.2), a very narrow one almost nothing (h shrinks)
    target = gaussian_target(torch.zeros(1, dtype=f64), torch.eye(1, dtype=f64) * scale**2)
    kw = dict(n_iterations=600, burn_in=300, thin=1, tune_every=100, step_size=0.4, vectorized=True, seed=0)
    always, never = (mala(target, torch.zeros(1, dtype=f64), tune=t, **kw) for t in ("always", "never"))
    assert always.step_size.item() == pytest.approx(0.4 * factor**5)  # before iterations 100, ..., 500: never stops
    assert never.step_size.item() == 0.4


@pytest.mark.parametrize("scale", [0.01, 100.0])
def test_default_tuning_reaches_the_target_acceptance_in_burn_in_then_fixes_h(scale):
    # 400 parameters, h = 0.4 far too large (scale 0.01: nothing accepted) or far too small (100: all accepted); the
    # official rule with tune_every = 1000 would not have acted before iteration 1000
    target = gaussian_target(torch.zeros(400, dtype=f64), torch.eye(400, dtype=f64) * scale**2)
    kw = dict(burn_in=300, thin=1, step_size=0.4, vectorized=True, n_chains=2, seed=1)
    short, long = (mala(target, torch.zeros(400, dtype=f64), n_iterations=n, **kw) for n in (600, 900))
    assert ((short.acceptance_rate > 0.4) & (short.acceptance_rate < 0.75)).all(), short.acceptance_rate
    assert short.step_size.sub(0.4).abs().min() > 0.1  # it moved, toward about 1.2 * scale / 400^(1/6)
    # h is fixed after burn-in: a longer run with the same seed ends with the same h, its start agrees exactly
    torch.testing.assert_close(long.step_size, short.step_size, rtol=0, atol=0)
    torch.testing.assert_close(long.samples[:, :299], short.samples, rtol=0, atol=0)


def broken_target(x):
    """NaN beyond x = 0.5 and +inf below -0.5 (a broken target): a chain must stay inside. x [C, 1] -> [C]."""
    lp = -0.5 * (x**2).sum(-1)
    lp = torch.where(x[:, 0] < 0.5, lp, torch.full_like(lp, math.nan))
    return torch.where(x[:, 0] > -0.5, lp, torch.full_like(lp, math.inf))


def test_a_non_finite_proposal_is_rejected_not_a_crash():
    res = mala(broken_target, torch.zeros(1, dtype=f64), n_iterations=500, burn_in=50, thin=1, step_size=0.8,
               tune="never", n_chains=2, vectorized=True, seed=0)
    assert torch.isfinite(res.samples).all() and torch.isfinite(res.log_target).all()
    assert (res.samples.abs() < 0.5).all()
    assert (res.acceptance_rate < 0.9).all() and (res.acceptance_rate > 0).all()


def test_a_non_finite_target_at_the_start_is_a_clear_error():
    prior = LogNormal(0.0, 1.0)
    with pytest.raises(ValueError, match="not finite at the starting point"):
        mala(lambda x: prior.log_prob(x).sum(), torch.tensor([-1.0], dtype=f64), n_iterations=10, burn_in=1, thin=1)
    with pytest.raises(ValueError, match="not finite at the starting point"):
        mala(lambda x: torch.log(x).sum() * math.nan, torch.ones(1, dtype=f64), n_iterations=10, burn_in=1, thin=1)


def test_same_seed_reproduces_and_another_seed_differs():
    target = gaussian_target(torch.zeros(2, dtype=f64), torch.eye(2, dtype=f64))
    kw = dict(n_iterations=300, burn_in=50, thin=5, tune_every=50, n_chains=2, init_jitter=0.1, vectorized=True)
    a, b, c = (mala(target, torch.zeros(2, dtype=f64), seed=s, **kw) for s in (7, 7, 8))
    assert torch.equal(a.samples, b.samples) and torch.equal(a.step_size, b.step_size)
    assert not torch.allclose(a.samples, c.samples)
    torch.manual_seed(11)
    d = mala(target, torch.zeros(2, dtype=f64), **kw)
    torch.manual_seed(11)
    assert torch.equal(d.samples, mala(target, torch.zeros(2, dtype=f64), **kw).samples)  # seed=None: global RNG


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_iterations=0), "n_iterations"),
    (dict(n_iterations=100, burn_in=99), "burn_in < n_iterations"),
    (dict(burn_in=-1), "burn_in"),
    (dict(thin=0), "thin"),
    (dict(thin=2.5), "thin"),
    (dict(n_chains=0), "n_chains"),
    (dict(tune_every=0), "tune_every"),
    (dict(step_size=0.0), "step_size"),
    (dict(step_size=math.inf), "step_size"),
    (dict(tune="forever"), "tune"),
    (dict(init_jitter=-1.0), "init_jitter"),
    (dict(n_iterations=60, burn_in=10, thin=100), "nothing would be kept"),
])
def test_bad_sampler_arguments_are_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        mala(lambda x: -(x**2).sum(), torch.zeros(2, dtype=f64), **kwargs)


def test_bad_targets_and_starting_points_are_clear_errors():
    with pytest.raises(ValueError, match="1-D tensor"):
        mala(lambda x: -(x**2).sum(), torch.zeros(2, 2, dtype=f64), n_iterations=10, burn_in=1, thin=1)
    with pytest.raises(ValueError, match="scalar"):
        mala(lambda x: -(x**2), torch.zeros(2, dtype=f64), n_iterations=10, burn_in=1, thin=1)
    with pytest.raises(ValueError, match=r"map \[C, D\] to \[C\]"):
        mala(lambda x: -(x**2).sum(), torch.zeros(2, dtype=f64), n_iterations=10, burn_in=1, thin=1,
             vectorized=True)


# ---------------------------------------------------------------------------------------------------------------
# HMC: invariance, adaptation, rejection
# ---------------------------------------------------------------------------------------------------------------


def correlated_gaussian(scales=(1.0, 0.3, 3.0), correlation=0.8):
    """A mean and covariance with unequal scales and correlated neighbours."""
    D = len(scales)
    corr = torch.tensor([[correlation ** abs(i - j) for j in range(D)] for i in range(D)], dtype=f64)
    sd = torch.tensor(scales, dtype=f64)
    return torch.linspace(-1.0, 2.0, D, dtype=f64), corr * sd[:, None] * sd


def assert_moments_within_monte_carlo_error(samples, mean, cov):
    """Every mean and (co)variance within 4.5 Monte Carlo standard errors, the errors from the chains' own ESS."""
    draws = samples.reshape(-1, samples.shape[-1])
    ess = torch.as_tensor(effective_sample_size(samples), dtype=f64)
    sd = cov.diagonal().sqrt()
    assert ((draws.mean(0) - mean).abs() <= 4.5 * sd / ess.sqrt()).all(), (draws.mean(0), mean, ess)
    # the sample covariance's standard error: sqrt((S_ii S_jj + S_ij^2) / ESS) for a Gaussian
    ess_pair = torch.minimum(ess[:, None], ess[None, :])
    se = ((cov.diagonal()[:, None] * cov.diagonal()[None, :] + cov**2) / ess_pair).sqrt()
    assert ((torch.cov(draws.T) - cov).abs() <= 4.5 * se).all(), (torch.cov(draws.T), cov, ess)


@pytest.mark.parametrize("tune, step_size", [("burn_in", 0.1), ("never", 0.26)])
def test_hmc_leaves_a_correlated_gaussian_invariant(tune, step_size):
    # "never": a fixed step whose leapfrog error is large (about half the proposals rejected), so that only a right
    # accept/reject step gives the right moments (accepting every proposal roughly doubles the variances); "burn_in":
    # the adapted step and mass matrix
    mean, cov = correlated_gaussian()
    res = hmc(gaussian_target(mean, cov), torch.zeros(3, dtype=f64), n_iterations=2500, burn_in=500, thin=1,
              n_leapfrog=5, step_size=step_size, tune=tune, n_chains=4, vectorized=True, seed=0)
    assert res.samples.shape == (4, 1999, 3) and res.log_target.shape == (4, 1999)
    torch.testing.assert_close(res.log_target, gaussian_target(mean, cov)(res.samples))
    assert_moments_within_monte_carlo_error(res.samples, mean, cov)
    assert (split_rhat(res.samples) < 1.02).all()
    if tune == "never":
        assert ((res.acceptance_rate > 0.2) & (res.acceptance_rate < 0.8)).all(), res.acceptance_rate
    else:
        assert ((res.acceptance_rate > 0.65) & (res.acceptance_rate < 0.95)).all(), res.acceptance_rate


def test_hmc_adapts_its_step_and_mass_matrix_to_scales_a_hundredfold_apart():
    # 300 independent coordinates with sds from 0.02 to 2: one step for all would need 100 times more leapfrog steps
    # for the widest; the adapted mass matrix puts every coordinate on its own scale
    sd = torch.logspace(math.log10(0.02), math.log10(2.0), 300, dtype=f64)

    def log_target(x):
        return -0.5 * ((x / sd) ** 2).sum(-1)

    res = hmc(log_target, torch.zeros(300, dtype=f64), n_iterations=400, burn_in=200, thin=1, n_leapfrog=8,
              n_chains=4, vectorized=True, seed=1)
    assert ((res.acceptance_rate > 0.6) & (res.acceptance_rate < 0.97)).all(), res.acceptance_rate
    assert (split_rhat(res.samples) < 1.1).all() and (split_rhat(res.samples, rank_normalize=True) < 1.1).all()
    ratio = res.flat_samples.std(0) / sd
    assert ((ratio > 0.75) & (ratio < 1.25)).all(), ratio
    assert (res.step_size == res.step_size[0]).all() and res.step_size[0] > 0.1  # shared by the chains


def test_metric_windows_follow_stans_schedule():
    assert metric_windows(1000) == [(75, 100), (100, 150), (150, 250), (250, 450), (450, 950)]
    assert metric_windows(200) == [(30, 51), (51, 93), (93, 180)]
    assert metric_windows(19) == []
    for burn_in in (20, 57, 200, 333, 5000):
        windows = metric_windows(burn_in)
        assert all(a < b for a, b in windows) and all(w[1] == v[0] for w, v in zip(windows, windows[1:]))
        assert windows[-1][1] == burn_in - min(50, int(0.1 * burn_in))


def test_hmc_is_reproducible_and_the_same_vectorised_or_looped():
    mean = torch.tensor([0.3, -0.7], dtype=f64)

    def looped(x):
        return -0.5 * ((x - mean) ** 2).sum() - 0.1 * (x**4).sum()

    def batched(x):
        return -0.5 * ((x - mean) ** 2).sum(-1) - 0.1 * (x**4).sum(-1)

    kw = dict(n_iterations=120, burn_in=40, thin=2, n_leapfrog=4, n_chains=3, init_jitter=0.5, seed=2)
    a, b = hmc(looped, torch.zeros(2, dtype=f64), **kw), hmc(batched, torch.zeros(2, dtype=f64), vectorized=True, **kw)
    torch.testing.assert_close(a.samples, b.samples)
    torch.testing.assert_close(a.step_size, b.step_size)
    assert torch.equal(hmc(looped, torch.zeros(2, dtype=f64), **kw).samples, a.samples)
    assert not torch.equal(hmc(looped, torch.zeros(2, dtype=f64), **{**kw, "seed": 3}).samples, a.samples)
    assert not torch.equal(a.samples[0], a.samples[1])


def test_hmc_rejects_trajectories_that_leave_the_support():
    res = hmc(broken_target, torch.zeros(1, dtype=f64), n_iterations=300, burn_in=50, thin=1, n_leapfrog=4,
              step_size=0.3, tune="never", n_chains=2, vectorized=True, seed=0)
    assert torch.isfinite(res.samples).all() and (res.samples.abs() < 0.5).all()
    assert ((res.acceptance_rate < 0.9) & (res.acceptance_rate > 0)).all()


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_leapfrog=0), "n_leapfrog"),
    (dict(tune="always"), r"tune to be one of \('burn_in', 'never'\) for HMC"),
    (dict(step_size=-1.0), "step_size"),
    (dict(n_iterations=100, burn_in=99), "burn_in < n_iterations"),
    (dict(init_jitter=math.nan), "init_jitter"),
])
def test_bad_hmc_arguments_are_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        hmc(lambda x: -(x**2).sum(), torch.zeros(2, dtype=f64), **kwargs)
    with pytest.raises(ValueError, match="not finite at the starting point"):
        hmc(lambda x: torch.log(x).sum(), -torch.ones(2, dtype=f64), n_iterations=10, burn_in=1)


# ---------------------------------------------------------------------------------------------------------------
# Positive parameters: the Jacobian (pitfall 15)
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("transform", [ExpTransform, SoftplusTransform])
def test_transforms_invert_and_report_their_log_jacobian(transform):
    x = torch.tensor([[-30.0, -2.0, 0.0, 1.5, 30.0]], dtype=f64, requires_grad=True)
    f = transform.forward(x)
    (dfdx,) = torch.autograd.grad(f.sum(), x)  # elementwise map: the gradient is the Jacobian's diagonal
    torch.testing.assert_close(transform.log_abs_det_jacobian(x.detach()), torch.log(dfdx).sum(-1))
    torch.testing.assert_close(transform.inverse(f.detach()), x.detach(), rtol=1e-12, atol=1e-12)


def test_the_exp_parametrisation_with_jacobian_samples_the_lognormal_prior():
    # log f ~ N(mu, s^2) exactly; without the Jacobian the chain centres log f on log(mode) = mu - s^2 = 0
    prior = LogNormal.from_mode_variance(1.0, 100.0)

    def run(jacobian):
        target = transformed_log_target(lambda f: prior.log_prob(f).sum(-1), ExpTransform, jacobian=jacobian)
        return mala(target, torch.zeros(1, dtype=f64), n_iterations=2000, burn_in=500, thin=1, tune_every=100,
                    n_chains=8, vectorized=True, seed=1).flat_samples[:, 0]

    right, wrong = run(True), run(False)
    assert right.mean().item() == pytest.approx(prior.mu, abs=0.1)  # 1.237
    assert right.std().item() == pytest.approx(prior.s, abs=0.08)  # 1.112
    assert wrong.mean().item() == pytest.approx(0.0, abs=0.1)


def test_the_softplus_parametrisation_with_jacobian_samples_a_gamma_posterior():
    # Gamma(shape 3, rate 2): mean 1.5, variance 0.75. Without the Jacobian the chain samples the density
    # proportional to p(f) / sigmoid(x) = p(f) / (1 - exp(-f)) instead, whose mean we integrate numerically.
    shape, rate = 3.0, 2.0

    def log_post(f):
        return ((shape - 1) * torch.log(f) - rate * f).sum(-1)

    def run(jacobian):
        target = transformed_log_target(log_post, SoftplusTransform, jacobian=jacobian)
        res = mala(target, SoftplusTransform.inverse(torch.ones(1, dtype=f64)), n_iterations=2000, burn_in=500,
                   thin=1, tune_every=100, n_chains=8, vectorized=True, seed=4)
        return SoftplusTransform.forward(res.flat_samples[:, 0])

    right, wrong = run(True), run(False)
    assert right.mean().item() == pytest.approx(1.5, abs=0.06)
    assert right.var().item() == pytest.approx(0.75, abs=0.1)

    def unnormalised(f):
        return f ** (shape - 1) * math.exp(-rate * f) / -math.expm1(-f)

    wrong_mean = integrate.quad(lambda f: f * unnormalised(f), 0, 60)[0] / integrate.quad(unnormalised, 0, 60)[0]
    assert wrong_mean < 1.3
    assert wrong.mean().item() == pytest.approx(wrong_mean, abs=0.06)


# ---------------------------------------------------------------------------------------------------------------
# Diagnostics
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rank_normalize", [False, True])
def test_rhat_is_one_for_mixed_chains_and_large_for_chains_in_different_places(rank_normalize):
    rng = np.random.default_rng(0)
    mixed = rng.standard_normal((4, 1000, 3))
    assert (np.abs(split_rhat(mixed, rank_normalize=rank_normalize) - 1) < 0.01).all()
    stuck = mixed + np.array([0.0, 0.0, 3.0, 3.0])[:, None, None]
    assert (split_rhat(stuck, rank_normalize=rank_normalize) > 1.1).all()
    # the same drift in every chain: the chains agree with each other, only the split halves expose it
    drift = mixed[:2] + np.repeat([0.0, 2.0], 500)[None, :, None]
    assert (split_rhat(drift, rank_normalize=rank_normalize) > 1.1).all()
    assert (split_rhat(torch.from_numpy(mixed), rank_normalize=rank_normalize) < 1.01).all()  # torch input


def test_split_rhat_has_the_gelman_rubin_value():
    # two chains of unit variance with means 0 and 1.5: the split gives 4 chains with means (0, 0, 1.5, 1.5),
    # so B/n = var(means, ddof=1) = 1.5^2 / 3 and R-hat ~ sqrt(1 + 0.75)
    rng = np.random.default_rng(1)
    draws = rng.standard_normal((2, 20_000, 1)) + np.array([0.0, 1.5])[:, None, None]
    assert split_rhat(draws)[0] == pytest.approx(math.sqrt(1.75), abs=0.02)


def test_rank_normalised_rhat_also_sees_chains_that_differ_only_in_scale():
    rng = np.random.default_rng(2)
    draws = rng.standard_normal((4, 1000, 1)) * np.array([1.0, 1.0, 4.0, 4.0])[:, None, None]
    assert split_rhat(draws)[0] < 1.01  # equal means: the classic R-hat sees nothing
    assert split_rhat(draws, rank_normalize=True)[0] > 1.05  # the folded draws differ


def test_constant_chains_give_infinite_rhat_when_stuck_apart():
    draws = np.zeros((2, 10, 1))
    draws[1] = 1.0
    assert split_rhat(draws)[0] == math.inf


def test_chains_stuck_at_one_point_have_no_rhat_or_ess_despite_round_off():
    # a stuck GRIEF-I chain's log sigma^2: numpy's strided mean of 9 copies is not exactly the value, so the variance
    # of the split halves came out 2e-31 and R-hat sqrt(8 / 9) = 0.94, as if the chains had mixed
    draws = np.full((2, 19, 2), -2.9957321893986437)
    assert np.full((4, 9, 2), -2.9957321893986437).var(axis=1, ddof=1).max() > 0  # the round-off guarded against
    assert np.isnan(split_rhat(draws)).all() and np.isnan(split_rhat(draws, rank_normalize=True)).all()
    assert np.isnan(effective_sample_size(draws)).all()


def test_ess_is_about_n_for_independent_draws():
    draws = np.random.default_rng(3).standard_normal((4, 1000, 3))
    ess = effective_sample_size(draws)
    assert ess.shape == (3,)
    assert ((ess > 0.85 * 4000) & (ess < 1.15 * 4000)).all()


@pytest.mark.parametrize("rho", [0.95, -0.5])
def test_ess_of_an_ar1_chain_has_the_known_factor(rho):
    # tau = (1 + rho) / (1 - rho): 39 for rho = 0.95, 1/3 for the antithetic rho = -0.5 (ESS > N, which needs the
    # negative odd lags paired with the positive even ones rather than a cut at the first negative autocorrelation)
    draws = ar1(rho, chains=4, draws=5000, dim=2, seed=4)
    expected = 20_000 * (1 - rho) / (1 + rho)
    ratio = effective_sample_size(draws) / expected
    assert ((ratio > 0.7) & (ratio < 1.4)).all(), ratio


def test_diagnostics_reject_bad_shapes_and_values():
    with pytest.raises(ValueError, match=r"\[chains, draws, dim\]"):
        split_rhat(np.zeros((4, 100)))
    with pytest.raises(ValueError, match="at least"):
        effective_sample_size(np.zeros((2, 3, 1)))
    with pytest.raises(ValueError, match="non-finite"):
        effective_sample_size(np.full((2, 10, 1), np.nan))

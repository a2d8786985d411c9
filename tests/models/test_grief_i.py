"""GP-GRIEF-I (type-I inference, spec shared/specs/grief.md §3.8-3.10): the MCMC target against dense scipy
references, its gradient, the mixture predictive, the limit of a tight prior (GP-GRIEF-II at w = 1), a small
regression, persistence, rejected proposals and option errors."""
import math

import numpy as np
import pytest
import torch
from conftest import sine_problem
from scipy import optimize, stats

import gpscale
from gpscale import GPRegressor
from gpscale.kernels import inverse_softplus
from gpscale.linalg import NotPSDError
from gpscale.mcmc import mala
from gpscale.models import get_model_class
from gpscale.models.grief import chains as grief_i_chains, grief_i
from gpscale.models.grief.grief_ii import GRIEFII
from gpscale.models.grief.evidence import orthogonal_predict, orthogonalise, reweighted_predict
from gpscale.models.grief.grief_i import GRIEFI
from gpscale.models.grief.chains import ConvergenceWarning
from gpscale.train import fit

F64 = torch.float64

# the short chains here have not converged, and say so; test_unconverged_chains_warn checks the warning
pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore::gpscale.models.grief.chains.ConvergenceWarning")]

SHORT = dict(n_iterations=240, burn_in=40, thin=10)  # 19 kept samples per chain


# --- problems and dense references --------------------------------------------------------------------------------
def toy(n=25, d=2, seed=7):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=F64) * 2 - 1
    return X, torch.sin(3 * X[:, 0]) * torch.cos(2 * X[:, -1]) + 0.3 + 0.1 * torch.randn(n, generator=g, dtype=F64)


def make(model_cls, X, y, lengthscale=(0.7, 0.45), noise=0.05, **options):
    """A model at fixed theta (no exact-GP initialisation), initialised on (X, y)."""
    options = {"n_eigen": 12, "grid_size": 6, "init_exact_points": 0, **options}
    model = model_cls(X.shape[1], outputscale=1.3, noise=noise, **options).double()
    with torch.no_grad():
        model.kernel.raw_lengthscale.copy_(inverse_softplus(torch.tensor(lengthscale, dtype=F64)))
    model.initialise_from_data(X, y)
    return model


def lognormal(mode, variance):
    """scipy's log-normal with the given mode and variance, solved here independently of gpscale.mcmc."""
    # mode = exp(mu - s^2), variance = (e^{s^2} - 1) e^{2 mu + s^2}  =>  variance = (e^t - 1) mode^2 e^{3 t}, t = s^2
    t = optimize.brentq(lambda t: np.log(np.expm1(t)) + 3 * t - np.log(variance / mode**2), 1e-300, 50, xtol=1e-300,
                        rtol=1e-15)
    return stats.lognorm(s=math.sqrt(t), scale=mode * math.exp(t))


def dense_log_posterior(x, Phi, y, noise0, jacobian=True, weight_variance=100.0, noise_variance=0.04):
    """log N(y | 0, Phi W Phi^T + s2 I) + log-normal priors (+ sum x) at x = (log w, log s2), in numpy/scipy."""
    x, Phi, y = (t.detach().numpy() for t in (x, Phi, y))
    w, s2 = np.exp(x[:-1]), math.exp(x[-1])
    K = Phi @ np.diag(w) @ Phi.T + s2 * np.eye(len(y))
    value = stats.multivariate_normal(np.zeros(len(y)), K).logpdf(y)
    value += lognormal(1.0, weight_variance).logpdf(w).sum() + lognormal(noise0, noise_variance).logpdf(s2)
    return value + (x.sum() if jacobian else 0.0)


def random_state(dim, seed=0):
    """A point x = (log w [dim], log s2) near the prior mode."""
    g = torch.Generator().manual_seed(seed)
    return torch.cat([0.5 * torch.randn(dim, generator=g, dtype=F64), torch.tensor([math.log(0.08)], dtype=F64)])


# --- the target ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_eigen, jacobian", [(12, True), (30, True), (12, False)])  # 30 > n = 25: eq. 18 holds
def test_reweighted_target_equals_the_dense_log_posterior(n_eigen, jacobian):
    X, y = toy()
    model = make(GRIEFI, X, y, n_eigen=n_eigen, parametrisation="reweighted", jacobian=jacobian)
    evidence = model.parametrised_evidence(model.statistics(X, y))
    assert evidence.name == "reweighted" and evidence.dim == n_eigen
    target = model.log_target(evidence)
    with torch.no_grad():
        Phi = model.phi(X)
    for seed in (0, 1):
        x = random_state(n_eigen, seed)
        expected = dense_log_posterior(x, Phi, y, model.noise0_.item(), jacobian=jacobian)
        assert target(x).item() == pytest.approx(expected, rel=1e-9, abs=1e-9)
    # the start is the prior mode: w = 1 and sigma_0^2
    torch.testing.assert_close(model.start(evidence), torch.cat([torch.zeros(n_eigen, dtype=F64),
                                                               model.noise0_.log().reshape(1)]))
    assert model.noise0_.item() == pytest.approx(0.05, rel=1e-6)  # sigma_0^2 (float32 rounding of the option)


def test_reweighted_parametrisation_takes_the_row_space_below_rank_p():
    # n = 20 rows: at p = 12 Phi has full column rank (the features' O(p^3) form); at p = 36 (the whole 6 x 6 grid)
    # its rank is 20 < 0.65 p, and eq. 18 is evaluated in the row space: the same target and weight moments
    X, y = toy(20)
    for n_eigen, form in ((12, "features"), (36, "row space")):
        model = make(GRIEFI, X, y, n_eigen=n_eigen, parametrisation="reweighted")
        evidence = model.parametrised_evidence(model.statistics(X, y))
        assert evidence.form == form and evidence.dim == n_eigen
    with torch.no_grad():
        Phi = model.phi(X)
    target = model.log_target(evidence)
    x = random_state(36, 6)
    assert target(x).item() == pytest.approx(dense_log_posterior(x, Phi, y, model.noise0_.item()), rel=1e-9)
    features_form = grief_i._Reweighted(model.statistics(X, y))
    features_form.basis = None
    samples = torch.stack([random_state(36, seed) for seed in (7, 8, 9)]).exp()
    for a, b in zip(evidence.weight_moments(samples[:, :-1], samples[:, -1]),
                    features_form.weight_moments(samples[:, :-1], samples[:, -1])):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("parametrisation, n_eigen", [("reweighted", 12), ("reweighted", 36), ("orthogonal", 12)])
def test_a_vectorised_target_gives_every_chain_its_own_value_gradient_and_rejection(parametrisation, n_eigen):
    X, y = toy(20)
    model = make(GRIEFI, X, y, n_eigen=n_eigen, parametrisation=parametrisation)
    chosen = model.parametrised_evidence(model.statistics(X, y))
    assert parametrisation == "orthogonal" or chosen.form == {12: "features", 36: "row space"}[n_eigen]
    target = model.log_target(chosen)
    x = torch.stack([random_state(chosen.dim, seed) for seed in (10, 11, 12)])
    x[2, 0] = 800.0  # exp overflows in that chain alone: it alone is rejected
    xr = x.clone().requires_grad_(True)
    values = target(xr)
    (grads,) = torch.autograd.grad(values[:2].sum(), xr)
    assert values.shape == (3,) and values[2].item() == -math.inf
    for c in range(2):
        xc = x[c].clone().requires_grad_(True)
        value = target(xc)
        assert values[c].item() == pytest.approx(value.item(), rel=1e-12)
        torch.testing.assert_close(grads[c], torch.autograd.grad(value, xc)[0], rtol=1e-10, atol=1e-12)
    # the sampler gets the same chains either way (the random stream does not depend on it)
    runs = [mala(target, model.start(chosen), n_iterations=60, burn_in=20, thin=5, n_chains=2, seed=3,
                 vectorized=vectorized) for vectorized in (True, False)]
    torch.testing.assert_close(runs[0].samples, runs[1].samples, rtol=1e-9, atol=1e-11)


def test_prior_variances_are_options():
    X, y = toy()
    model = make(GRIEFI, X, y, parametrisation="reweighted", weight_prior_variance=3.0, noise_prior_variance=0.5)
    with torch.no_grad():
        Phi = model.phi(X)
    x = random_state(12, 2)
    expected = dense_log_posterior(x, Phi, y, model.noise0_.item(), weight_variance=3.0, noise_variance=0.5)
    assert model.log_target(model.parametrised_evidence(model.statistics(X, y)))(x).item() == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("parametrisation", ["reweighted", "orthogonal"])
def test_target_gradient_equals_central_differences_in_the_log_space(parametrisation):
    X, y = toy()
    model = make(GRIEFI, X, y, parametrisation=parametrisation)
    target = model.log_target(model.parametrised_evidence(model.statistics(X, y)))
    x = random_state(12, 3).requires_grad_(True)
    (grad,) = torch.autograd.grad(target(x), x)
    h = 1e-6
    with torch.no_grad():
        for j in range(13):
            e = torch.zeros(13, dtype=F64)
            e[j] = h
            fd = (target(x + e) - target(x - e)) / (2 * h)
            assert fd.item() == pytest.approx(grad[j].item(), rel=1e-5, abs=1e-7)


def test_orthogonal_target_equals_the_dense_evidence_on_the_orthogonal_basis():
    X, y = toy()
    model = make(GRIEFI, X, y, parametrisation="orthogonal")
    with torch.no_grad():
        stats_ = model.statistics(X, y)
    evidence = model.parametrised_evidence(stats_)
    basis = orthogonalise(stats_)
    assert evidence.name == "orthogonal" and evidence.dim == basis.s.shape[0] == 12
    with torch.no_grad():
        U = basis.transform(model.phi(X))  # U_s [n, q]
    target = model.log_target(evidence)
    x = random_state(12, 4)
    # the chain's u are the weights relative to s^2: w~ = s^2 u (pitfall 10), so the dense kernel is U_s W~ U_s^T
    x_tilde = torch.cat([x[:-1] + (basis.s**2).log(), x[-1:]])
    prior_shift = np.sum(lognormal(1.0, 100.0).logpdf(x[:-1].exp().numpy()) - lognormal(1.0, 100.0).logpdf(
        x_tilde[:-1].exp().numpy())) - (x_tilde[:-1] - x[:-1]).sum().item()  # priors and Jacobian are on u, not w~
    expected = dense_log_posterior(x_tilde, U, y, model.noise0_.item()) + prior_shift
    assert target(x).item() == pytest.approx(expected, rel=1e-9)
    # at the start (u = 1, i.e. w~ = s^2) it is the w = 1 model: the reweighted parametrisation's target there, for p <= n
    reweighted = make(GRIEFI, X, y, parametrisation="reweighted")
    x0 = model.start(evidence)
    assert target(x0).item() == pytest.approx(
        reweighted.log_target(reweighted.parametrised_evidence(stats_))(x0).item(), rel=1e-9)


def test_auto_parametrisation_is_orthogonal_above_a_million_rows(monkeypatch):
    X, y = toy()
    model = make(GRIEFI, X, y)
    assert model.parametrisation == "auto" and model.parametrised_evidence(model.statistics(X, y)).name == "reweighted"
    monkeypatch.setattr(grief_i, "ORTHOGONAL_ABOVE", 24)  # n = 25 is now "large"
    assert model.parametrised_evidence(model.statistics(X, y)).name == "orthogonal"


# --- rejected proposals -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("parametrisation", ["reweighted", "orthogonal"])
def test_overflowing_proposals_are_rejected_not_raised(parametrisation):
    X, y = toy()
    model = make(GRIEFI, X, y, parametrisation=parametrisation)
    target = model.log_target(model.parametrised_evidence(model.statistics(X, y)))
    x = random_state(12, 5)
    x[0] = 800.0  # exp overflows: the reweighted Cholesky meets inf, the orthogonal evidence is -inf or NaN
    assert target(x).item() == -math.inf


def test_a_not_psd_evidence_rejects_the_proposal_and_the_chain_goes_on(monkeypatch):
    X, y = toy()
    model = make(GRIEFI, X, y, parametrisation="reweighted", step_size=1.0, **SHORT)
    real = grief_i.reweighted_log_likelihood
    calls = {"raised": 0, "nan": 0}

    def fragile(w, noise, stats_):
        if w.max() > 2.0:  # a region where the evidence "fails"
            calls["raised"] += 1
            raise NotPSDError("not positive definite")
        if w.min() < 0.5:
            calls["nan"] += 1
            return real(w, noise, stats_) * math.nan
        return real(w, noise, stats_)

    monkeypatch.setattr(grief_i, "reweighted_log_likelihood", fragile)
    model.fit_posterior(X, y)
    assert calls["raised"] > 0 and calls["nan"] > 0  # both kinds of failure were met
    w = model.cache["samples"][..., :-1].exp()
    assert (w <= 2.0).all() and (w >= 0.5).all()  # and never accepted


# --- prediction ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("parametrisation, sampler, chains", [("reweighted", "hmc", 4), ("orthogonal", "hmc", 4),
                                                              ("reweighted", "mala", 2)])
def test_prediction_is_the_mixture_of_the_per_sample_posteriors(parametrisation, sampler, chains):
    X, y = toy(32)
    model = make(GRIEFI, X[:25], y[:25], parametrisation=parametrisation, sampler=sampler, step_size=0.2, **SHORT)
    model.fit_posterior(X[:25], y[:25])
    mean, var = model.predict(X[25:])
    stats_ = model.statistics(X[:25], y[:25])
    Phi_s = model.feature_map(model.cache)(X[25:])
    x = model.cache["samples"].reshape(-1, 13)
    assert x.shape[0] == chains * 19 and model.mcmc_summary_["acceptance_rate_min"] > 0.1
    basis = orthogonalise(stats_)
    parts = []
    for xs in x:
        u, noise = xs[:-1].exp(), xs[-1].exp()
        if parametrisation == "reweighted":
            parts.append(reweighted_predict(Phi_s, u, noise, stats_))
        else:
            parts.append(orthogonal_predict(Phi_s, basis.s**2 * u, noise, basis))
    means, variances = torch.stack([m for m, _ in parts]), torch.stack([v for _, v in parts])
    torch.testing.assert_close(mean, means.mean(0), rtol=0, atol=1e-10)
    between = means.var(0, unbiased=False)
    assert (between > 1e-6 * variances.mean(0)).all()  # the samples differ: the second term is tested
    torch.testing.assert_close(var, variances.mean(0) + between, rtol=1e-8, atol=1e-12)
    # the likelihood's sigma^2 is the posterior mean of sigma^2; sigma_0^2 is kept
    assert model.noise.item() == pytest.approx(x[:, -1].exp().mean().item(), rel=1e-9)
    assert model.noise0_.item() == pytest.approx(0.05) and model.parametrisation_ == parametrisation


@pytest.mark.parametrize("parametrisation", ["reweighted", "orthogonal"])
def test_a_tight_prior_at_w1_gives_the_type2_posterior_at_the_same_theta(parametrisation):
    X, y = toy(32)
    tight = dict(weight_prior_variance=1e-12, noise_prior_variance=1e-14)
    model = make(GRIEFI, X[:25], y[:25], parametrisation=parametrisation, **tight, **SHORT)
    model.fit_posterior(X[:25], y[:25])
    type2 = make(GRIEFII, X[:25], y[:25])
    type2.fit_posterior(X[:25], y[:25])
    for a, b in zip(model.predict(X[25:]), type2.predict(X[25:])):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-8)
    assert model.noise.item() == pytest.approx(0.05, rel=1e-5)
    # with a wide prior the weights move and the predictive differs
    wide = make(GRIEFI, X[:25], y[:25], parametrisation=parametrisation, **SHORT)
    wide.fit_posterior(X[:25], y[:25])
    assert (wide.predict(X[25:])[1] - type2.predict(X[25:])[1]).abs().max() > 1e-4


# --- training, regression, diagnostics, persistence ---------------------------------------------------------------
def test_regression_matches_type2_with_diagnostics_and_round_trips():
    X, _, y = sine_problem(150, 10)
    X_test, f_test, y_test = sine_problem(200, 11)
    options = dict(n_eigen=30, grid_size=6, init_exact_points=100)
    type2 = GRIEFII(2, **options).double()
    fit(type2, X, y, epochs=10, lr=0.01, progress=False)
    model = GRIEFI(2, n_iterations=600, burn_in=200, thin=10, **options).double()
    result = fit(model, X, y, epochs=3, progress=False, seed=4)
    # no training (trainable = False): theta and sigma_0^2 are the exact GP's, as GRIEF-II's initialisation
    assert result.epochs_run == 0 and not model.trainable
    initial = GRIEFII(2, init_stretch=(1,), **options).double()  # GRIEF-II's default multi-start moves theta
    initial.initialise_from_data(X, y, seed=4)
    torch.testing.assert_close(model.kernel.lengthscale, initial.kernel.lengthscale, rtol=0, atol=0)
    assert model.noise0_.item() == pytest.approx(initial.noise.item(), rel=1e-12)
    mean, var = model.predict(X_test)
    rmse = [((m.predict(X_test)[0] - f_test) ** 2).mean().sqrt().item() for m in (model, type2)]
    assert rmse[0] < 1.1 * rmse[1] + 0.005 and rmse[0] < 0.06  # both about 0.045
    nlpd = [-m.likelihood.log_predictive_density(y_test, *m.predict(X_test)).mean().item() for m in (model, type2)]
    assert math.isfinite(nlpd[0]) and abs(nlpd[0] - nlpd[1]) < 0.05  # both about -0.78
    summary = model.mcmc_summary_
    assert set(summary) >= {"acceptance_rate_min", "step_size_min", "rhat_max", "rhat_noise", "ess_min", "ess_noise"}
    assert all(isinstance(v, float) for v in summary.values())
    assert 0.9 < summary["rhat_noise"] <= summary["rhat_max"] < math.inf
    assert 0 < summary["ess_min"] <= summary["ess_noise"] and summary["n_samples"] == 4 * 39  # HMC: 4 chains
    assert summary["rhat_max"] == max(summary["rhat_weights"], summary["rhat_noise"])
    assert 0.9 < summary["rank_rhat_noise"] <= summary["rank_rhat_max"] < math.inf
    # the same seed gives the same chains; the cache travels in state_dict without the training data
    again = GRIEFI(2, n_iterations=600, burn_in=200, thin=10, **options).double()
    again.load_state_dict(model.state_dict())
    for a, b in zip(again.predict(X_test), (mean, var)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert again.noise.item() == model.noise.item() and int(again.seed_) == 4
    again.fit_posterior(X, y)
    torch.testing.assert_close(again.cache["samples"], model.cache["samples"], rtol=0, atol=0)


def test_unconverged_chains_warn(monkeypatch):
    X, y = toy()
    model = make(GRIEFI, X, y, **SHORT)
    monkeypatch.setattr(grief_i_chains, "split_rhat", lambda x, **_: np.full(x.shape[-1], 1.5))
    # the warning names the sampler and what it checked: every sampled quantity (theta is not sampled)
    with pytest.warns(ConvergenceWarning, match=r"\(hmc\) has not converged on the sampled weights \(log u\) and "
                                                r"noise \(log sigma\^2; theta is fixed\).*weights: 1\.5, sigma\^2: "
                                                r"1\.5.*more iterations \(n_iterations, now 240\)"):
        model.fit_posterior(X, y)
    assert model.mcmc_summary_["rhat_max"] == 1.5


@pytest.mark.parametrize("sampler", ["hmc", "mala"])
def test_chains_that_never_move_warn(sampler):
    # a step far too large and no tuning: nothing is accepted, the draws are constant and R-hat is NaN, which no
    # "R-hat > 1.1" check sees
    X, y = toy()
    model = make(GRIEFI, X, y, sampler=sampler, step_size=20.0, tune="never", **SHORT)
    with pytest.warns(ConvergenceWarning, match=r"accepted 0\.000 of its proposals.*lengthen burn_in.*R-hat is nan"):
        model.fit_posterior(X, y)
    assert model.mcmc_summary_["acceptance_rate_max"] == 0 and math.isnan(model.mcmc_summary_["rhat_max"])


def test_malas_step_size_adapts_on_a_chain_over_two_hundred_parameters():
    # q + 1 = 191 parameters: from h = 0.4 the chains accepted 3-10% (0% on housing, 457 parameters) when h was only
    # tuned every 1000 iterations; adapted during burn-in they accept about 0.55
    g = torch.Generator().manual_seed(0)
    X = torch.rand(250, 4, generator=g, dtype=F64) * 4 - 2
    y = torch.sin(2 * X[:, 0]) * torch.cos(X[:, 1]) + 0.3 * X[:, 2] + 0.1 * torch.randn(250, generator=g, dtype=F64)
    model = GRIEFI(4, n_eigen=200, grid_size=6, parametrisation="orthogonal", sampler="mala", n_iterations=400,
                   burn_in=200, thin=10).double()
    fit(model, X, (y - y.mean()) / y.std(), progress=False)
    summary = model.mcmc_summary_
    assert model.cache["samples"].shape[-1] > 150  # min(n, p) = 200, less the directions orthogonalise drops
    assert 0.2 <= summary["acceptance_rate_min"] <= summary["acceptance_rate_max"] <= 0.9, summary
    assert summary["step_size_max"] < 0.3


def test_regressor_fits_predicts_and_round_trips(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, (130, 3))
    y = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] + 0.1 * rng.standard_normal(130) + 3.0
    reg = GPRegressor(method="grief-i", n_eigen=25, grid_size=5, init_exact_points=100, epochs=1, progress=False,
                      **SHORT).fit(X[:110], y[:110])
    assert get_model_class("grief-i") is GRIEFI and reg.model_.key == "grief-i"
    mean, std = reg.predict(X[110:], return_std=True)
    assert np.sqrt(np.mean((mean - y[110:]) ** 2)) < 0.3 and (std > 0).all()
    path = tmp_path / "grief_i.gps"
    reg.save(path)
    loaded = gpscale.load(path)
    assert loaded.model_.key == "grief-i" and loaded.model_.cache.keys() == reg.model_.cache.keys()
    for a, b in zip((mean, std), loaded.predict(X[110:], return_std=True)):
        np.testing.assert_array_equal(a, b)


def test_defaults_are_hmc_and_mala_keeps_the_papers_run():
    model = GRIEFI(3)
    assert model.sampler == "hmc"
    # the budget options are None: each sampler's own default
    assert grief_i_chains.mcmc_settings(model) == dict(n_iterations=300, burn_in=150, thin=1, n_chains=4,
                                                       step_size=0.1, n_leapfrog=8)
    assert grief_i_chains.mcmc_settings(GRIEFI(3, sampler="mala")) == dict(n_iterations=10_000, burn_in=1_000,
                                                                           thin=50, n_chains=2, step_size=0.4)
    # an option set on the model wins over its sampler's default
    assert grief_i_chains.mcmc_settings(GRIEFI(3, sampler="mala", n_chains=3))["n_chains"] == 3
    assert (model.n_eigen, model.grid_size, model.jacobian, model.parametrisation, model.tune) == (1000, 10, True,
                                                                                                 "auto", "burn_in")
    assert model.init_noise == "grief" and model.init_stretch == (1.0,)  # theta: the exact GP's, one start
    assert (model.weight_prior_variance, model.noise_prior_variance) == (100.0, 0.04)
    assert set(GRIEFI.posterior_options) <= set(GRIEFI.__init__.__code__.co_varnames)


@pytest.mark.parametrize("options, message", [
    (dict(parametrisation="cholesky"), "parametrisation to be one of"),
    (dict(n_iterations=0), "n_iterations to be an integer >= 2"),
    (dict(n_iterations=100.5), "n_iterations to be an integer"),
    (dict(burn_in=-1), "burn_in to be an integer >= 0"),
    (dict(thin=0), "thin to be an integer >= 1"),
    (dict(n_chains=0), "n_chains to be an integer >= 1"),
    (dict(n_iterations=100, burn_in=99), "No MCMC sample would be kept"),
    (dict(n_iterations=100, burn_in=10, thin=200), "No MCMC sample would be kept"),
    (dict(step_size=0.0), "step_size to be a finite number > 0"),
    (dict(step_size=math.inf), "step_size to be a finite number > 0"),
    (dict(tune="sometimes"), "tune to be one of"),
    (dict(tune="always"), r"tune to be one of \('burn_in', 'never'\) with sampler='hmc'"),  # MALA's rule only
    (dict(sampler="nuts"), r"sampler to be one of \('hmc', 'mala'\).*Got 'nuts'"),
    (dict(sampler=None), "sampler to be one of"),
    (dict(n_leapfrog=0), r"n_leapfrog to be an integer >= 1 \(or None: the sampler's default\)\. Got 0"),
    (dict(n_chains=None, sampler="mala", thin=0), r"thin to be an integer >= 1 \(or None: the sampler's default\)"),
    (dict(jacobian="yes"), "jacobian to be True or False"),
    (dict(weight_prior_variance=0.0), "weight_prior_variance"),
    (dict(noise_prior_variance=-1.0), "noise_prior_variance"),
    (dict(grid_size=1), "grid_size"),  # GRIEF's own checks still apply
])
def test_bad_options_get_a_clear_error(options, message):
    with pytest.raises(ValueError, match=message):
        GRIEFI(2, **options)


def test_a_posterior_option_set_as_an_attribute_is_checked_at_fit_posterior():
    X, y = toy()
    model = make(GRIEFI, X, y, **SHORT)
    model.thin = 0
    with pytest.raises(ValueError, match="thin to be an integer"):
        model.fit_posterior(X, y)

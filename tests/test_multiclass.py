"""The multiclass likelihoods over C latent functions: robust-max by Gauss-Hermite quadrature (spec hkd.md §3.2,
§9 check 16) and softmax by reparameterised Monte Carlo; ``make_likelihood`` and ``n_latent``."""
import math

import pytest
import torch

from gpscale.likelihoods import LIKELIHOODS, Bernoulli, Gaussian, RobustMax, Softmax, make_likelihood

pytestmark = pytest.mark.usefixtures("one_thread")

F64 = torch.float64


def random_moments(b, C, seed, var_low=0.5, var_high=2.0, dtype=F64):
    """mean [b, C] ~ N(0, 1), var [b, C] ~ U(var_low, var_high), labels y [b] uniform in 0..C-1."""
    g = torch.Generator().manual_seed(seed)
    mean = torch.randn(b, C, generator=g, dtype=dtype)
    var = var_low + (var_high - var_low) * torch.rand(b, C, generator=g, dtype=dtype)
    return torch.randint(0, C, (b,), generator=g), mean, var


def argmax_frequency(y, mean, var, n_samples, seed, chunk=100_000):
    """Monte Carlo Pr(y = argmax_j f_j) [b], f ~ N(mean, diag var), from n_samples draws."""
    g = torch.Generator().manual_seed(seed)
    hits = torch.zeros(mean.shape[0], dtype=F64)
    for start in range(0, n_samples, chunk):
        f = mean + var.sqrt() * torch.randn(min(chunk, n_samples - start), *mean.shape, generator=g, dtype=F64)
        hits += (f.argmax(-1) == y).to(F64).sum(0)
    return hits / n_samples


# --- robust-max --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("C", [3, 10])
def test_16_robustmax_quadrature_agrees_with_monte_carlo(C):
    # 20-point quadrature is accurate to well under one MC standard error here (sd ratios <= 2; see RobustMax)
    y, mean, var = random_moments(6, C, seed=C)
    likelihood = RobustMax(C)
    n = 1_000_000
    P = argmax_frequency(y, mean, var, n, seed=16 + C)
    log_hit, log_miss = math.log(1 - 1e-3), math.log(1e-3 / (C - 1))
    mc = log_miss + (log_hit - log_miss) * P  # E log p(y | f) is linear in the indicator y = argmax f
    se = (log_hit - log_miss) * (P * (1 - P) / n).sqrt()
    quadrature = likelihood.expected_log_prob(y, mean, var)
    assert ((quadrature - mc).abs() <= 4 * se).all(), ((quadrature - mc) / se)
    # and the predictive probability of the observed class is the same P, mixed with eps
    p = likelihood.predictive(mean, var)[0].gather(-1, y[:, None]).squeeze(-1)
    assert ((p - ((1 - 1e-3) * P + 1e-3 / (C - 1) * (1 - P))).abs() <= 4 * (P * (1 - P) / n).sqrt() + 1e-4).all()


@pytest.mark.parametrize("C", [3, 10])
def test_robustmax_quadrature_converges_in_the_number_of_points(C):
    y, mean, var = random_moments(50, C, seed=3)
    coarse = RobustMax(C).expected_log_prob(y, mean, var)
    fine = RobustMax(C, quadrature_points=100).expected_log_prob(y, mean, var)
    torch.testing.assert_close(coarse, fine, rtol=0, atol=5e-3)
    assert not torch.allclose(coarse, RobustMax(C, quadrature_points=1).expected_log_prob(y, mean, var), atol=1e-2)


def test_robustmax_predictive_is_a_distribution_and_tends_to_eps_at_zero_variance():
    C, eps = 5, 1e-3
    likelihood = RobustMax(C, epsilon=eps)
    _, mean, var = random_moments(40, C, seed=5, var_low=0.1, var_high=3.0)
    probs, variance = likelihood.predictive(mean, var)
    assert probs.shape == variance.shape == (40, C)
    torch.testing.assert_close(probs.sum(-1), torch.ones(40, dtype=F64))
    assert ((probs > 0) & (probs < 1)).all()
    torch.testing.assert_close(variance, probs * (1 - probs))
    # var -> 0 (and exactly 0): the argmax class gets 1 - eps, every other eps / (C - 1)
    expected = torch.full((40, C), eps / (C - 1), dtype=F64).scatter_(-1, mean.argmax(-1, keepdim=True), 1 - eps)
    for tiny in (0.0, 1e-14):
        torch.testing.assert_close(likelihood.predictive(mean, torch.full_like(var, tiny))[0], expected,
                                   rtol=1e-10, atol=1e-12)
    # log predictive density is the log of the predictive probability of the label
    y = torch.arange(40) % C
    torch.testing.assert_close(likelihood.log_predictive_density(y, mean, var),
                               torch.log(probs.gather(-1, y[:, None]).squeeze(-1)))


def test_robustmax_expected_log_prob_at_zero_variance_is_log_p_of_the_argmax():
    C, eps = 4, 1e-3
    mean = torch.tensor([[0.5, 2.0, -1.0, 1.0], [3.0, 0.0, 0.1, 0.2]], dtype=F64)
    value = RobustMax(C).expected_log_prob(torch.tensor([1, 1]), mean, torch.zeros_like(mean))
    torch.testing.assert_close(value, torch.tensor([math.log(1 - eps), math.log(eps / (C - 1))], dtype=F64))


def test_robustmax_expected_log_prob_rises_with_the_mean_of_the_observed_class():
    C = 4
    y, mean, var = random_moments(20, C, seed=7)
    likelihood = RobustMax(C)
    base = likelihood.expected_log_prob(y, mean, var)
    onehot = torch.nn.functional.one_hot(y, C).to(F64)
    assert (likelihood.expected_log_prob(y, mean + 0.5 * onehot, var) > base).all()
    assert (likelihood.expected_log_prob(y, mean - 0.5 * onehot, var) < base).all()
    # the gradient agrees: positive for mean_y, negative for every other mean
    mean = mean.requires_grad_()
    likelihood.expected_log_prob(y, mean, var).sum().backward()
    assert (mean.grad[onehot.bool()] > 0).all() and (mean.grad[~onehot.bool()] < 0).all()


def test_robustmax_gradcheck_in_mean_and_var():
    C = 3
    y, mean, var = random_moments(4, C, seed=11)
    likelihood = RobustMax(C, quadrature_points=10)
    mean, var = mean.requires_grad_(), var.requires_grad_()
    assert torch.autograd.gradcheck(lambda m, v: likelihood.expected_log_prob(y, m, v), (mean, var))
    assert torch.autograd.gradcheck(lambda m, v: likelihood.log_predictive_density(y, m, v), (mean, var))


def test_robustmax_is_finite_for_large_means_and_tiny_variances():
    C = 4
    likelihood = RobustMax(C)
    mean = torch.tensor([[1e4, 2.0, 3.0, -1e5], [-300.0, 300.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], dtype=F64)
    var = torch.tensor([[1e-30, 1.0, 1e3, 0.0], [1e-8, 1e-8, 1e-8, 1e-8], [1e-20, 1e-20, 1e-20, 1e-20]], dtype=F64)
    y = torch.tensor([3, 0, 2])
    mean, var = mean.requires_grad_(), var.requires_grad_()
    value = likelihood.expected_log_prob(y, mean, var)
    assert torch.isfinite(value).all()
    torch.testing.assert_close(value[:2], torch.full((2,), math.log(1e-3 / 3), dtype=F64))
    value.sum().backward()
    assert torch.isfinite(mean.grad).all() and torch.isfinite(var.grad).all()
    assert torch.isfinite(likelihood.log_predictive_density(y, mean, var)).all()
    # the log-space product keeps a vanishing P_y distinguishable from a merely small one
    far = torch.tensor([[0.0, 40.0, 40.0, 40.0]], dtype=F64)
    P = likelihood.log_argmax_probability(torch.tensor([[0]]), far, torch.ones_like(far))
    assert torch.isfinite(P).all() and P.item() < -500


def test_robustmax_accepts_float32():
    y, mean, var = random_moments(5, 3, seed=2, dtype=torch.float32)
    likelihood = RobustMax(3)
    value = likelihood.expected_log_prob(y, mean, var)
    assert value.dtype == torch.float32
    torch.testing.assert_close(value.double(), likelihood.expected_log_prob(y, mean.double(), var.double()),
                               rtol=1e-4, atol=1e-5)


# --- softmax -----------------------------------------------------------------------------------------------------

def softmax_reference(y, mean, var, n_samples=1_000_000, seed=0):
    """Per-point Monte Carlo mean and sample standard deviation of log softmax(f)_y, and E softmax(f) [b, C]."""
    g = torch.Generator().manual_seed(seed)
    f = mean + var.sqrt() * torch.randn(n_samples, *mean.shape, generator=g, dtype=F64)
    log_p = torch.log_softmax(f, -1)
    samples = log_p.gather(-1, y.view(1, -1, 1).expand(n_samples, -1, 1)).squeeze(-1)
    return samples.mean(0), samples.std(0), log_p.exp().mean(0)


def test_softmax_monte_carlo_agrees_with_a_large_sample_reference():
    C = 4
    y, mean, var = random_moments(3, C, seed=21, var_low=1.0, var_high=4.0)
    reference, spread, probs = softmax_reference(y, mean, var, n_samples=250_000)
    # the variance makes a difference here, so ignoring it (log_softmax(mean)) would fail
    plug_in = torch.log_softmax(mean, -1).gather(-1, y[:, None]).squeeze(-1)
    assert ((plug_in - reference).abs() > 0.1).all()
    likelihood = Softmax(C, mc_samples=16, eval_samples=4096)
    torch.manual_seed(1)
    with torch.no_grad():
        estimate = likelihood.expected_log_prob(y, mean, var)
    assert ((estimate - reference).abs() <= 4 * spread / math.sqrt(4096)).all(), ((estimate - reference), spread)
    # the 16-sample training estimator is unbiased: the mean of 300 independent ones
    estimates = torch.stack([likelihood.expected_log_prob(y, mean, var) for _ in range(300)])
    assert ((estimates.mean(0) - reference).abs() <= 4 * spread / math.sqrt(16 * 300)).all()
    # ... with the standard error sd / sqrt(16), below the documented bound sqrt(2 max var / 16)
    ratio = estimates.std(0) / (spread / 4)
    assert ((ratio > 0.8) & (ratio < 1.2)).all(), ratio
    assert (spread ** 2 <= 2 * var.max(-1).values).all()
    # predictive probabilities and log density
    p, v = likelihood.predictive(mean, var)
    torch.testing.assert_close(p, probs, rtol=0, atol=0.02)
    torch.testing.assert_close(p.sum(-1), torch.ones(3, dtype=F64))
    assert ((p > 0) & (p < 1)).all()
    torch.testing.assert_close(v, p * (1 - p))
    lpd = likelihood.log_predictive_density(y, mean, var)
    torch.testing.assert_close(lpd, torch.log(probs.gather(-1, y[:, None]).squeeze(-1)), rtol=0, atol=0.05)


def test_softmax_at_zero_variance_is_log_softmax_of_the_mean_exactly():
    C = 5
    y, mean, _ = random_moments(7, C, seed=8)
    likelihood = Softmax(C)
    zero = torch.zeros_like(mean)
    exact = torch.log_softmax(mean, -1).gather(-1, y[:, None]).squeeze(-1)
    assert torch.equal(likelihood.expected_log_prob(y, mean, zero), exact)
    torch.testing.assert_close(likelihood.log_predictive_density(y, mean, zero), exact)
    torch.testing.assert_close(likelihood.predictive(mean, zero)[0], torch.softmax(mean, -1))


def test_softmax_gradients_flow_to_mean_and_var():
    C = 3
    y, mean, var = random_moments(4, C, seed=9)
    likelihood = Softmax(C, mc_samples=8)
    mean, var = mean.requires_grad_(), var.requires_grad_()
    likelihood.expected_log_prob(y, mean, var).sum().backward()
    assert torch.isfinite(mean.grad).all() and (mean.grad != 0).all()
    assert torch.isfinite(var.grad).all() and (var.grad != 0).all()

    def with_fixed_draws(m, v):  # the same e_s every call: a smooth function of (mean, var)
        torch.manual_seed(123)
        return likelihood.expected_log_prob(y, m, v)

    assert torch.autograd.gradcheck(with_fixed_draws, (mean.detach().requires_grad_(), var.detach().requires_grad_()))
    # at var = 0 the value is exact and the gradient is finite
    zero = torch.zeros_like(var, requires_grad=True)
    likelihood.expected_log_prob(y, mean, zero).sum().backward()
    assert torch.isfinite(zero.grad).all()


def test_softmax_is_finite_for_large_means():
    likelihood = Softmax(3)
    mean = torch.tensor([[1e4, -1e4, 0.0], [-500.0, 500.0, 0.0]], dtype=F64)
    var = torch.tensor([[1.0, 1e-12, 100.0], [0.0, 1.0, 1.0]], dtype=F64)
    y = torch.tensor([1, 0])
    assert torch.isfinite(likelihood.expected_log_prob(y, mean, var)).all()
    assert torch.isfinite(likelihood.log_predictive_density(y, mean, var)).all()
    assert torch.isfinite(likelihood.predictive(mean, var)[0]).all()


# --- validation and construction ---------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", [RobustMax, Softmax])
def test_labels_are_validated(cls):
    C = 3
    likelihood = cls(C)
    _, mean, var = random_moments(4, C, seed=0)
    for y in (torch.tensor([0, 1, 2, 3]), torch.tensor([-1, 0, 1, 2]), torch.tensor([0.0, 0.5, 1.0, 2.0]),
              torch.tensor([[0], [1], [2], [0]]), torch.tensor([0, 1, 2]), torch.tensor([True, False, True, True]),
              torch.tensor([0.0, float("nan"), 1.0, 2.0])):
        for method in ("expected_log_prob", "log_predictive_density"):
            with pytest.raises(ValueError, match=r"class indices 0\.\.2"):
                getattr(likelihood, method)(y, mean, var)
    # any integer dtype, or floats holding integers, are fine and equivalent
    torch.manual_seed(0)
    as_long = likelihood.expected_log_prob(torch.tensor([0, 1, 2, 0]), mean, var)
    for y in (torch.tensor([0, 1, 2, 0], dtype=torch.int32), torch.tensor([0.0, 1.0, 2.0, 0.0], dtype=F64)):
        torch.manual_seed(0)
        torch.testing.assert_close(likelihood.expected_log_prob(y, mean, var), as_long)


@pytest.mark.parametrize("cls", [RobustMax, Softmax])
def test_moment_shapes_are_validated(cls):
    likelihood = cls(3)
    y, mean, var = random_moments(4, 3, seed=0)
    for m, v in ((mean, var[:, :2]), (mean[:, :2], var[:, :2]), (mean[:, 0], var[:, 0]), (mean, var[:3]),
                 (mean[None], var[None])):
        with pytest.raises(ValueError, match=r"\[b, C\] = \[b, 3\]"):
            likelihood.expected_log_prob(y, m, v)
        with pytest.raises(ValueError, match=r"\[b, C\] = \[b, 3\]"):
            likelihood.predictive(m, v)
        with pytest.raises(ValueError, match=r"\[b, C\] = \[b, 3\]"):
            likelihood.log_predictive_density(y, m, v)


def test_constructor_arguments_are_validated():
    for bad in (1, 0, True, 2.5):
        with pytest.raises(ValueError, match="n_classes"):
            RobustMax(bad)
        with pytest.raises(ValueError, match="n_classes"):
            Softmax(bad)
    with pytest.raises(ValueError, match="epsilon"):
        RobustMax(3, epsilon=0.0)
    with pytest.raises(ValueError, match="mc_samples"):
        Softmax(3, mc_samples=0)


def test_make_likelihood_round_trip_and_errors():
    assert "softmax" in LIKELIHOODS and "robustmax" in LIKELIHOODS
    for name, cls in (("robustmax", RobustMax), ("softmax", Softmax)):
        likelihood = make_likelihood(name, n_classes=10)
        assert isinstance(likelihood, cls) and likelihood.n_latent == 10 and likelihood.n_classes == 10
        assert likelihood.noise is None
        # the noise options every model passes are ignored, as for 'bernoulli'
        assert make_likelihood(name, noise=0.3, learn_noise=False, noise_floor=1e-4, n_classes=3).n_latent == 3
        with pytest.raises(ValueError, match="pass n_classes"):
            make_likelihood(name)
        for bad in (1, 0, -2, True):
            with pytest.raises(ValueError, match="n_classes must be an integer >= 2"):
                make_likelihood(name, n_classes=bad)
    assert float(make_likelihood("robustmax", n_classes=10).epsilon) == 1e-3
    for name in ("gaussian", "bernoulli"):
        with pytest.raises(ValueError, match="only for the multiclass"):
            make_likelihood(name, n_classes=3)
    assert isinstance(make_likelihood("gaussian"), Gaussian) and isinstance(make_likelihood("bernoulli"), Bernoulli)
    with pytest.raises(ValueError, match="Unknown likelihood"):
        make_likelihood("multinomial", n_classes=3)


def test_single_output_likelihoods_have_one_latent_function():
    assert Gaussian.n_latent == 1 and Bernoulli.n_latent == 1
    assert Gaussian().n_latent == 1 and Bernoulli().n_latent == 1
    assert RobustMax(7).n_latent == 7 and Softmax(2).n_latent == 2

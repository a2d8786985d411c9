"""The probit Bernoulli likelihood and binary classification with the variational methods (spec odvff.md §4.5,
§10 check 12)."""
import math

import pytest
import torch
from sklearn.datasets import make_moons

from gpscale.likelihoods import Bernoulli
from gpscale.models.linear.sgpr import SGPR
from gpscale.models.variational.svgp import SVGP
from gpscale.models.fourier.vff import ODVFF
from gpscale.train import fit

F64 = torch.float64


def test_12_gauss_hermite_expected_log_likelihood_agrees_with_monte_carlo():
    g = torch.Generator().manual_seed(12)
    mean = torch.tensor([-2.0, -0.3, 0.0, 0.8, 3.0], dtype=F64)
    var = torch.tensor([0.1, 1.0, 4.0, 0.5, 2.0], dtype=F64)
    y = torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0], dtype=F64)
    f = mean + var.sqrt() * torch.randn(1_000_000, 5, generator=g, dtype=F64)
    samples = torch.special.log_ndtr(y * f)
    mc, se = samples.mean(0), samples.std(0) / math.sqrt(samples.shape[0])
    quadrature = Bernoulli().expected_log_prob(y, mean, var)
    assert ((quadrature - mc).abs() <= 3 * se).all(), (quadrature, mc, se)


def test_the_predictive_probability_is_the_probit_integral():
    g = torch.Generator().manual_seed(1)
    mean, var = torch.tensor([-1.0, 0.5], dtype=F64), torch.tensor([0.5, 3.0], dtype=F64)
    f = mean + var.sqrt() * torch.randn(1_000_000, 2, generator=g, dtype=F64)
    likelihood = Bernoulli()
    p = likelihood.probability(mean, var)
    torch.testing.assert_close(p, torch.special.ndtr(f).mean(0), rtol=0, atol=3e-3)
    torch.testing.assert_close(likelihood.log_predictive_density(torch.tensor([1.0, -1.0], dtype=F64), mean, var),
                               torch.log(torch.stack([p[0], 1 - p[1]])))
    m, v = likelihood.predictive(mean, var)
    torch.testing.assert_close(m, 2 * p - 1)
    torch.testing.assert_close(v, 4 * p * (1 - p))


def test_log_probabilities_stay_finite_far_in_the_tail():
    value = Bernoulli().expected_log_prob(torch.tensor([1.0], dtype=F64), torch.tensor([-40.0], dtype=F64),
                                          torch.tensor([0.01], dtype=F64))
    assert torch.isfinite(value).all() and value.item() < -700


def banana(n, seed):
    X, labels = make_moons(n, noise=0.2, random_state=seed)
    return torch.tensor(X, dtype=F64), torch.tensor(2.0 * labels - 1.0, dtype=F64)


@pytest.mark.parametrize("model", [
    lambda: ODVFF(2, n_frequencies=8, n_mean_inducing=30, likelihood="bernoulli", natgrad_step=0.05),
    lambda: SVGP(2, n_inducing=30, likelihood="bernoulli"),
], ids=["odvff", "svgp"])
def test_variational_methods_classify_the_banana_set(model):
    X, y = banana(400, 0)
    X_test, y_test = banana(1000, 1)
    model = model().double()
    fit(model, X, y, epochs=60, batch_size=100, lr=0.05, progress=False)
    mean, var = model.predict(X_test)
    p = model.likelihood.probability(mean, var)
    accuracy = ((p > 0.5) == (y_test > 0)).double().mean().item()
    log_density = model.likelihood.log_predictive_density(y_test, mean, var).mean().item()
    assert accuracy > 0.9 and log_density > -0.3


def test_gaussian_only_methods_reject_the_bernoulli_likelihood():
    with pytest.raises(ValueError, match="supports the likelihoods"):
        SGPR(2, likelihood="bernoulli")
    with pytest.raises(ValueError, match="Unknown likelihood"):
        SVGP(2, likelihood="poisson")

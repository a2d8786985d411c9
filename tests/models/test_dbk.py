"""Deep basis kernel GPs against dense references: the verification list of shared/specs/lrdkd.md §13 (items
numbered there), the variance correction, and the model's plumbing (networks, options, weight decay, estimator)."""
import math
import warnings
from fractions import Fraction
from unittest.mock import patch

import numpy as np
import pytest
import torch
from torch import nn
from torch.distributions import MultivariateNormal, Normal, kl_divergence

import gpscale
from gpscale import ExtrapolationWarning, GPClassifier, GPRegressor
from gpscale.bench.memory import PeakMemory
from gpscale.data import make_friedman1
from gpscale.kernels import deep_basis
from gpscale.models import get_model_class
from gpscale.models.linear import weight_space as weight_space
from gpscale.models.deep_basis.svdbk import SVDBK
from gpscale.kernels.deep_basis import DeepBasisKernel, ResidualLayer, Tanh, mlp, prior_variance, residual_mlp
from gpscale.models.deep_basis.dbk import DBK, trace_penalty, variance_correction
from gpscale.train import fit

F64 = torch.float64


pytestmark = pytest.mark.usefixtures("one_thread")


class Lookup(nn.Module):
    """A "network" whose basis rows are free parameters: the input row [i] maps to row i of ``table`` [N, r].
    It puts any Phi into the models, and its gradient is the gradient with respect to Phi."""

    def __init__(self, table):
        super().__init__()
        self.table = nn.Parameter(table.clone())

    def forward(self, X):
        return self.table[X[:, 0].long()]


def rows(start, stop):
    """The inputs [stop - start, 1] that make :class:`Lookup` return rows start .. stop - 1."""
    return torch.arange(start, stop, dtype=F64).unsqueeze(-1)


def random_basis(N, r, seed=0):
    """Phi [N, r] with row norms that vary by a factor of about 3, as a DBK's prior variance does."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, r, generator=g, dtype=F64) * (0.5 + torch.rand(N, 1, generator=g, dtype=F64)) / math.sqrt(r)


def targets(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return 0.7 + torch.randn(n, generator=g, dtype=F64)  # a non-zero mean: a zero-mean GP must not ignore it


def build(cls, table, noise=0.3, **options):
    """A model with basis rows ``table``; the noise is learned (floor 1e-6) if above the floor, else fixed."""
    options = {"learn_noise": noise > 1e-6, "calibrate_noise": None, **options}
    return cls(1, n_basis=table.shape[1], network=Lookup(table), noise=noise, **options).double()


def covariance(Phi, noise, c=None):
    """Dense Phi Phi^T + diag(c) + sigma^2 I [n, n]."""
    K = Phi @ Phi.T + noise * torch.eye(Phi.shape[0], dtype=F64)
    return K if c is None else K + torch.diag(c)


def dense_log_evidence(Phi, y, noise, c=None):
    return MultivariateNormal(torch.zeros_like(y), covariance(Phi, noise, c)).log_prob(y)


def dense_predictive(Phi, y, Phi_s, noise, c=None, c_s=None):
    """GP posterior of f* with training covariance Phi Phi^T + diag(c) + sigma^2 I, cross-covariance Phi phi*
    and prior variance ||phi*||^2 + c*: mean k*^T Sigma^-1 y, variance k** - k*^T Sigma^-1 k*."""
    Sigma = covariance(Phi, noise, c)
    Ks = Phi @ Phi_s.T  # [n, m]
    mean = Ks.T @ torch.linalg.solve(Sigma, y)
    prior = prior_variance(Phi_s) + (0 if c_s is None else c_s)
    return mean, prior - (Ks * torch.linalg.solve(Sigma, Ks)).sum(0)


def set_q(model, mean, L):
    """Put q(w) = N(mean, L L^T) into an SVDBK (L lower triangular)."""
    with torch.no_grad():
        model.q_mu.copy_(mean)
        model.q_sqrt_raw.copy_(L)


def random_scale_tril(r, g, off_diagonal=1.0, diagonal_min=0.5):
    """A random lower-triangular L [r, r] with a positive diagonal."""
    L = torch.tril(off_diagonal * torch.randn(r, r, generator=g, dtype=F64), -1)
    return L + torch.diag(diagonal_min + torch.rand(r, generator=g, dtype=F64))


def optimal_q(Phi, y, noise):
    """p(w | y) = N(Lambda^-1 Phi^T y, sigma^2 Lambda^-1), Lambda = Phi^T Phi + sigma^2 I, by dense solves."""
    Lam = Phi.T @ Phi + noise * torch.eye(Phi.shape[1], dtype=F64)
    cov = noise * torch.linalg.inv(Lam)
    return torch.linalg.solve(Lam, Phi.T @ y), torch.linalg.cholesky((cov + cov.T) / 2)


# --- 1. log marginal likelihood -----------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [7, 50])
@pytest.mark.parametrize("r", ["1", "5", "n+3"])
@pytest.mark.parametrize("noise", [1e-4, 0.3, 2.0])
def test_1_log_marginal_likelihood_equals_dense(n, r, noise):
    """Catches (n - r) vs n or (n + r) in the log sigma^2 term and a lost 1/2 on log|Lambda|; r > n included."""
    r = n + 3 if r == "n+3" else int(r)
    Phi, y = random_basis(n, r), targets(n)
    model = build(DBK, Phi, noise)
    expected = dense_log_evidence(Phi, y, model.noise.detach())
    with torch.no_grad():
        assert model.log_marginal_likelihood(rows(0, n), y).item() == pytest.approx(expected.item(), rel=1e-10)
        # the engine's subtractive data fit, yy / sigma^2 - c^T c, agrees on these well-conditioned problems
        post = model.weight_posterior_of(Phi, y)
        assert weight_space.log_evidence(post, model.noise).item() == pytest.approx(expected.item(), rel=1e-10)


def test_1_data_fit_is_free_of_cancellation():
    """y in the span of Phi (rank 1) and sigma^2 = 1e-12: the subtractive form yy / sigma^2 - c^T c loses digits
    to terms of order 1e14, the residual form does not. Reference in exact rational arithmetic:
    y^T Sigma^-1 y = (||y||^2 - (a^T y)^2 / (||a||^2 + s)) / s for Sigma = a a^T + s I."""
    g = torch.Generator().manual_seed(5)
    a = torch.randn(50, generator=g, dtype=F64)
    y = 3 * a + 1e-7 * torch.randn(50, generator=g, dtype=F64)
    s = 1e-12
    model = build(DBK, a.unsqueeze(-1), noise=s)
    af, yf, sf = [Fraction(v) for v in a.tolist()], [Fraction(v) for v in y.tolist()], Fraction(model.noise.item())
    aa, ay, yy = sum(v * v for v in af), sum(u * v for u, v in zip(af, yf)), sum(v * v for v in yf)
    quad = (yy - ay * ay / (aa + sf)) / sf
    logdet = 49 * math.log(sf) + math.log(sf + aa)
    exact = -25 * math.log(2 * math.pi) - 0.5 * logdet - 0.5 * float(quad)
    with torch.no_grad():
        residual = model.log_marginal_likelihood(rows(0, 50), y).item()
        subtractive = weight_space.log_evidence(model.weight_posterior_of(a.unsqueeze(-1), y), model.noise).item()
    assert abs(residual - exact) < 1e-9 * abs(exact)
    assert abs(subtractive - exact) > 1e3 * abs(residual - exact)  # the check discriminates


# --- 2. gradients -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n, r, noise", [(50, 5, 0.3), (7, 10, 1e-4)])
def test_2_gradients_equal_dense_autograd_and_the_closed_form(n, r, noise):
    Phi, y = random_basis(n, r), targets(n)
    model = build(DBK, Phi, noise)
    model.log_marginal_likelihood(rows(0, n), y).backward()
    table = Phi.clone().requires_grad_(True)
    raw = model.likelihood.raw_noise
    dense_raw = raw.detach().clone().requires_grad_(True)
    dense_noise = model.likelihood.noise_floor + nn.functional.softplus(dense_raw)
    dense_log_evidence(table, y, dense_noise).backward()
    torch.testing.assert_close(model.kernel.network.table.grad, table.grad, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(raw.grad, dense_raw.grad, rtol=1e-8, atol=1e-10)
    # A.1: d log p / d Phi = -Sigma^-1 Phi + Sigma^-1 y y^T Sigma^-1 Phi
    Sigma_inv = torch.linalg.inv(covariance(Phi, model.noise.detach()))
    closed = -Sigma_inv @ Phi + Sigma_inv @ torch.outer(y, y) @ Sigma_inv @ Phi
    torch.testing.assert_close(model.kernel.network.table.grad, closed, rtol=1e-8, atol=1e-10)


def test_2_network_gradients_through_chunks_equal_dense():
    """A real network, trained in chunks of 7 rows: the loss and every gradient equal the dense ones."""
    g = torch.Generator().manual_seed(0)
    X = torch.rand(40, 2, generator=g, dtype=F64) * 2 - 1
    y = torch.sin(3 * X[:, 0]) + 0.1 * torch.randn(40, generator=g, dtype=F64)
    torch.manual_seed(0)
    model = DBK(2, n_basis=6, width=16, chunk_size=7).double()
    dense = DBK(2, n_basis=6, width=16, chunk_size=7).double()
    dense.load_state_dict(model.state_dict())
    model.loss(X, y, num_data=40).backward()
    Phi = dense.kernel.basis(X)
    k = prior_variance(Phi)
    objective = dense_log_evidence(Phi, y, dense.noise) - (40 * k.max() - k.sum()) / (2 * dense.noise)
    (-objective / 40).backward()
    for (name, p), q in zip(model.named_parameters(), dense.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-8, atol=1e-11, msg=name)


# --- 3. exact predictive ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("noise", [1e-4, 0.3])
def test_3_predictive_equals_dense_formulas(noise):
    Phi, y = random_basis(60, 8), targets(50)
    model = build(DBK, Phi, noise, correction=False)
    model.fit_posterior(rows(0, 50), y)
    mean, var = model.predict(rows(50, 60))
    dense_mean, dense_var = dense_predictive(Phi[:50], y, Phi[50:], model.noise.detach())
    torch.testing.assert_close(mean, dense_mean, rtol=0, atol=1e-9)
    torch.testing.assert_close(var, dense_var, rtol=0, atol=1e-10)
    assert (var >= 0).all() and (var <= prior_variance(Phi[50:]) + 1e-12).all()
    _, var_y = model.likelihood.predictive(mean, var)
    torch.testing.assert_close(var_y, var + model.noise.detach())


# --- 4, 5, 6, 7. SVDBK --------------------------------------------------------------------------------------------
@pytest.fixture
def svi_setting():
    Phi, y = random_basis(70, 6, seed=3), targets(60, seed=4)
    return Phi, y, build(DBK, Phi, 0.2, correction=False), build(SVDBK, Phi, 0.2, correction=False)


def test_4_elbo_is_a_lower_bound_tight_at_the_exact_posterior(svi_setting):
    Phi, y, dbk, svdbk = svi_setting
    X = rows(0, 60)
    with torch.no_grad():
        log_p = dbk.log_marginal_likelihood(X, y)
    g = torch.Generator().manual_seed(6)
    for _ in range(5):
        set_q(svdbk, torch.randn(6, generator=g, dtype=F64), random_scale_tril(6, g, 0.3, 0.2))
        assert svdbk.elbo(X, y, num_data=60).item() < log_p.item()
    m_star, L_star = optimal_q(Phi[:60], y, svdbk.noise.detach())
    set_q(svdbk, m_star, L_star)
    elbo = svdbk.elbo(X, y, num_data=60)
    assert abs(elbo.item() - log_p.item()) < 1e-9
    q_params = [svdbk.q_mu, svdbk.q_sqrt_raw]
    for grad in torch.autograd.grad(elbo, q_params):
        assert grad.abs().max() < 1e-8  # stationary in (m, L) at the optimum
    for perturb in (lambda m, L: (m + 0.01, L), lambda m, L: (m, L * 1.01), lambda m, L: (m, L * 0.99)):
        set_q(svdbk, *perturb(m_star, L_star))
        assert svdbk.elbo(X, y, num_data=60).item() < log_p.item() - 1e-7


def test_5_elbo_terms_equal_their_definitions(svi_setting):
    """Per point E_q log N(y_i | w^T phi_i, sigma^2) = log N(y_i | m^T phi_i, sigma^2) - phi_i^T S phi_i / (2 sigma^2)
    with S = L L^T (catches ||L phi|| for ||L^T phi||), and the closed-form KL equals torch's."""
    Phi, y, _, svdbk = svi_setting
    g = torch.Generator().manual_seed(7)
    m = torch.randn(6, generator=g, dtype=F64)
    L = random_scale_tril(6, g)
    set_q(svdbk, m, L)
    torch.testing.assert_close(svdbk.q_sqrt, L, rtol=0, atol=1e-14)
    s2 = svdbk.noise.detach()
    P = Phi[:60]
    expected = (-0.5 * torch.log(2 * math.pi * s2) - (y - P @ m) ** 2 / (2 * s2)
                - (P @ (L @ L.T) * P).sum(-1) / (2 * s2))
    prior = MultivariateNormal(torch.zeros(6, dtype=F64), torch.eye(6, dtype=F64))
    kl = kl_divergence(MultivariateNormal(m, scale_tril=L), prior)
    with torch.no_grad():
        torch.testing.assert_close(svdbk.elbo(rows(0, 60), y, num_data=60), expected.sum() - kl, rtol=1e-12, atol=0)


def test_6_minibatch_estimates_are_unbiased_and_the_penalty_uses_the_batch_max(svi_setting):
    Phi, y, _, svdbk = svi_setting
    svdbk.correction = True
    X = rows(0, 60)
    g = torch.Generator().manual_seed(8)
    set_q(svdbk, torch.randn(6, generator=g, dtype=F64), torch.eye(6, dtype=F64) * 0.5)
    batches = [slice(i, 60, 4) for i in range(4)]  # disjoint, b = 15
    with torch.no_grad():
        full = svdbk.elbo(X, y, num_data=60)
        torch.testing.assert_close(torch.stack([svdbk.elbo(X[b], y[b], num_data=60) for b in batches]).mean(), full,
                                   rtol=1e-12, atol=0)
        k, s2 = prior_variance(Phi[:60]), svdbk.noise
        exact_penalty = (60 * k.max() - k.sum()) / (2 * s2)
        with_full_max = [trace_penalty(k[b], k.max(), s2, 60) for b in batches]
        torch.testing.assert_close(torch.stack(with_full_max).mean(), exact_penalty, rtol=1e-12, atol=0)
        batch_max = [trace_penalty(k[b], k[b].max(), s2, 60) for b in batches]
        assert torch.stack(batch_max).mean() < exact_penalty - 1.0  # biased low, as the paper specifies
        for b, penalty_b in zip(batches, batch_max):  # the model's: the batch's own max, scaled by n/b
            torch.testing.assert_close(svdbk.objective(X[b], y[b], num_data=60),
                                       svdbk.elbo(X[b], y[b], num_data=60) - penalty_b, rtol=1e-12, atol=0)


def test_7_svi_predictive_at_the_optimum_equals_the_exact_predictive(svi_setting):
    Phi, y, dbk, svdbk = svi_setting
    set_q(svdbk, *optimal_q(Phi[:60], y, svdbk.noise.detach()))
    for model in (dbk, svdbk):
        model.fit_posterior(rows(0, 60), y)
    for a, b in zip(svdbk.predict(rows(60, 70)), dbk.predict(rows(60, 70))):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    # with the correction, SVI pads the same variance by c(x*) = max(k_max, k*) - k*, k_max over the training set
    svdbk.correction = True
    svdbk.fit_posterior(rows(0, 60), y)
    _, var_corrected = svdbk.predict(rows(60, 70))
    c_star = (prior_variance(Phi[:60]).max() - prior_variance(Phi[60:])).clamp_min(0)
    torch.testing.assert_close(var_corrected, dbk.predict(rows(60, 70))[1] + c_star, rtol=0, atol=1e-10)


def test_a_natural_gradient_step_of_size_one_on_the_full_batch_lands_on_the_exact_posterior(svi_setting):
    """SVDBK is the variational engine on the basis rows (Kuu = I, Kuf = Phi^T): its natural-gradient step is the
    engine's, and with a Gaussian likelihood one full step on every row gives q(w) = p(w | y)."""
    Phi, y, _, _ = svi_setting
    svdbk = build(SVDBK, Phi, 0.2, correction=False, natural_gradients=True, natgrad_step=1.0)
    svdbk.natural_gradient_step(rows(0, 60), y, num_data=60)
    m_star, L_star = optimal_q(Phi[:60], y, svdbk.noise.detach())
    torch.testing.assert_close(svdbk.q_mu.detach(), m_star, rtol=0, atol=1e-10)
    torch.testing.assert_close(svdbk.q_sqrt @ svdbk.q_sqrt.T, L_star @ L_star.T, rtol=0, atol=1e-10)
    # and the loss leaves q to those steps: Adam sees no gradient for it
    svdbk.loss(rows(0, 60), y, num_data=60).backward()
    assert svdbk.q_mu.grad is None and svdbk.q_sqrt_raw.grad is None


def test_svdbk_classifies_without_the_correction_and_refuses_it():
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, (90, 2))
    labels = (X[:, 0] > 0).astype(int) + (X[:, 1] > 0.5)
    clf = GPClassifier(method="svdbk", n_basis=6, width=8, epochs=20, batch_size=30, lr=0.02, progress=False)
    clf.fit(X, labels)
    assert clf.model_.correction is False and clf.model_.n_latent == 3
    assert clf.score(X, labels) > 0.7
    with pytest.raises(ValueError, match="correction=True pads a noise variance"):
        SVDBK(2, n_basis=4, width=8, likelihood="bernoulli", correction=True)


# --- 8, 9. variance correction ------------------------------------------------------------------------------------
@pytest.mark.parametrize("noise", [1e-4, 0.3])
def test_8_the_trace_bound_holds_and_the_corrected_evidence_equals_dense(noise):
    Phi, y = random_basis(50, 5, seed=9), targets(50, seed=10)
    model = build(DBK, Phi, noise)
    X, s2 = rows(0, 50), model.noise.detach()
    log_p = dense_log_evidence(Phi, y, s2)
    k = prior_variance(Phi)
    g = torch.Generator().manual_seed(11)
    for c in (torch.rand(50, generator=g, dtype=F64), k.max() - k):
        assert dense_log_evidence(Phi, y, s2, c) >= log_p - c.sum() / (2 * s2)
    zero = torch.zeros(50, dtype=F64)
    torch.testing.assert_close(dense_log_evidence(Phi, y, s2, zero), log_p - zero.sum())  # equality at c = 0
    with torch.no_grad():
        # the model's objective is that bound for c = k_max - k: divided by sigma^2, not multiplied
        torch.testing.assert_close(model.objective(X, y), log_p - (k.max() - k).sum() / (2 * s2), rtol=1e-10, atol=0)
        torch.testing.assert_close(model.corrected_log_marginal_likelihood(X, y),
                                   dense_log_evidence(Phi, y, s2, k.max() - k), rtol=1e-10, atol=0)


def test_8_the_penalty_gradient_reaches_the_argmax_row():
    """d/d phi_j of (n k_max - sum_i k_i) / (2 sigma^2) is (n [j = argmax] - 1) phi_j / sigma^2: the argmax row is
    pulled down by n - 1 times what pushes each other row up. Detaching k_max would lose that pull."""
    Phi = random_basis(20, 3, seed=19).requires_grad_(True)
    model = build(DBK, Phi.detach(), 0.3)
    (grad,) = torch.autograd.grad(model.penalty(Phi, 20), Phi)
    weight = -torch.ones(20, dtype=F64)
    weight[prior_variance(Phi).argmax()] += 20
    torch.testing.assert_close(grad, weight.unsqueeze(-1) * Phi.detach() / model.noise.detach(), rtol=1e-12, atol=0)


@pytest.mark.parametrize("noise", [1e-4, 0.3])
def test_9_corrected_predictive_equals_the_dense_heteroscedastic_gp(noise):
    Phi, y = random_basis(62, 5, seed=12), targets(50, seed=13)
    Phi[61] *= 10  # a test point with more prior variance than any training point
    model = build(DBK, Phi, noise)
    model.fit_posterior(rows(0, 50), y)
    mean, var = model.predict(rows(50, 62))
    k, k_s = prior_variance(Phi[:50]), prior_variance(Phi[50:])
    c, c_s = variance_correction(k, k.max()), variance_correction(k_s, k.max())
    dense_mean, dense_var = dense_predictive(Phi[:50], y, Phi[50:], model.noise.detach(), c, c_s)
    torch.testing.assert_close(mean, dense_mean, rtol=0, atol=1e-9)
    torch.testing.assert_close(var, dense_var, rtol=0, atol=1e-9)
    torch.testing.assert_close(k + c, torch.full_like(k, k.max().item()), rtol=0, atol=1e-15)  # uniform prior variance
    assert c.min() == 0 and c.argmin() == k.argmax()
    assert k_s[-1] > k.max() and c_s[-1] == 0 and (c_s[:-1] > 0).all()


# --- 10. Theorem 1 ------------------------------------------------------------------------------------------------
def expected_log_evidence(Sigma, f, noise):
    """E[log N(y | 0, Sigma)] over y ~ N(f, sigma^2 I) (A.4): -n/2 log 2 pi - 1/2 log|Sigma| - 1/2 f^T Sigma^-1 f
    - sigma^2 / 2 tr(Sigma^-1)."""
    P = torch.linalg.inv(Sigma)
    return (-0.5 * len(f) * math.log(2 * math.pi) - 0.5 * torch.logdet(Sigma) - 0.5 * f @ P @ f
            - 0.5 * noise * torch.trace(P))


def expected_sse(K, f, noise):
    """E ||f - E[f | y]||^2 over y ~ N(f, sigma^2 I) for prior covariance K: sigma^4 ||Sigma^-1 f||^2
    + sigma^2 ||K Sigma^-1||_F^2 with Sigma = K + sigma^2 I (A.4)."""
    P = torch.linalg.inv(K + noise * torch.eye(len(f), dtype=F64))
    return noise**2 * (P @ f).pow(2).sum() + noise * (K @ P).pow(2).sum()


@pytest.fixture
def ground_truth():
    x = torch.linspace(-1, 1, 30, dtype=F64)
    return x, torch.sin(3 * x) + 0.5, torch.cos(5 * x), 0.5


def test_10_the_rank_one_kernel_f_f_maximises_the_expected_evidence_and_minimises_the_expected_sse(ground_truth):
    x, f, g, noise = ground_truth
    eye = torch.eye(30, dtype=F64)
    rank_one = torch.outer(f, f)
    rbf = torch.exp(-0.5 * (x[:, None] - x[None, :]) ** 2 / 0.3**2)
    best_lml = expected_log_evidence(rank_one + noise * eye, f, noise)
    best_sse = expected_sse(rank_one, f, noise)
    for K in (0.5 * rank_one, 2 * rank_one, rank_one + torch.outer(g, g), rbf):
        assert expected_log_evidence(K + noise * eye, f, noise) < best_lml - 1e-3
        assert expected_sse(K, f, noise) > best_sse + 1e-3
    # stationary there: the gradient in P = Sigma^-1, 1/2 Sigma - 1/2 f f^T - sigma^2/2 I, vanishes
    P = torch.linalg.inv(rank_one + noise * eye).requires_grad_(True)
    value = 0.5 * torch.logdet(P) - 0.5 * f @ P @ f - 0.5 * noise * torch.trace(P)
    (grad,) = torch.autograd.grad(value, P)
    assert grad.abs().max() < 1e-10


def test_10_monte_carlo_of_the_models_evidence_agrees_with_the_closed_form(ground_truth):
    """The rank-1 DBK phi(x_i) = f(x_i): its O(n r^2) evidence averaged over 2000 draws of y ~ N(f, sigma^2 I)."""
    _, f, _, noise = ground_truth
    model = build(DBK, f.unsqueeze(-1), noise, learn_noise=False)
    torch.manual_seed(14)
    with torch.no_grad():
        ys = f + math.sqrt(noise) * torch.randn(2000, 30, dtype=F64)
        draws = torch.stack([model.log_marginal_likelihood(rows(0, 30), y) for y in ys])
    closed = expected_log_evidence(torch.outer(f, f) + noise * torch.eye(30, dtype=F64), f, noise)
    assert abs(draws.mean() - closed) < 0.01 * abs(closed)


def test_10_learned_noise_collapses_without_the_correction_and_not_with_it():
    """Theorem 1's pathology in the model itself: with the collapsed basis phi(x_i) = y_i (Sigma = y y^T + sigma^2 I),
    the evidence grows without bound as sigma^2 -> 0, so training drives sigma^2 to the floor; the trace penalty
    (n k_max - sum y_i^2) / (2 sigma^2) grows faster and puts the optimum of the corrected objective well above it."""
    y = targets(40, seed=15)
    lml, corrected = [], []
    grid = torch.logspace(-6, 0, 25, dtype=F64)
    for s2 in grid.tolist():
        model = build(DBK, y.unsqueeze(-1), s2, learn_noise=False)
        with torch.no_grad():
            lml.append(model.log_marginal_likelihood(rows(0, 40), y).item())
            corrected.append(model.objective(rows(0, 40), y).item())
    assert all(a > b for a, b in zip(lml, lml[1:]))  # increasing as sigma^2 decreases: argmax at the floor
    assert grid[int(np.argmax(corrected))] > 1e-2


# --- 11. overconfidence, deterministically ------------------------------------------------------------------------
def f_gt(x):
    """The paper's 1-D ground truth."""
    s = torch.sigmoid
    return (0.3 * (1 - s(200 * (x + 0.6))) + 0.9 * (s(200 * (x + 0.6)) - s(200 * x))
            - 0.6 * (s(200 * x) - s(200 * (x - 0.4))) + 0.01 * torch.sin(50 * torch.sin(10 * x)))


@pytest.mark.parametrize("cls", [DBK, SVDBK])
@pytest.mark.parametrize("noise", [1e-2, 1e-4, 1e-6])
def test_11_the_correction_repairs_the_collapsed_basis_in_the_gap(cls, noise):
    """Train points in |x| > 0.25, test points in the gap; the collapsed rank-1 basis phi(x_i) = y_i on training
    points and a small phi(x*) = 0.05 in the gap. Uncorrected intervals shrink with sigma^2; corrected ones do not."""
    g = torch.Generator().manual_seed(16)
    x = torch.rand(400, generator=g, dtype=F64) * 2 - 1
    x_train, x_test = x[x.abs() > 0.25][:200], x[x.abs() < 0.25][:50]
    y_train = f_gt(x_train) + 0.1 * torch.randn(len(x_train), generator=g, dtype=F64)
    y_test = f_gt(x_test) + 0.1 * torch.randn(len(x_test), generator=g, dtype=F64)
    table = torch.cat([y_train, torch.full((50,), 0.05, dtype=F64)]).unsqueeze(-1)
    results = {}
    for correction in (False, True):
        model = build(cls, table, noise, correction=correction)
        if cls is SVDBK:
            set_q(model, *optimal_q(table[:200], y_train, model.noise.detach()))
        model.fit_posterior(rows(0, 200), y_train)
        mean, var = model.predict(rows(200, 250))
        nll = -model.likelihood.log_predictive_density(y_test, mean, var).mean().item()
        sd = model.likelihood.predictive(mean, var)[1].sqrt()
        results[correction] = nll, ((y_test - mean).abs() < 1.96 * sd).double().mean().item()
    assert results[False][0] > 10 and results[False][1] < 0.05
    assert results[True][0] < 1.5 and results[True][1] > 0.95


# --- calibrated noise (not in the paper) --------------------------------------------------------------------------
@pytest.mark.parametrize("correction", [True, False])
def test_dbk_calibrated_noise_maximises_the_dense_evidence_and_the_posterior_uses_it(correction):
    g = torch.Generator().manual_seed(19)
    Phi = random_basis(64, 5, seed=19)
    Phi = Phi / Phi.norm(dim=1, keepdim=True) * (1 + 0.2 * torch.rand(64, 1, generator=g, dtype=F64))
    y = Phi[:60] @ torch.randn(5, generator=g, dtype=F64) + 0.2 * torch.randn(60, generator=g, dtype=F64)
    model = build(DBK, Phi, 0.3, correction=correction, calibrate_noise="posterior")
    model.fit_posterior(rows(0, 60), y)
    s2 = model.noise.item()
    k = prior_variance(Phi[:60])
    c = (k.max() - k) if correction else torch.zeros(60, dtype=F64)
    evidence = [dense_log_evidence(Phi[:60], y, s2 * f, c).item() for f in (0.99, 1.0, 1.01)]
    assert evidence[1] > max(evidence[0], evidence[2]) and abs(s2 - 0.3) > 0.01
    mean, var = model.predict(rows(60, 64))
    c_s = (k.max() - prior_variance(Phi[60:])).clamp_min(0) if correction else None
    expected = dense_predictive(Phi[:60], y, Phi[60:], s2, c if correction else None, c_s)
    for a, b in zip((mean, var), expected):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)
    model.clear_cache()  # forgetting the posterior restores the trained noise
    assert model.noise.item() == pytest.approx(0.3)


@pytest.mark.parametrize("correction", [True, False])
def test_dbk_held_out_noise_maximises_the_dense_held_out_density_and_the_posterior_on_all_rows_takes_it(correction):
    """After calibrate_on_held_out, sigma^2 maximises sum_h log N(y_h | E[f_h], Var[f_h] + sigma^2) over the held-out
    rows, the posterior from the fit rows (dense GP, corrected by the fit rows' k_max); the next posterior fit, on
    every row, takes that sigma^2, and a later one goes back to the evidence."""
    g = torch.Generator().manual_seed(23)
    Phi = random_basis(80, 5, seed=23)
    Phi = Phi / Phi.norm(dim=1, keepdim=True) * (1 + 0.2 * torch.rand(80, 1, generator=g, dtype=F64))
    y = Phi[:70] @ torch.randn(5, generator=g, dtype=F64) + 0.3 * torch.randn(70, generator=g, dtype=F64)
    model = build(DBK, Phi, 0.3, correction=correction, calibrate_noise="posterior")
    model.calibrate_on_held_out(rows(0, 50), y[:50], rows(50, 70), y[50:])
    s2 = model.held_out_noise
    k_fit, k_held = prior_variance(Phi[:50]), prior_variance(Phi[50:70])
    c, c_h = ((k_fit.max() - k_fit), (k_fit.max() - k_held).clamp_min(0)) if correction else (None, None)

    def held_out_log_density(noise):
        mean, var = dense_predictive(Phi[:50], y[:50], Phi[50:70], noise, c, c_h)
        return Normal(mean, (var + noise).sqrt()).log_prob(y[50:]).sum().item()

    density = [held_out_log_density(s2 * f) for f in (0.99, 1.0, 1.01)]
    assert density[1] > max(density[0], density[2]) and abs(s2 - 0.3) > 0.01
    model.fit_posterior(rows(0, 70), y)
    assert model.noise.item() == pytest.approx(s2) and model.held_out_noise is None
    k = prior_variance(Phi[:70])
    c_all, c_s = ((k.max() - k), (k.max() - prior_variance(Phi[70:])).clamp_min(0)) if correction else (None, None)
    expected = dense_predictive(Phi[:70], y, Phi[70:], s2, c_all, c_s)
    for a, b in zip(model.predict(rows(70, 80)), expected):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)
    model.fit_posterior(rows(0, 70), y)  # no held-out rows this time: the evidence's sigma^2
    assert abs(model.noise.item() - s2) > 1e-3
    model.clear_cache()  # forgetting the posterior restores the trained noise
    assert model.noise.item() == pytest.approx(0.3)


def test_dbk_defaults_hold_out_a_tenth_of_the_rows_for_the_noise_and_converge_on_the_training_loss():
    X, y = make_friedman1(600, rng=3, d=5)
    seen = []
    original = DBK.held_out_optimal_noise

    def recording(self, X_fit, y_fit, X_held, y_held, comm=gpscale.distributed.LOCAL):
        seen.append((X_fit.shape[0], X_held.shape[0], original(self, X_fit, y_fit, X_held, y_held, comm)))
        return seen[-1][2]

    with patch.object(DBK, "held_out_optimal_noise", recording):
        reg = GPRegressor(method="dbk", n_basis=8, width=16, max_steps=100, progress=False).fit(X, y)
    assert [s[:2] for s in seen] == [(540, 60)]  # once, after training: no validation passes while converging
    assert reg.model_.noise.item() == pytest.approx(seen[0][2], rel=1e-5)
    assert all("val_nlpd" not in record for record in reg.fit_result_.history)
    with patch.object(DBK, "held_out_optimal_noise", recording):
        GPRegressor(method="dbk", n_basis=8, width=16, max_steps=100, val_fraction=0, progress=False).fit(X, y)
    assert len(seen) == 1  # nothing held out: the evidence's sigma^2


def test_svdbk_calibrated_noise_maximises_the_expected_log_likelihood():
    """Without the correction the optimum is closed form, sigma^2 = mean_i [(y_i - m^T phi_i)^2 + ||L^T phi_i||^2];
    with it, the derivative sum_i (e_i - s_i) / s_i^2 of the expected log-likelihood vanishes at s_i = sigma^2 + c_i."""
    Phi, y = random_basis(60, 4, seed=21), targets(60, seed=22)
    g = torch.Generator().manual_seed(23)
    q_mean, q_L = 0.3 * torch.randn(4, generator=g, dtype=F64), random_scale_tril(4, g, 0.1, 0.05)
    e = (y - Phi @ q_mean) ** 2 + ((Phi @ q_L) ** 2).sum(-1)
    for correction in (False, True):
        model = build(SVDBK, Phi, 0.3, correction=correction, calibrate_noise="variance")
        set_q(model, q_mean, q_L)
        model.fit_posterior(rows(0, 60), y)
        s2 = model.noise.item()
        if not correction:
            assert s2 == pytest.approx(e.mean().item(), rel=1e-6)
        else:
            k = prior_variance(Phi)
            s = s2 + (k.max() - k)
            assert abs(((e - s) / s**2).sum().item()) < 1e-6 * (e / s**2).sum().item()
        mean, var = model.predict(rows(0, 3))  # the predictive keeps q(w)
        torch.testing.assert_close(mean, Phi[:3] @ q_mean, rtol=1e-10, atol=1e-12)


# --- 12. end to end (slow) ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_12_trained_end_to_end_the_correction_lowers_the_gap_nll():
    """1-D f_gt, 1,000 training points in |x| > 0.25 and 200 test points in the gap, r = 32 bases from a 2-layer
    tanh MLP of width 32, 2,000 full-batch Adam steps at lr 1e-2, seeds 0-2 (about 2 minutes on one core).

    Calibration (2026-11-23, this configuration): gap NLL 4.4 / 5.1 / 8.5 uncorrected against 2.7 / 4.4 / 5.7
    corrected, gap coverage 0.38-0.47 against 0.56-0.62. The spec also expects the uncorrected sigma^2 to end
    clearly below the true 0.01; at this budget it did not (0.0098-0.0102), as in docs/dbk.md's Fig. 1 run, so
    that is not asserted. With width 64 and 6,000 steps seed 0 reversed the NLL order (3.0 against 8.3): the
    margin is this configuration's, not a general law."""
    nll, coverage = {False: [], True: []}, {False: [], True: []}
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        x = torch.rand(2000, generator=g, dtype=F64) * 2 - 1
        x_train, x_test = x[x.abs() > 0.25][:1000], x[x.abs() < 0.25][:200]
        y_train = f_gt(x_train) + 0.1 * torch.randn(len(x_train), generator=g, dtype=F64)
        y_test = f_gt(x_test) + 0.1 * torch.randn(len(x_test), generator=g, dtype=F64)
        for correction in (False, True):
            model = DBK(1, n_basis=32, network="mlp", width=32, correction=correction).double()
            fit(model, x_train.unsqueeze(-1), y_train, epochs=2000, lr=1e-2, seed=seed, progress=False)
            mean, var = model.predict(x_test.unsqueeze(-1))
            nll[correction].append(-model.likelihood.log_predictive_density(y_test, mean, var).mean().item())
            sd = model.likelihood.predictive(mean, var)[1].sqrt()
            coverage[correction].append(((y_test - mean).abs() < 1.96 * sd).double().mean().item())
    assert np.mean(nll[True]) < np.mean(nll[False]) - 0.5
    assert np.mean(coverage[False]) < 0.8


# --- 13. scaling and memory ---------------------------------------------------------------------------------------
def network_rows(model, action):
    """The row counts of every call of the model's network while ``action()`` runs."""
    seen = []
    hook = model.kernel.network.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape[0]))
    try:
        action()
    finally:
        hook.remove()
    return seen


def test_13_evidence_gradient_and_prediction_at_n_200k_never_form_an_n_by_n_matrix():
    """n = 2 x 10^5, r = 16: a dense n x n float64 matrix would take 320 GB; the O(n r) path holds the basis
    [n, r] (26 MB) and one chunk of activations. The network sees chunk_size rows at a time, each row twice per
    evidence gradient (checkpointed forward, recomputed for backward) and once per prediction: work linear in n.
    Wall-clock time is not asserted (never gate a test on it)."""
    n, r, chunk = 200_000, 16, 25_000
    X = torch.linspace(-1, 1, n, dtype=F64).unsqueeze(-1)
    y = torch.sin(3 * X[:, 0])
    model = DBK(1, n_basis=r, network="mlp", width=16, chunk_size=chunk).double()

    def evidence_gradient():
        model.loss(X, y, n).backward()

    with PeakMemory() as peak:
        train_rows = network_rows(model, evidence_gradient)
        model.fit_posterior(X, y)
        predict_rows = network_rows(model, lambda: model.predict(X))
    assert max(train_rows + predict_rows) <= chunk
    assert sum(train_rows) == 2 * n and sum(predict_rows) == n
    assert all(torch.isfinite(p.grad).all() for p in model.kernel.network.parameters())
    assert peak.mb < 400, f"peak {peak.mb:.0f} MB"


def saved_bytes_by_dtype(action):
    """Bytes of the distinct storages autograd saves for backward while ``action()`` runs, by dtype."""
    storages = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = (tensor.dtype, storage.nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        action()
    totals = {}
    for dtype, nbytes in storages.values():
        totals[dtype] = totals.get(dtype, 0) + nbytes
    return totals


def test_13_a_float32_evidence_keeps_no_float64_copy_of_the_basis_for_backward():
    """The Gram matrix and the residual are float64 (the evidence's small differences), but a float32 model's basis
    Phi [n, r] is cast chunk by chunk and cast again in the backward pass: at 1.8 million rows and r = 128 a kept
    float64 copy was 1.8 GB more, twice (the statistics and the residual)."""
    n, r = 20_000, 32
    model = DBK(4, n_basis=r, network="mlp", width=16, chunk_size=2_048).float()
    X, y = torch.randn(n, 4), torch.randn(n)
    saved = saved_bytes_by_dtype(lambda: model.loss(X, y, n))
    basis_in_float64 = n * r * 8
    assert saved.get(F64, 0) < basis_in_float64 / 10, saved
    assert saved[torch.float32] < 3 * n * r * 4, saved  # the basis itself and the network's chunk inputs


@pytest.mark.parametrize("noise", [1e-6, 1e-4, 0.3])
def test_13_a_float32_basis_gets_the_evidence_gradient_to_float32_precision(noise):
    """The held features' statistics form dPhi in Phi's dtype. With y in Phi's span to 1e-4 and a small noise, a
    data fit that reached Phi through (Phi^T Phi, Phi^T y) would send two terms of order 1 / sigma^2 there that
    cancel (relative errors of 2.5e-3 and 2.7e-3 at sigma^2 = 1e-6 and 1e-4, measured so); the residual evidence
    sends only the log determinant's, so a float32 basis, in chunks, gets the dense float64 gradient to float32's
    precision (8e-8). Phi and y are exact in float32, so that both sides see the same problem."""
    n, r = 300, 8
    Phi = random_basis(n, r).float().double()
    w = torch.randn(r, generator=torch.Generator().manual_seed(2), dtype=F64)
    y = (3 * Phi @ w + 1e-4 * targets(n)).float().double()
    model = build(DBK, Phi.float(), noise, chunk_size=64).float()
    model.log_marginal_likelihood(rows(0, n).float(), y.float()).backward()
    table = Phi.clone().requires_grad_(True)
    dense_log_evidence(table, y, model.noise.detach().double()).backward()
    error = (model.kernel.network.table.grad.double() - table.grad).abs().max()
    assert error < 1e-5 * table.grad.abs().max(), (error, table.grad.abs().max())


def test_13_an_svi_step_touches_the_batch_only_whatever_n():
    """SVDBK's minibatch loss runs the network on the batch's b rows whether the data set has 10^3 or 10^9 rows:
    the step's cost is independent of n (only the n / b scale of the estimate changes)."""
    model = SVDBK(3, n_basis=8, network="mlp", width=8).double()
    Xb, yb = torch.randn(64, 3, dtype=F64), torch.randn(64, dtype=F64)
    for num_data in (10**3, 10**9):
        assert network_rows(model, lambda: model.loss(Xb, yb, num_data).backward()) == [64]


# --- 14. shapes and chunking --------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [DBK, SVDBK])
def test_14_chunked_fit_and_prediction_equal_one_shot_and_use_the_training_max(cls):
    Phi, y = random_basis(73, 4, seed=17), targets(60, seed=18)
    Phi[70] *= 10  # its prior variance exceeds k_max: a chunk max would change its neighbours' c(x*)
    one_shot, chunked = build(cls, Phi, 0.1, chunk_size=10**6), build(cls, Phi, 0.1, chunk_size=1)
    for model in (one_shot, chunked):
        model.fit_posterior(rows(0, 60), y)
    torch.testing.assert_close(chunked.cache["k_max"], prior_variance(Phi[:60]).max(), rtol=0, atol=0)
    mean, var = chunked.predict(rows(60, 73))
    assert mean.shape == var.shape == (13,) and (var > 0).all()
    for a, b in zip((mean, var), one_shot.predict(rows(60, 73))):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


# --- networks, options, optimisation recipe -----------------------------------------------------------------------
def test_built_in_networks_are_wired_as_documented():
    net = mlp(3, 16, depth=2, width=128, activation="tanh")
    assert [type(m) for m in net] == [nn.Linear, Tanh, nn.Linear, Tanh, nn.Linear]
    shapes = [(m.in_features, m.out_features) for m in net if isinstance(m, nn.Linear)]
    assert shapes == [(3, 128), (128, 128), (128, 16)]
    res = residual_mlp(3, 16, depth=3, width=8, activation="relu").double()
    X = torch.randn(5, 3, dtype=F64)
    with torch.no_grad():
        for block in res[2:4]:  # zeroed residual layers pass their input through: h + relu(0) = h
            block.linear.weight.zero_()
            block.linear.bias.zero_()
        torch.testing.assert_close(res(X), res[4](res[1](res[0](X))))
    n_parameters = [sum(p.numel() for p in net.parameters()) for net in (residual_mlp(3, 16, depth=2), mlp(3, 16))]
    assert n_parameters[0] == n_parameters[1]
    kernel = DeepBasisKernel(mlp(3, 16).double(), 16, scale_basis=True)
    torch.testing.assert_close(kernel.basis(X), kernel.network(X) / 4)
    torch.testing.assert_close(kernel(X, X), kernel.basis(X) @ kernel.basis(X).T)
    torch.testing.assert_close(kernel.diag(X), kernel(X, X).diagonal())


@pytest.mark.parametrize("sigmoid_form", [True, False])
@pytest.mark.parametrize("dtype, atol", [(torch.float32, 3e-7), (F64, 1e-15)])
def test_the_tanh_activation_is_tanh_in_value_and_gradient(dtype, atol, sigmoid_form, monkeypatch):
    monkeypatch.setattr(deep_basis, "cpu_tanh_is_slow", lambda: sigmoid_form)
    x = (4 * torch.randn(2000, dtype=F64, generator=torch.Generator().manual_seed(0))).to(dtype)
    x[:3] = torch.tensor([0.0, 40.0, -40.0])  # 0 and saturation
    ours, reference = (x.clone().requires_grad_() for _ in range(2))
    y = Tanh()(ours)
    assert ("SigmoidTanh" in type(y.grad_fn).__name__) is sigmoid_form  # the form the decision picked ran
    torch.testing.assert_close(y, torch.tanh(reference), rtol=0, atol=atol)
    weights = torch.randn(2000, dtype=dtype, generator=torch.Generator().manual_seed(1))
    (y * weights).sum().backward()
    (torch.tanh(reference) * weights).sum().backward()
    torch.testing.assert_close(ours.grad, reference.grad, rtol=0, atol=10 * atol)


@pytest.mark.parametrize("mkl, allowed, intel_avx512, slow", [
    (False, None, False, False),  # no MKL: torch's own vector tanh
    (True, None, True, False),  # MKL's AVX-512 tanh
    (True, "AVX512_E1", True, False),
    (True, None, False, True),  # MKL's generic code (another vendor, or no AVX-512)
    (True, "AVX2", True, True),  # MKL told not to use AVX-512
    (True, "sse4_2", True, True),
    (True, " avx512 ", True, False),  # read as written, whitespace aside
])
def test_the_sigmoid_form_of_tanh_is_taken_where_mkl_does_not_run_its_avx512_tanh(monkeypatch, mkl, allowed,
                                                                                   intel_avx512, slow):
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: mkl)
    monkeypatch.setattr(deep_basis.platform, "system", lambda: "Linux")
    monkeypatch.setattr(deep_basis, "_intel_with_avx512", lambda: intel_avx512)
    if allowed is None:
        monkeypatch.delenv("MKL_ENABLE_INSTRUCTIONS", raising=False)
    else:
        monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", allowed)
    assert deep_basis.cpu_tanh_is_slow.__wrapped__() is slow


@pytest.mark.parametrize("vendor, flags, expected", [
    ("GenuineIntel", "fpu sse4_2 avx2 avx512f avx512dq", True),
    ("GenuineIntel", "fpu sse4_2 avx2", False),  # an Intel processor without AVX-512
    ("AuthenticAMD", "fpu sse4_2 avx2 avx512f", False),  # AVX-512, but MKL takes its generic code
    ("GenuineIntel", "fpu avx512fp16 avx2", False),  # a longer flag is not avx512f
])
def test_the_processor_is_read_from_cpuinfo(tmp_path, vendor, flags, expected):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: 6\nflags\t\t: {flags}\n\n"
                       f"processor\t: 1\nvendor_id\t: {vendor}\nflags\t\t: {flags}\n")
    assert deep_basis._intel_with_avx512(str(cpuinfo)) is expected


def test_defaults_follow_the_paper():
    model = DBK(3)
    assert model.n_basis == 128 and model.correction and model.weight_decay == 1e-4
    assert model.noise.item() == pytest.approx(1e-2, rel=1e-6) and model.likelihood.noise_floor == 1e-6
    # "2-layer ResNet": the input layer, then two residual layers, then the r outputs; "2-layer MLP": two layers
    for network, n_residual, n_linear in (("resnet", 2, 4), ("mlp", 0, 3)):
        modules = list(DBK(3, network=network).kernel.network.modules())
        linear = [(m.in_features, m.out_features) for m in modules if isinstance(m, nn.Linear)]
        assert linear == [(3, 128)] + [(128, 128)] * (n_linear - 1)
        assert sum(isinstance(m, ResidualLayer) for m in modules) == n_residual
        assert any(isinstance(m, Tanh) for m in modules)
    assert len(DBK(3, depth=2).kernel.network) == 4  # an explicit depth overrides the default
    assert get_model_class("dbk") is DBK and get_model_class("svdbk") is SVDBK
    assert DBK.full_batch and not SVDBK.full_batch


def test_the_library_defaults_scale_the_built_in_network_and_calibrate_dbk_noise():
    """Not the paper's (its protocols pass scale_basis=False, calibrate_noise=None): a built-in network's output is
    divided by sqrt(r), a given module is used as given, and exact DBK re-estimates sigma^2 after training."""
    assert DBK(3).kernel.scale_basis and SVDBK(3).kernel.scale_basis
    assert not DBK(2, n_basis=5, network=nn.Linear(2, 5)).kernel.scale_basis
    assert not DBK(3, scale_basis=False).kernel.scale_basis
    assert DBK(3).calibrate_noise == "posterior" and SVDBK(3).calibrate_noise is None
    assert DBK(3, calibrate_noise=None).calibrate_noise is None


def test_the_default_network_starts_within_reach_of_the_data():
    """With the paper's unscaled outputs a freshly drawn ResNet's prior variances ||phi(x)||^2 spread over tens, and
    at sigma^2 = 1e-2 the trace penalty starts hundreds of nats a point above the model that ignores the inputs,
    where L-BFGS stalled; scaled by 1/sqrt(r) it starts within a few tens."""
    X, y = make_friedman1(1_000, rng=0, d=11)
    X, y = torch.tensor(X, dtype=torch.float32), torch.tensor((y - y.mean()) / y.std(), dtype=torch.float32)
    starts = {}
    for scale_basis in (None, False):
        torch.manual_seed(0)
        model = DBK(11, scale_basis=scale_basis).float()
        model.initialise_from_data(X, y)
        with torch.no_grad():
            starts[scale_basis] = model.loss(X, y, num_data=1_000).item() - model.likelihood.null_loss(y)
    assert starts[None] < 30 and starts[False] > 100, starts


@pytest.mark.parametrize("options, message", [
    (dict(network="transformer"), "network must be"),
    (dict(n_basis=0), "n_basis .* must be an integer >= 1, got 0"),
    (dict(depth=1.5), "depth .* must be an integer >= 1, got 1.5"),
    (dict(activation="sigmoid"), "activation must be one of"),
    (dict(weight_decay=-1.0), "weight_decay .* must be a number >= 0"),
    (dict(kernel="matern32"), "takes no kernel"),
    (dict(lengthscale=0.3), "lengthscale belong to stationary kernels"),
    (dict(noise=1e-7), "above noise_floor"),
    (dict(scale_basis="yes"), "scale_basis must be True, False or None"),
])
def test_bad_options_get_a_clear_error(options, message):
    with pytest.raises(ValueError, match=message):
        DBK(2, **options)


def test_a_network_with_the_wrong_output_width_is_rejected_at_first_use():
    model = DBK(2, n_basis=8, network=nn.Linear(2, 5)).double()
    with pytest.raises(ValueError, match=r"to \(4, 5\); a deep basis kernel needs \[4, n_basis=8\]"):
        model.loss(torch.zeros(4, 2, dtype=F64), torch.zeros(4, dtype=F64), num_data=4)


def test_weight_decay_reaches_the_network_only():
    X = torch.rand(30, 2, dtype=F64)
    y = torch.sin(3 * X[:, 0])
    model = SVDBK(2, n_basis=4, width=8, weight_decay=0.5).double()
    seen = []
    adam = torch.optim.Adam

    def spy(groups, **kwargs):
        optimiser = adam(groups, **kwargs)
        seen.append(optimiser)
        return optimiser

    with patch("torch.optim.Adam", spy):
        fit(model, X, y, epochs=1, batch_size=10, progress=False)
    decay = {id(p): group["weight_decay"] for group in seen[0].param_groups for p in group["params"]}
    network = {id(p) for p in model.kernel.network.parameters()}
    assert {decay[i] for i in network} == {0.5}
    others = [model.likelihood.raw_noise, model.q_mu, model.q_sqrt_raw]
    assert [decay[id(p)] for p in others] == [0.0] * 3
    assert len(decay) == len(list(model.parameters()))


def test_built_in_networks_are_drawn_from_the_training_seed_and_user_networks_kept():
    X = torch.rand(30, 2, dtype=F64)
    y = torch.sin(3 * X[:, 0])
    runs = []
    for seed in (0, 0, 1):
        model = DBK(2, n_basis=4, width=8).double()
        fit(model, X, y, epochs=2, seed=seed, progress=False)
        runs.append(model.predict(X)[0])
    torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0)
    assert not torch.allclose(runs[0], runs[2])
    user = nn.Linear(2, 4).double()
    before = user.weight.detach().clone()
    model = SVDBK(2, n_basis=4, network=user).double()
    set_q(model, torch.ones(4, dtype=F64), 2 * torch.eye(4, dtype=F64))
    model.initialise_from_data(X, y)
    assert torch.equal(model.kernel.network.weight, before)
    assert torch.equal(model.q_mu, torch.zeros(4, dtype=F64))  # q(w) restarts at the prior N(0, I)
    torch.testing.assert_close(model.q_sqrt, torch.eye(4, dtype=F64), rtol=0, atol=1e-15)


# --- estimator ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method, options", [
    ("dbk", dict(epochs=200, lr=0.01)),
    ("svdbk", dict(epochs=100, batch_size=32, lr=0.01)),
])
def test_regressor_fits_predicts_and_round_trips(tmp_path, method, options):
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, (200, 2))
    y = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] + 0.1 * rng.standard_normal(200) + 3.0
    reg = GPRegressor(method=method, n_basis=16, width=32, progress=False, **options).fit(X[:150], y[:150])
    mean, std = reg.predict(X[150:], return_std=True)
    assert np.sqrt(np.mean((mean - y[150:]) ** 2)) < 0.3  # y has std ~1.1 and mean 3: units restored
    assert (std > 0).all()
    path = tmp_path / "model.gps"
    reg.save(path)
    loaded = gpscale.load(path)
    assert loaded.model_.key == method and loaded.model_.cache.keys() == reg.model_.cache.keys()
    for a, b in zip((mean, std), loaded.predict(X[150:], return_std=True)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("method", ["dbk", "svdbk"])
def test_predicting_outside_the_training_box_warns_and_the_box_survives_a_round_trip(tmp_path, method):
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, (120, 2)) * [1.0, 3.0]
    y = np.sin(3 * X[:, 0]) + 0.1 * rng.standard_normal(120)
    with warnings.catch_warnings():
        # validation rows, which may leave the box of the rows trained on, never warn; nor do the training rows
        warnings.simplefilter("error", ExtrapolationWarning)
        reg = GPRegressor(method=method, n_basis=4, width=8, epochs=5, batch_size=32, val_fraction=0.3,
                          progress=False).fit(X, y)
        reg.predict(X)
    span = np.ptp(X, axis=0)
    beyond = np.array([[X[:, 0].max() + 0.2 * span[0], 0.0],   # 0.2 of feature 0's range above its maximum
                       [0.0, X[:, 1].min() - 0.1 * span[1]]])  # 0.1 of feature 1's range below its minimum
    path = tmp_path / "model.gps"
    reg.save(path)
    for model in (reg, gpscale.load(path)):
        with pytest.warns(ExtrapolationWarning, match=r"^2 of 5 rows .*at most 0\.2 times feature 0's") as record:
            model.predict(np.vstack([X[:3], beyond]))
        assert record[0].filename == __file__  # the warning points at the caller's line


def test_leaving_a_feature_that_was_constant_in_training_is_reported_as_a_distance():
    rng = np.random.default_rng(1)
    X = np.column_stack([rng.uniform(-1, 1, 80), np.full(80, 2.0)])  # feature 1 has no training range
    y = np.sin(3 * X[:, 0]) + 0.1 * rng.standard_normal(80)
    reg = GPRegressor(method="dbk", n_basis=4, width=8, epochs=5, progress=False).fit(X, y)
    rows = np.array([[0.0, 2.0], [0.0, 2.5], [X[:, 0].max() + 0.5 * np.ptp(X[:, 0]), 2.0]])
    with pytest.warns(ExtrapolationWarning) as record:
        reg.predict(rows)
    # the constant feature's excursion has no relative size, so it is the worst one, given in the inputs' units
    assert str(record[0].message).startswith("2 of 3 rows lie outside the range of the training inputs (feature 1 "
                                             "took one value in training, and these rows lie up to 0.5 away from it)")

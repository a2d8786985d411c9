"""Derivation-level checks of the baselines against dense references and each other."""
from unittest.mock import patch

import pytest
import torch
from torch.distributions import MultivariateNormal

from conftest import toy_regression
from gpscale.models import get_model_class
from gpscale.models.linear import engine as linear_engine, weight_space as weight_space
from gpscale.models.base import NotFittedPosteriorError
from gpscale.models.exact.gp import ExactGP
from gpscale.models.linear.sgpr import SGPR
from gpscale.models.variational.svgp import SVGP

HYPERS = dict(lengthscale=0.6, outputscale=1.4, noise=0.05)


def build(cls, X, Z=None, **options):
    model = cls(X.shape[1], **HYPERS, **options).double()
    if Z is not None:
        z_param = model.features.Z
        with torch.no_grad():
            z_param.copy_(Z)
    return model


def dense_log_evidence(model, X, y):
    K = model.kernel(X, X) + model.noise * torch.eye(X.shape[0], dtype=X.dtype)
    return MultivariateNormal(torch.zeros_like(y), K).log_prob(y)


@pytest.fixture
def data():
    return toy_regression(n=60, d=2)


def test_exact_log_marginal_likelihood_equals_dense_formula(data):
    X, y = data
    model = build(ExactGP, X)
    torch.testing.assert_close(model.log_marginal_likelihood(X, y), dense_log_evidence(model, X, y))


def test_exact_prediction_equals_dense_formula(data):
    X, y = data
    Xs = torch.rand(7, 2, dtype=torch.float64)
    model = build(ExactGP, X)
    model.fit_posterior(X, y)
    mean, var = model.predict(Xs)
    K = model.kernel(X, X) + model.noise * torch.eye(len(X), dtype=X.dtype)
    Ks = model.kernel(X, Xs)
    torch.testing.assert_close(mean, Ks.T @ torch.linalg.solve(K, y))
    torch.testing.assert_close(var, model.kernel.diag(Xs) - (Ks * torch.linalg.solve(K, Ks)).sum(0))


@pytest.mark.parametrize("solver", ["cholesky", "qr"])
def test_sgpr_with_inducing_points_at_the_data_equals_the_exact_gp(data, solver):
    X, y = data
    exact = build(ExactGP, X)
    sgpr = build(SGPR, X, Z=X, n_inducing=len(X), jitter=0.0, solver=solver)
    torch.testing.assert_close(sgpr.elbo(X, y), exact.log_marginal_likelihood(X, y), rtol=1e-6, atol=0)
    Xs = torch.rand(11, 2, dtype=torch.float64) * 4 - 2
    exact.fit_posterior(X, y)
    sgpr.fit_posterior(X, y)
    for ours, ref in zip(sgpr.predict(Xs), exact.predict(Xs)):
        torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-9)


def test_sgpr_bound_is_below_the_exact_evidence_and_tightens_with_more_inducing_points(data):
    X, y = data
    exact = build(ExactGP, X).log_marginal_likelihood(X, y)
    bounds = [build(SGPR, X, Z=X[:m], n_inducing=m).elbo(X, y) for m in (5, 15, 40)]
    assert bounds[0] < bounds[1] < bounds[2] < exact


def test_sgpr_qr_and_cholesky_solvers_agree(data):
    X, y = data
    Z = X[::4]
    a = build(SGPR, X, Z=Z, n_inducing=len(Z), solver="cholesky")
    b = build(SGPR, X, Z=Z, n_inducing=len(Z), solver="qr")
    torch.testing.assert_close(a.elbo(X, y), b.elbo(X, y), rtol=1e-10, atol=0)


def test_svgp_at_the_optimal_q_attains_the_sgpr_bound_and_predicts_identically(data):
    X, y = data
    Z = X[::3]
    sgpr = build(SGPR, X, Z=Z, n_inducing=len(Z))
    svgp = build(SVGP, X, Z=Z, n_inducing=len(Z))
    q_mu, q_sqrt = sgpr.optimal_q(X, y)
    with torch.no_grad():
        svgp.q_mu.copy_(q_mu)
        svgp.q_sqrt_raw.copy_(q_sqrt)
    torch.testing.assert_close(svgp.elbo(X, y, num_data=len(X)), sgpr.elbo(X, y), rtol=1e-8, atol=0)
    sgpr.fit_posterior(X, y)
    svgp.fit_posterior(X, y)
    Xs = torch.rand(9, 2, dtype=torch.float64)
    for ours, ref in zip(svgp.predict(Xs), sgpr.predict(Xs)):
        torch.testing.assert_close(ours, ref, rtol=1e-8, atol=1e-10)


def test_one_natural_gradient_step_of_size_one_on_the_full_batch_lands_on_the_optimal_q(data):
    """With a Gaussian likelihood the ELBO is quadratic in q's natural parameters: a step of size 1 from any q
    reaches SGPR's optimal q, whatever the batch split between the data term and the KL."""
    X, y = data
    Z = X[::3]
    sgpr = build(SGPR, X, Z=Z, n_inducing=len(Z))
    svgp = build(SVGP, X, Z=Z, n_inducing=len(Z), natgrad_step=1.0)
    with torch.no_grad():
        svgp.q_mu.normal_()
        svgp.q_sqrt_raw.mul_(0.5)
    svgp.natural_gradient_step(X, y, num_data=len(X))
    q_mu, q_sqrt = sgpr.optimal_q(X, y)
    torch.testing.assert_close(svgp.q_mu.detach(), q_mu, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(svgp.q_sqrt @ svgp.q_sqrt.T, q_sqrt @ q_sqrt.T, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("options", [dict(), dict(likelihood="robustmax", n_classes=3)], ids=["one", "multiclass"])
def test_natural_gradient_steps_raise_the_elbo_of_blocks_and_latent_functions(data, options):
    from gpscale.models.harmonic.hvgp import HVGP

    X, y = data
    if options:
        y = torch.bucketize(y, torch.quantile(y, torch.tensor([1 / 3, 2 / 3], dtype=y.dtype))).to(y.dtype)
    model = HVGP(2, n_inducing=6, n_ways=1, natgrad_step=0.5, natural_gradients=True, **options).double()
    model.initialise(X, y)
    assert model.blocks == 2 and (model.n_latent == 3) == bool(options)
    before = model.elbo(X, y, num_data=len(X))
    for _ in range(3):
        model.natural_gradient_step(X, y, num_data=len(X))
    assert model.elbo(X, y, num_data=len(X)) > before + 1.0
    assert all(p is not model.q_mu and p is not model.q_sqrt_raw for p in model.parameter_groups()[0]["params"])


def test_svgp_elbo_is_below_the_exact_evidence_for_any_q(data):
    X, y = data
    svgp = build(SVGP, X, Z=X[::2], n_inducing=30)
    with torch.no_grad():
        svgp.q_mu.normal_()
        svgp.q_sqrt_raw.mul_(0.3)
    exact = build(ExactGP, X).log_marginal_likelihood(X, y)
    assert svgp.elbo(X, y, num_data=len(X)) < exact


def test_svgp_minibatch_elbo_is_unbiased(data):
    X, y = data
    svgp = build(SVGP, X, Z=X[::4], n_inducing=15)
    full = svgp.elbo(X, y, num_data=len(X))
    batches = [svgp.elbo(X[i::4], y[i::4], num_data=len(X)) for i in range(4)]
    torch.testing.assert_close(torch.stack(batches).mean(), full)


def test_chunked_and_checkpointed_statistics_give_the_same_loss_and_gradients(data):
    X, y = data
    Z = X[::5]
    one = build(SGPR, X, Z=Z, n_inducing=len(Z), chunk_size=1000)
    many = build(SGPR, X, Z=Z, n_inducing=len(Z), chunk_size=7)
    losses = []
    for model in (one, many):
        loss = model.loss(X, y, num_data=len(X))
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[0], losses[1])
    for p, q in zip(one.parameters(), many.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


@pytest.mark.parametrize("key", ["exact", "sgpr", "svgp"])
def test_loss_gradient_matches_finite_differences(data, key):
    X, y = data
    model = build(get_model_class(key), X[:25], **({} if key == "exact" else {"n_inducing": 8}))
    model.initialise_from_data(X[:25], y[:25])
    raw = [p for name, p in model.named_parameters() if "raw_" in name]

    def loss_of(*values):
        with torch.no_grad():
            saved = [p.clone() for p in raw]
            for p, v in zip(raw, values):
                p.copy_(v)
        loss = model.loss(X[:25], y[:25], num_data=25)
        with torch.no_grad():
            for p, s in zip(raw, saved):
                p.copy_(s)
        return loss

    loss = model.loss(X[:25], y[:25], num_data=25)
    grads = torch.autograd.grad(loss, raw)
    eps = 1e-6
    for i, p in enumerate(raw):
        for j in range(p.numel()):
            up = [q.detach().clone() for q in raw]
            down = [q.detach().clone() for q in raw]
            up[i].view(-1)[j] += eps
            down[i].view(-1)[j] -= eps
            numeric = (loss_of(*up) - loss_of(*down)) / (2 * eps)
            assert abs(grads[i].view(-1)[j] - numeric) < 1e-6 * (1 + abs(numeric))


def test_sgpr_only_factors_m_by_m_matrices():
    X, y = toy_regression(n=300, d=2)
    sgpr = build(SGPR, X, Z=X[:20], n_inducing=20)
    wrapped = torch.linalg.cholesky_ex
    sizes = []

    def spy(A, *args, **kwargs):
        sizes.append(A.shape[-1])
        return wrapped(A, *args, **kwargs)

    with patch("torch.linalg.cholesky_ex", new=spy):
        sgpr.loss(X, y, num_data=300).backward()
        sgpr.fit_posterior(X, y)
        sgpr.predict(X)
    assert sizes and set(sizes) == {20}


@pytest.mark.parametrize("key", ["exact", "sgpr", "svgp"])
def test_chunked_prediction_equals_one_chunk_and_variances_are_non_negative(data, key):
    X, y = data
    small = build(get_model_class(key), X, **({} if key == "exact" else {"n_inducing": 12}), chunk_size=5)
    small.initialise_from_data(X, y)
    big = build(get_model_class(key), X, **({} if key == "exact" else {"n_inducing": 12}), chunk_size=10_000)
    big.load_state_dict(small.state_dict())
    for model in (small, big):
        model.fit_posterior(X, y)
    Xs = torch.rand(23, 2, dtype=torch.float64) * 6 - 3
    for a, b in zip(small.predict(Xs), big.predict(Xs)):
        torch.testing.assert_close(a, b)
    assert (small.predict(Xs)[1] >= 0).all()


def test_predict_before_fit_posterior_says_what_to_do(data):
    X, _ = data
    with pytest.raises(NotFittedPosteriorError, match="fit_posterior"):
        build(SGPR, X, n_inducing=4).predict(X)


def test_the_held_feature_sums_and_their_backward_equal_autograd_of_the_dense_forms():
    """Over 40 rows in chunks of 9 (a short last one): Phi^T Phi, Phi^T y and ||y - Phi mu||^2 of features held in
    memory equal their dense forms, and their one-node backward passes pass finite differences in Phi, y and mu,
    together and each alone."""
    g = torch.Generator().manual_seed(4)
    Phi = torch.randn(40, 6, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randn(40, generator=g, dtype=torch.float64, requires_grad=True)
    mu = torch.randn(6, generator=g, dtype=torch.float64, requires_grad=True)

    def sums(Phi, y):
        stats = weight_space.held_statistics(Phi, y, chunk_size=9)
        return stats.A, stats.b

    def rss(Phi, y, mu):  # residual_quad = (rss + s2 |mu|^2) / s2: with s2 = 1, rss + |mu|^2
        return weight_space.residual_quad(Phi, y, mu, torch.tensor(1.0, dtype=torch.float64), chunk_size=9)

    A, b = sums(Phi, y)
    torch.testing.assert_close(A, Phi.T @ Phi, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(b, Phi.T @ y, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(rss(Phi, y, mu), ((y - Phi @ mu) ** 2).sum() + mu @ mu, rtol=1e-13, atol=0)
    assert torch.autograd.gradcheck(sums, (Phi, y))
    assert torch.autograd.gradcheck(lambda P: sums(P, y.detach()), (Phi,))
    assert torch.autograd.gradcheck(rss, (Phi, y, mu))
    assert torch.autograd.gradcheck(lambda P: rss(P, y.detach(), mu.detach()), (Phi,))
    assert torch.autograd.gradcheck(lambda m: rss(Phi.detach(), y.detach(), m), (mu,))


def test_held_feature_statistics_of_scaled_rows_equal_those_of_the_scaled_copy_and_take_no_gradient():
    """``row_scale`` s gives the statistics of the rows s_i phi_i and targets s_i y_i, scaled a chunk at a time (40
    rows in chunks of 9); asked for a gradient through them it says how to get one instead."""
    g = torch.Generator().manual_seed(5)
    Phi, y = torch.randn(40, 6, generator=g, dtype=torch.float64), torch.randn(40, generator=g, dtype=torch.float64)
    s = torch.rand(40, generator=g, dtype=torch.float64) + 0.5
    scaled = weight_space.held_statistics(Phi, y, chunk_size=9, row_scale=s)
    copied = weight_space.held_statistics(Phi * s.unsqueeze(-1), y * s, chunk_size=9)
    for name in ("A", "b", "yy"):
        torch.testing.assert_close(getattr(scaled, name), getattr(copied, name), rtol=1e-14, atol=1e-14)
    with pytest.raises(ValueError, match="row_scale without gradients"):
        weight_space.held_statistics(Phi.requires_grad_(), y, chunk_size=9, row_scale=s)


def test_linear_engine_evidence_equals_dense_bayesian_linear_regression():
    g = torch.Generator().manual_seed(3)
    Phi = torch.randn(40, 6, generator=g, dtype=torch.float64)
    y = torch.randn(40, generator=g, dtype=torch.float64)
    noise = torch.tensor(0.3, dtype=torch.float64)
    stats = weight_space.accumulate(lambda X: X, Phi, y, chunk_size=9)
    post = weight_space.weight_posterior_cholesky(stats, noise)
    dense = MultivariateNormal(torch.zeros(40, dtype=torch.float64), Phi @ Phi.T + noise * torch.eye(40))
    torch.testing.assert_close(weight_space.log_evidence(post, noise), dense.log_prob(y))
    torch.testing.assert_close(weight_space.residual_quad(Phi, y, post.weight_mean, noise, chunk_size=9), post.quad)
    # posterior of w: N(Sigma Phi^T y / s2, Sigma), Sigma = (I + Phi^T Phi / s2)^-1
    Sigma = torch.linalg.inv(torch.eye(6, dtype=torch.float64) + Phi.T @ Phi / noise)
    torch.testing.assert_close(post.weight_mean, Sigma @ Phi.T @ y / noise)
    Xs = torch.randn(5, 6, generator=g, dtype=torch.float64)
    mean, var = weight_space.weight_space_predictive(post.L_B, post.weight_mean, Xs)
    torch.testing.assert_close(var, ((Xs @ Sigma) * Xs).sum(-1))
    qr_post = weight_space.weight_posterior_qr(lambda X: X, Phi, y, noise, chunk_size=9)
    torch.testing.assert_close(weight_space.log_evidence(qr_post, noise), dense.log_prob(y))


def test_noise_and_kernel_hyperparameters_start_at_the_requested_values():
    model = SGPR(2, n_inducing=3, noise=0.037, lengthscale=0.3, outputscale=2.0)
    assert model.noise.item() == pytest.approx(0.037, rel=1e-6)
    assert model.kernel.lengthscale.tolist() == pytest.approx([0.3, 0.3], rel=1e-6)
    assert model.kernel.outputscale.item() == pytest.approx(2.0, rel=1e-6)


@pytest.mark.parametrize("batch", [8, 60])
def test_svgp_training_path_depends_on_batch_size_and_both_give_the_same_elbo_and_gradients(data, batch):
    X, y = data
    svgp = build(SVGP, X, Z=X[::4], n_inducing=15)
    with torch.no_grad():
        svgp.q_mu.normal_()
        svgp.q_sqrt_raw.mul_(0.4)
    Xb, yb = X[:batch], y[:batch]
    with patch.object(SVGP, "projected_conditional", wraps=svgp.projected_conditional) as projected:
        elbo = svgp.elbo(Xb, yb, num_data=60)
    assert projected.called == (2 * 15 <= batch)  # the m x m projection pays only when m is well below b
    reference = -svgp.prior_kl() + 60 / batch * svgp.likelihood.expected_log_prob(
        yb, *svgp.conditional(Xb, svgp.Lu(), svgp.q_mu, svgp.q_sqrt)).sum()
    torch.testing.assert_close(elbo, reference, rtol=1e-10, atol=0)
    grads = torch.autograd.grad(elbo, list(svgp.parameters()), allow_unused=True)
    ref_grads = torch.autograd.grad(reference, list(svgp.parameters()), allow_unused=True)
    for g, r in zip(grads, ref_grads):
        if r is not None:
            torch.testing.assert_close(g, r, rtol=1e-7, atol=1e-9)


def test_sgpr_auto_solver_uses_qr_in_float32_and_stays_close_to_float64():
    X, y = toy_regression(n=300, d=2)
    ref = build(SGPR, X, Z=X[::10], n_inducing=30)
    m32 = SGPR(2, n_inducing=30).float()
    m32.load_state_dict(ref.state_dict())
    with patch.object(linear_engine, "weight_posterior_qr", wraps=weight_space.weight_posterior_qr) as qr:
        bound32 = m32.elbo(X.float(), y.float())
        assert qr.called
        ref.elbo(X, y)
        assert qr.call_count == 1  # float64 took the Cholesky path
    exact64 = ref.elbo(X, y).item()
    gram32 = SGPR(2, n_inducing=30, solver="cholesky").float()
    gram32.load_state_dict(ref.state_dict())
    error_qr = abs(bound32.item() - exact64) / abs(exact64)
    error_gram = abs(gram32.elbo(X.float(), y.float()).item() - exact64) / abs(exact64)
    # float32 rounding of K_uf stays in both; the Gram matrix of float32 features accumulates in float64, so its
    # squaring of the condition number costs no float32 digits either
    assert error_qr < 1e-4 and error_gram < 1e-4


# every method's joint predictive agrees with its marginals; sizes small enough for a few quick steps
JOINT_OPTIONS = {"exact": {}, "sgpr": {"n_inducing": 10}, "svgp": {"n_inducing": 10}, "softki": {"n_inducing": 10},
                 "grief": {"n_eigen": 20, "grid_size": 6}, "grief-i": {"n_eigen": 20, "grid_size": 6},
                 "dbk": {"n_basis": 8, "width": 16}, "svdbk": {"n_basis": 8, "width": 16},
                 "hvgp": {"n_inducing": 5, "n_ways": 1}, "vff": {"n_frequencies": 6},
                 "vff-svgp": {"n_frequencies": 6}, "odvgp": {"n_inducing": 8, "n_mean_inducing": 16},
                 "odvff": {"n_frequencies": 4, "n_mean_inducing": 16},
                 "conv-svgp": {"n_inducing": 8, "image_shape": (1, 2), "filter_size": (1, 1)},
                 "conv-hvgp": {"n_inducing": 4, "image_shape": (1, 2), "filter_size": (1, 2)},
                 # one layer: with hidden layers the latent predictive is a mixture over draws of them, which has no
                 # joint Gaussian covariance (predict_cov refuses it, tests/models/test_deep_conv.py)
                 "deep-conv-hvgp": {"n_layers": 1, "filter_sizes": ((1, 2),), "strides": (1,), "n_inducing": 4,
                                    "image_shape": (1, 2)}}


@pytest.mark.filterwarnings("ignore:GP-GRIEF-I's MCMC has not converged")  # a chain of 60 steps, on purpose
@pytest.mark.parametrize("key", sorted(JOINT_OPTIONS))
def test_the_joint_predictive_has_the_marginal_moments_on_its_diagonal_and_is_symmetric_psd(key):
    from gpscale.models import available_methods
    from gpscale.train import fit

    assert set(JOINT_OPTIONS) == set(available_methods())  # a new method joins this contract
    X, y = toy_regression(n=80, d=2)
    cls = get_model_class(key)
    model = cls(2, **JOINT_OPTIONS[key], **cls.warm_up_options).double()
    fit(model, X, y, epochs=3, batch_size=40, lr=0.01, progress=False)
    Xs = toy_regression(n=7, d=2, seed=4)[0]
    mean, var = model.predict(Xs)
    joint_mean, cov = model.predict_cov(Xs)
    torch.testing.assert_close(joint_mean, mean, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(cov.diagonal(), var, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(cov, cov.T, rtol=1e-10, atol=1e-12)
    assert torch.linalg.eigvalsh(cov).min() > -1e-8 * var.max()
    off_diagonal = cov - torch.diag(cov.diagonal())
    assert off_diagonal.abs().max() > 1e-6 * var.max()  # rows are correlated: not the marginals on a diagonal

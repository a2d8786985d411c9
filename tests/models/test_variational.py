"""The variational engine's two parametrisations of q: whitened, q(v) with u = L v, and unwhitened, q(u) against
N(0, Kuu), are one model. At corresponding q (m_u = L m_v, S_u = L S_v S_v^T L^T) they have the same ELBO, KL and
predictive; and a natural-gradient step of size one on the full batch reaches the same optimum from either."""
import numpy as np
import pytest
import torch

from gpscale import GPRegressor
from gpscale.models.variational.odvgp import ODVGP
from gpscale.models.linear.sgpr import SGPR
from gpscale.models.variational.svgp import SVGP

F64 = torch.float64


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(3)
    X = torch.rand(60, 2, generator=g, dtype=F64)
    y = torch.sin(5 * X[:, 0]) * X[:, 1] + 0.1 * torch.randn(60, generator=g, dtype=F64)
    return X, y


def pair(X, y, m=9, **options):
    """A whitened and an unwhitened SVGP on the same inducing points, the unwhitened q corresponding to a random
    whitened one."""
    whitened = SVGP(2, n_inducing=m, lengthscale=0.4, noise=0.05, **options).double()
    unwhitened = SVGP(2, n_inducing=m, lengthscale=0.4, noise=0.05, whiten=False, **options).double()
    whitened.initialise_from_data(X, y)
    unwhitened.initialise_from_data(X, y)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        unwhitened.features.Z.copy_(whitened.features.Z)
        whitened.q_mu.copy_(torch.randn(m, generator=g, dtype=F64))
        whitened.q_sqrt_raw.copy_(torch.tril(0.3 * torch.randn(m, m, generator=g, dtype=F64)) + torch.eye(m))
        Lu = whitened.Lu()
        unwhitened.q_mu.copy_(Lu @ whitened.q_mu)
        unwhitened.q_sqrt_raw.copy_(Lu @ whitened.q_sqrt)
    return whitened, unwhitened


def test_at_corresponding_q_the_elbo_kl_and_predictive_agree(data):
    X, y = data
    whitened, unwhitened = pair(X, y)
    with torch.no_grad():
        torch.testing.assert_close(unwhitened.prior_kl(), whitened.prior_kl(), rtol=1e-9, atol=1e-10)
        for batch in (X[:10], X):  # the whitened ELBO projects on the full batch (m <= b / 2), not on ten rows
            rows = batch.shape[0]
            torch.testing.assert_close(unwhitened.elbo(batch, y[:rows], 60), whitened.elbo(batch, y[:rows], 60),
                                       rtol=1e-9, atol=1e-9)
        whitened.fit_posterior(X, y)
        unwhitened.fit_posterior(X, y)
        Xs = torch.rand(7, 2, dtype=F64) * 1.4 - 0.2
        for ours, reference in zip(unwhitened.predict(Xs), whitened.predict(Xs)):
            torch.testing.assert_close(ours, reference, rtol=1e-8, atol=1e-10)
        mean, cov = unwhitened.predict_cov(Xs)
        torch.testing.assert_close(torch.diagonal(cov), unwhitened.predict(Xs)[1], rtol=1e-9, atol=1e-12)


def _counting_kernel_calls(model):
    """Wrap the model's features so that each formation of Kuf and Kff_diag is counted."""
    calls = {"Kuf": 0, "Kff_diag": 0}
    for name in calls:
        original = getattr(model.features, name)

        def counted(X, _original=original, _name=name):
            calls[_name] += 1
            return _original(X)
        setattr(model.features, name, counted)
    return calls


@pytest.mark.parametrize("batch", [10, 60])  # the conditional's path on ten rows, the projected one on sixty
def test_a_steps_loss_takes_the_kernel_matrices_of_its_natural_gradient_step_and_the_same_gradients(data, batch):
    X, y = data[0][:batch], data[1][:batch]
    shared, _ = pair(X, y)
    fresh, _ = pair(X, y)
    calls = _counting_kernel_calls(shared)
    fresh.natural_gradient_step(X, y, 60)  # a step of its own, and a loss that forms them again
    losses = [shared.training_loss(X, y, 60), fresh.loss(X, y, 60)]
    assert calls == {"Kuf": 1, "Kff_diag": 1} and shared.step_kernels is None
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-13, atol=0)
    for model, loss in zip((shared, fresh), losses):
        loss.backward()
    for (name, a), (_, b) in zip(shared.named_parameters(), fresh.named_parameters()):
        if a.grad is not None or b.grad is not None:
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-12, atol=1e-14, msg=name)


def _reference_loss(model, X, y, num_data):
    """The whitened SVGP's -ELBO / n written out with torch's own factorisation and solve, autograd through both."""
    Kuu = model.features.Kuu().to(F64) + model.jitter * torch.eye(model.n_inducing, dtype=F64)
    A = torch.linalg.solve_triangular(torch.linalg.cholesky(Kuu), model.features.Kuf(X), upper=False)
    q_mu, q_sqrt = model.q_for_loss()
    mean = A.T @ q_mu
    var = model.features.Kff_diag(X) - (A * A).sum(0) + ((q_sqrt.T @ A) ** 2).sum(0)
    expected = model.likelihood.expected_log_prob(y, mean, var).sum()
    return -(num_data / X.shape[0] * expected - model.prior_kl(q_mu, q_sqrt)) / num_data


@pytest.mark.parametrize("natural_gradients", [False, True])
def test_the_whitened_loss_has_the_gradients_of_autograd_through_the_factorisation(data, natural_gradients):
    """The loss routes K_uu's gradient past its Cholesky factor (linalg.whitened_solve) and skips S's zero triangle
    (linalg.lower_transpose_product); every gradient is autograd's through torch's factorisation and solve."""
    X, y = data[0][:10], data[1][:10]  # the conditional's path (ten rows), not the projection
    model, _ = pair(X, y, m=9, natural_gradients=natural_gradients)
    if natural_gradients:
        model.natural_gradient_step(X, y, 60)
    loss = model.loss(X, y, 60)
    params = [p for p in model.parameters() if p.requires_grad]
    ours = torch.autograd.grad(loss, params, allow_unused=True)
    reference_loss = _reference_loss(model, X, y, 60)
    reference = torch.autograd.grad(reference_loss, params, allow_unused=True)
    torch.testing.assert_close(loss, reference_loss, rtol=1e-12, atol=0)
    for (name, _), a, b in zip(model.named_parameters(), ours, reference):
        if a is None or b is None:
            assert a is None and b is None, name
        else:
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)


def test_a_whitened_natural_gradient_step_takes_the_precision_the_last_one_formed(data):
    X, y = data
    cached, _ = pair(X, y)
    fresh, _ = pair(X, y)
    for model in (cached, fresh):
        model.natural_gradient_step(X[:20], y[:20], 60)
    L = cached.q_sqrt.detach()
    assert cached._S_inverse(L) is cached._precision[1]
    torch.testing.assert_close(cached._precision[1], torch.cholesky_inverse(L), rtol=1e-9, atol=1e-9)
    del fresh._precision  # the second step forms S^{-1} from L
    for model in (cached, fresh):
        model.natural_gradient_step(X[20:40], y[20:40], 60)
    torch.testing.assert_close(cached.q_mu, fresh.q_mu, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(cached.q_sqrt, fresh.q_sqrt, rtol=1e-9, atol=1e-11)
    with torch.no_grad():
        cached.q_sqrt_raw.mul_(2.0)  # anything that writes q's factor makes the remembered precision stale
    assert cached._S_inverse(cached.q_sqrt.detach()) is not cached._precision[1]


def test_a_kernel_matrix_of_the_natural_gradient_step_is_not_taken_after_a_hyperparameter_moved(data):
    """Kernel matrices are shared within one training step only (VariationalGP.training_step): a loss after a
    natural-gradient step taken on its own forms its own, and so does a loss on another batch tensor."""
    X, y = data
    model, _ = pair(X, y)
    calls = _counting_kernel_calls(model)
    model.natural_gradient_step(X, y, 60)
    with torch.no_grad():
        model.kernel.raw_lengthscale.add_(0.3)
    loss = model.loss(X, y, 60)
    assert calls == {"Kuf": 2, "Kff_diag": 2}
    torch.testing.assert_close(loss, model.loss(X, y, 60), rtol=1e-13, atol=0)
    model.natural_gradient_step(X, y, 60)
    model.loss(X.clone(), y, 60)  # another batch tensor (equal values) forms its own
    assert calls == {"Kuf": 5, "Kff_diag": 5}


def test_the_unwhitened_elbo_has_gradients_for_q_and_the_inducing_points(data):
    X, y = data
    _, unwhitened = pair(X, y, natural_gradients=False)
    unwhitened.loss(X, y, 60).backward()
    for name in ("q_mu", "q_sqrt_raw", "features.Z"):
        grad = dict(unwhitened.named_parameters())[name].grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().max() > 0, name


def test_one_natural_gradient_step_of_one_reaches_the_optimal_q_unwhitened_too(data):
    X, y = data
    _, unwhitened = pair(X, y, natgrad_step=1.0)
    sgpr = SGPR(2, n_inducing=9, lengthscale=0.4, noise=0.05).double()
    with torch.no_grad():
        sgpr.features.Z.copy_(unwhitened.features.Z)
    unwhitened.natural_gradient_step(X, y, 60)
    q_mu, q_sqrt = sgpr.optimal_q(X, y)  # whitened: u = Lu v
    Lu = unwhitened.Lu()
    S = unwhitened.q_sqrt @ unwhitened.q_sqrt.T
    torch.testing.assert_close(unwhitened.q_mu.detach(), Lu @ q_mu, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(S, Lu @ q_sqrt @ q_sqrt.T @ Lu.T, rtol=1e-7, atol=1e-9)
    with torch.no_grad():
        torch.testing.assert_close(unwhitened.elbo(X, y, 60), sgpr.elbo(X, y), rtol=1e-9, atol=1e-8)


def test_an_unwhitened_q_starts_at_the_prior(data):
    X, y = data
    model = SVGP(2, n_inducing=6, whiten=False).double()
    model.initialise_from_data(X, y)
    with torch.no_grad():
        torch.testing.assert_close(model.q_sqrt @ model.q_sqrt.T, model.Kuu_operator().to_dense())
        assert model.q_mu.abs().max() == 0 and abs(model.prior_kl().item()) < 1e-9


def test_what_an_unwhitened_q_does_not_take_is_refused():
    with pytest.raises(ValueError, match="whiten=False takes one block of features and one latent function"):
        SVGP(2, n_inducing=4, whiten=False, likelihood="softmax", n_classes=3)
    with pytest.raises(ValueError, match="decoupled mean basis needs an unwhitened q"):
        ODVGP(2, whiten=True)
    with pytest.raises(ValueError, match="whiten must be True or False"):
        SVGP(2, n_inducing=4, whiten="no")


def test_the_estimator_trains_saves_and_loads_an_unwhitened_svgp(data, tmp_path):
    X, y = (t.numpy() for t in data)
    reg = GPRegressor(method="svgp", whiten=False, n_inducing=8, epochs=3, batch_size=20, progress=False).fit(X, y)
    assert reg.get_params()["whiten"] is False and reg.model_.whiten is False
    reg.save(tmp_path / "svgp.model")
    loaded = GPRegressor.load(tmp_path / "svgp.model")
    for ours, saved in zip(loaded.predict(X[:5], return_std=True), reg.predict(X[:5], return_std=True)):
        np.testing.assert_array_equal(ours, saved)


def test_the_decoupled_posterior_keeps_the_mean_basis_it_was_fitted_with(data):
    X, y = data
    model = ODVGP(2, n_inducing=6, n_mean_inducing=8).double()
    model.initialise_from_data(X, y)
    with torch.no_grad():
        model.a_gamma.normal_()
    model.fit_posterior(X, y)
    Xs = torch.rand(5, 2, dtype=F64)
    before = model.predict(Xs)
    with torch.no_grad():
        model.gamma.add_(0.3)  # moved after the fit, without a refit
    for ours, reference in zip(model.predict(Xs), before):
        torch.testing.assert_close(ours, reference, rtol=0, atol=0)


def test_a_method_on_the_engine_takes_the_engines_options_and_the_models():
    from gpscale.models.base import option_default, option_names

    assert {"whiten", "natural_gradients", "natgrad_step", "jitter", "likelihood", "kernel", "n_inducing"} <= \
        option_names(SVGP)
    assert option_default(SVGP, "whiten") is True and option_default(ODVGP, "n_mean_inducing") == 300
    assert option_default(ODVGP, "whiten") is False  # the decoupled mean basis needs an unwhitened q


def test_q_moves_by_natural_gradient_steps_by_default_but_under_the_robust_max_likelihood():
    assert SVGP(2, n_inducing=4).natural_gradients
    assert SVGP(2, n_inducing=4, likelihood="softmax", n_classes=3).natural_gradients
    assert not SVGP(2, n_inducing=4, likelihood="robustmax", n_classes=3).natural_gradients
    assert SVGP(2, n_inducing=4, likelihood="robustmax", n_classes=3, natural_gradients=True).natural_gradients
    assert not SVGP(2, n_inducing=4, natural_gradients=False).natural_gradients

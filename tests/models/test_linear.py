"""The linear engine (models/linear/engine.py) against dense formulas: FeatureSpaceGP on a toy feature map, and
CollapsedGP through SGPR."""
import math

import pytest
import torch
from torch import nn
from torch.distributions import MultivariateNormal

from conftest import toy_regression
from gpscale.models.linear.collapsed import CollapsedGP
from gpscale.models.linear.engine import Features, FeatureSpaceGP
from gpscale.models.linear.weight_space import gram_and_cross_grad
from gpscale.models.linear.sgpr import SGPR

F64 = torch.float64
pytestmark = pytest.mark.usefixtures("one_thread")


class CosineFeatures(FeatureSpaceGP):
    """phi(x) = a cos(x W + b) [r]: fixed random directions, one learned amplitude a (the feature state)."""

    def __init__(self, n_features: int, r: int = 7, **kwargs):
        super().__init__(n_features, **kwargs)
        g = torch.Generator().manual_seed(1)
        self.register_buffer("W", torch.randn(n_features, r, generator=g, dtype=F64))
        self.register_buffer("b", 2 * math.pi * torch.rand(r, generator=g, dtype=F64))
        self.log_amplitude = nn.Parameter(torch.tensor(-0.2, dtype=F64))

    def feature_state(self):
        return {"amplitude": self.log_amplitude.exp()}

    def feature_map(self, state):
        return Features(lambda X: state["amplitude"] * torch.cos(X @ self.W.to(X.dtype) + self.b.to(X.dtype)))


def dense_phi(model, X):
    return model.feature_map(model.feature_state())(X)


def dense_evidence(model, X, y):
    Phi = dense_phi(model, X)
    K = Phi @ Phi.T + model.noise * torch.eye(len(X), dtype=F64)
    return MultivariateNormal(torch.zeros(len(X), dtype=F64), K).log_prob(y)


def dense_predictive(Kxx, Kxs, Kss, y, noise):
    """The GP posterior of f at the test rows, from dense kernel blocks."""
    A = Kxx + noise * torch.eye(len(y), dtype=F64)
    mean = Kxs.T @ torch.linalg.solve(A, y)
    return mean, Kss - Kxs.T @ torch.linalg.solve(A, Kxs)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("layout", ["rows", "columns"])
def test_the_gradient_through_the_gram_and_cross_products_in_either_layout(dtype, layout):
    # inducing features come as K_uf^T, a transposed view: the product is then taken as (G K_uf)^T
    g = torch.Generator().manual_seed(0)
    Phi = torch.randn(37, 5, generator=g, dtype=F64)
    Phi = Phi.T.contiguous().T if layout == "columns" else Phi
    y = torch.randn(37, generator=g, dtype=F64)
    grad_A, grad_b = torch.randn(5, 5, generator=g, dtype=F64), torch.randn(5, generator=g, dtype=F64)
    G = grad_A + grad_A.T
    dPhi = gram_and_cross_grad(Phi.to(dtype), G, y, grad_b)
    assert dPhi.dtype == dtype and dPhi.shape == (37, 5)
    torch.testing.assert_close(dPhi.double(), Phi @ G + torch.outer(y, grad_b),
                               rtol=1e-5 if dtype == torch.float32 else 1e-13, atol=1e-5)
    # and as the backward of the products themselves
    leaf = Phi.clone().requires_grad_(True)
    A, b = leaf.T @ leaf, leaf.T @ y
    torch.testing.assert_close(torch.autograd.grad([A, b], leaf, [grad_A, grad_b])[0],
                               gram_and_cross_grad(Phi, G, y, grad_b), rtol=1e-13, atol=1e-13)


@pytest.fixture
def data():
    X, y = toy_regression(n=45, d=2)
    Xs = torch.rand(6, 2, dtype=F64) * 4 - 2
    return X, y, Xs


@pytest.mark.parametrize("solver", ["cholesky", "qr", "auto"])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("chunk_size", [8, 1000])
def test_the_evidence_and_its_gradient_equal_the_dense_formula(data, solver, residual, chunk_size):
    X, y, _ = data
    model = CosineFeatures(2, noise=0.07, chunk_size=chunk_size).double()
    model.set_engine_options(solver=solver)
    model.residual_evidence = residual
    params = [model.log_amplitude, model.likelihood.raw_noise]
    ours = model.log_marginal_likelihood(X, y)
    reference = dense_evidence(model, X, y)
    torch.testing.assert_close(ours, reference, rtol=1e-10, atol=0)
    for g, r in zip(torch.autograd.grad(ours, params), torch.autograd.grad(reference, params)):
        torch.testing.assert_close(g, r, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(model.loss(X, y, num_data=len(X)), -reference / len(X), rtol=1e-10, atol=0)



def graph_nodes(tensor):
    """The autograd nodes reachable from ``tensor``'s grad_fn."""
    seen, stack = set(), [tensor.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and node not in seen:
            seen.add(node)
            stack.extend(next_node for next_node, _ in node.next_functions)
    return len(seen)


@pytest.mark.parametrize("model", ["features", "sgpr"])
def test_the_streamed_evidence_keeps_no_graph_per_chunk(data, model):
    """Over several chunks the statistics are one autograd node whatever their number (the backward pass rebuilds a
    chunk's graph at a time): a graph per chunk, kept until the backward pass, grew the heap with every chunk.
    SGPR brings the whitening and the trace term's prior diagonal; the gradients are checked against the dense
    formulas and GPyTorch elsewhere."""
    X, y, _ = data
    X, y = X.repeat(8, 1), y.repeat(8)  # 360 rows
    counts = []
    for chunk_size in (10, 30):
        if model == "sgpr":
            m = sgpr(X, X[:6], chunk_size=chunk_size, solver="cholesky")
        else:
            m = CosineFeatures(2, noise=0.07, chunk_size=chunk_size).double()
            m.set_engine_options(solver="cholesky")
        counts.append(graph_nodes(m.loss(X, y, num_data=len(X))))
    assert counts[0] == counts[1], counts

def test_the_posterior_predicts_as_the_dense_gp_of_the_feature_kernel(data):
    X, y, Xs = data
    model = CosineFeatures(2, noise=0.07, chunk_size=10).double()
    model.fit_posterior(X, y)
    Phi, Phi_s = dense_phi(model, X), dense_phi(model, Xs)
    mean, cov = dense_predictive(Phi @ Phi.T, Phi @ Phi_s.T, Phi_s @ Phi_s.T, y, model.noise)
    ours_mean, ours_var = model.predict(Xs)
    torch.testing.assert_close(ours_mean, mean, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(ours_var, cov.diagonal(), rtol=1e-8, atol=1e-12)
    torch.testing.assert_close(model.predict_cov(Xs)[1], cov, rtol=1e-8, atol=1e-12)


def test_the_posterior_is_the_same_by_either_solver_in_any_chunking(data):
    X, y, Xs = data
    predictions = []
    for solver, chunk in (("cholesky", 7), ("qr", 7), ("qr", 1000)):
        model = CosineFeatures(2, noise=0.07, chunk_size=chunk).double()
        model.set_engine_options(solver=solver)
        model.fit_posterior(X, y)
        predictions.append(model.predict(Xs))
    for mean, var in predictions[1:]:
        torch.testing.assert_close(mean, predictions[0][0], rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(var, predictions[0][1], rtol=1e-8, atol=1e-12)


def test_whitened_features_and_their_statistics_whiten_on_the_core(data):
    X, y, _ = data
    g = torch.Generator().manual_seed(2)
    L = torch.linalg.cholesky(torch.eye(5, dtype=F64) + 0.3 * torch.ones(5, 5, dtype=F64))
    W = torch.randn(2, 5, generator=g, dtype=F64)
    features = Features(lambda X: torch.tanh(X @ W), whitening_factor=L)
    torch.testing.assert_close(features(X), torch.tanh(X @ W) @ torch.linalg.inv(L).T)

    class Whitened(CosineFeatures):
        def feature_map(self, state):
            return features

    model = Whitened(2, noise=0.1, chunk_size=9).double()
    stats = model.statistics(X, y)
    Phi = features(X)
    torch.testing.assert_close(stats.A, Phi.T @ Phi)
    torch.testing.assert_close(stats.b, Phi.T @ y)


def test_calibration_maximises_the_evidence_over_the_noise_and_variance_mode_keeps_the_mean(data):
    X, y, Xs = data
    trained = CosineFeatures(2, noise=1e-3, learn_noise=False).double()
    trained.fit_posterior(X, y)
    posterior = CosineFeatures(2, noise=1e-3, learn_noise=False).double()
    posterior.set_engine_options(calibrate_noise="posterior")
    posterior.fit_posterior(X, y)
    variance = CosineFeatures(2, noise=1e-3, learn_noise=False).double()
    variance.set_engine_options(calibrate_noise="variance")
    variance.fit_posterior(X, y)
    # the calibrated noise is the dense evidence's maximiser: a fine grid around it finds nothing better
    found = posterior.noise.item()
    grid = [found * f for f in (0.9, 0.97, 1.03, 1.1)]
    with torch.no_grad():
        def evidence_at(s2):
            model = CosineFeatures(2, noise=s2, learn_noise=False).double()
            return dense_evidence(model, X, y).item()
        assert all(evidence_at(found) >= evidence_at(s2) for s2 in grid)
    assert variance.noise.item() == pytest.approx(found, rel=1e-12)
    torch.testing.assert_close(variance.predict(Xs)[0], trained.predict(Xs)[0])  # the paper's mean kept
    torch.testing.assert_close(variance.predict(Xs)[1], posterior.predict(Xs)[1])  # the calibrated variance
    assert not torch.allclose(posterior.predict(Xs)[0], trained.predict(Xs)[0])
    posterior.clear_cache()  # the training noise comes back
    assert posterior.noise.item() == pytest.approx(1e-3, rel=1e-6)  # built in float32, then cast


@pytest.mark.parametrize("mode", ["posterior", "variance"])
def test_held_out_calibration_maximises_the_dense_held_out_density_and_the_next_posterior_fit_takes_it(data, mode):
    """sigma^2 = argmax sum_h log N(y_h | E[f_h], Var[f_h] + sigma^2) with the dense GP of the features fitted on the
    other rows at sigma^2 (its mean at the training noise in 'variance' mode); the next posterior fit, on every
    row, predicts with it, and a later one calibrates on the evidence again."""
    X, y, Xs = data
    fit_rows, held = slice(0, 30), slice(30, None)
    model = CosineFeatures(2, noise=1e-3, learn_noise=False).double()
    model.set_engine_options(calibrate_noise=mode)
    model.calibrate_on_held_out(X[fit_rows], y[fit_rows], X[held], y[held])
    found = model.held_out_noise
    with torch.no_grad():
        Phi, Phi_h = dense_phi(model, X[fit_rows]), dense_phi(model, X[held])

        def held_out_density(s2):
            mean, var = dense_predictive(Phi @ Phi.T, Phi @ Phi_h.T, Phi_h @ Phi_h.T, y[fit_rows], s2)
            if mode == "variance":
                mean = dense_predictive(Phi @ Phi.T, Phi @ Phi_h.T, Phi_h @ Phi_h.T, y[fit_rows], 1e-3)[0]
            return torch.distributions.Normal(mean, (var.diagonal() + s2).sqrt()).log_prob(y[held]).sum().item()

        assert all(held_out_density(found) >= held_out_density(found * f) for f in (0.9, 0.97, 1.03, 1.1))
    model.fit_posterior(X, y)
    assert model.noise.item() == pytest.approx(found, rel=1e-12) and model.held_out_noise is None
    model.fit_posterior(X, y)
    assert abs(model.noise.item() - found) > 1e-3 * found  # no held-out rows: the evidence's maximiser


def test_a_predictive_extra_variance_is_added_to_the_latent_variance(data):
    X, y, Xs = data

    class WithExtra(CosineFeatures):
        def predictive_extra(self, Phi):
            return 0.5 + Phi[:, 0] ** 2

    plain, extra = CosineFeatures(2).double(), WithExtra(2).double()
    for model in (plain, extra):
        model.fit_posterior(X, y)
    added = 0.5 + dense_phi(plain, Xs)[:, 0] ** 2
    torch.testing.assert_close(extra.predict(Xs)[1], plain.predict(Xs)[1] + added)
    torch.testing.assert_close(extra.predict_cov(Xs)[1], plain.predict_cov(Xs)[1] + torch.diag(added))


def test_engine_options_are_checked_when_set_and_before_a_posterior_fit(data):
    X, y, _ = data
    model = CosineFeatures(2).double()
    with pytest.raises(ValueError, match="solver must be one of 'auto', 'cholesky', 'qr', got 'lu'"):
        model.set_engine_options(solver="lu")
    with pytest.raises(ValueError, match="calibrate_noise must be one of"):
        model.set_engine_options(calibrate_noise=True)
    model.set_engine_options()
    model.calibrate_noise = "both"  # posterior options may be set as attributes after construction
    with pytest.raises(ValueError, match="calibrate_noise must be one of"):
        model.fit_posterior(X, y)


# --- CollapsedGP: inducing features ----------------------------------------------------------------------------
def sgpr(X, Z, **options):
    model = SGPR(X.shape[1], n_inducing=len(Z), lengthscale=0.7, outputscale=1.3, noise=0.05, **options).double()
    with torch.no_grad():
        model.features.Z.copy_(Z)
    return model


@pytest.mark.parametrize("solver", ["cholesky", "qr"])
def test_the_collapsed_bound_is_titsias_and_predicts_as_sgpr(data, solver):
    X, y, Xs = data
    model = sgpr(X, X[::5], solver=solver, chunk_size=11)
    assert isinstance(model, CollapsedGP)
    k, s2, Z = model.kernel, model.noise, model.features.Z
    Kuu = k(Z, Z) + model.jitter * torch.eye(len(Z), dtype=F64)
    Kuf = k(Z, X)
    Q = Kuf.T @ torch.linalg.solve(Kuu, Kuf)
    titsias = MultivariateNormal(torch.zeros(len(X), dtype=F64), Q + s2 * torch.eye(len(X), dtype=F64)).log_prob(y) \
        - (k.diag(X).sum() - Q.trace()) / (2 * s2)
    torch.testing.assert_close(model.elbo(X, y), titsias, rtol=1e-10, atol=0)
    torch.testing.assert_close(model.loss(X, y, num_data=len(X)), -titsias / len(X), rtol=1e-10, atol=0)
    model.fit_posterior(X, y)
    # q(u) = N(Kuu Sigma Kuf y / s2, Kuu Sigma Kuu), Sigma = (Kuu + Kuf Kfu / s2)^-1; f* | u by the prior conditional
    Sigma = torch.linalg.inv(Kuu + Kuf @ Kuf.T / s2)
    Ksu = k(Xs, Z)
    mean = Ksu @ Sigma @ Kuf @ y / s2
    cov = k(Xs, Xs) - Ksu @ torch.linalg.solve(Kuu, Ksu.T) + Ksu @ Sigma @ Ksu.T
    torch.testing.assert_close(model.predict(Xs)[0], mean, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(model.predict_cov(Xs)[1], cov, rtol=1e-7, atol=1e-10)


def test_a_state_dict_holding_a_shared_kernel_under_one_name_loads():
    """SGPR's kernel is also its inducing features' kernel: saved under one of its names, it fills in the others."""
    X, y = toy_regression(n=30, d=2)
    model = sgpr(X, X[::3])
    model.fit_posterior(X, y)
    state = {key: value for key, value in model.state_dict().items() if not key.startswith("features.kernel.")}
    fresh = SGPR(2, n_inducing=10).double()
    fresh.load_state_dict(state)
    torch.testing.assert_close(fresh.features.Z, model.features.Z)
    torch.testing.assert_close(fresh.predict(X[:4])[1], model.predict(X[:4])[1])
    with pytest.raises(RuntimeError, match="Missing key"):
        SGPR(2, n_inducing=10).double().load_state_dict({k: v for k, v in state.items() if k != "features.Z"})


def test_set_noise_sets_sigma2_and_holds_it_above_the_floor():
    model = CosineFeatures(2, noise=0.3, noise_floor=1e-4).double()
    model.likelihood.set_noise(0.0123)
    assert model.noise.item() == pytest.approx(0.0123, rel=1e-12)
    model.likelihood.set_noise(torch.tensor(1e-9))  # below the floor: held at it, with a finite raw value
    assert model.noise.item() == pytest.approx(1e-4, rel=1e-12) and torch.isfinite(model.likelihood.raw_noise)


def test_the_qr_evidence_has_finite_gradients_when_features_repeat_across_rows():
    """A constant input column makes VFF's features of that column equal on every row: a chunk's QR of them alone
    is rank deficient, and its gradient NaN. The prior rows go first, so every QR has full column rank and the QR
    evidence's gradient equals the Cholesky one."""
    from gpscale.models import get_model_class

    g = torch.Generator().manual_seed(0)
    X = torch.rand(40, 3, generator=g, dtype=torch.float64) * 4 - 2
    X[:, 1] = 0.0
    y = torch.sin(2 * X[:, 0]) + 0.1 * torch.randn(40, generator=g, dtype=torch.float64)
    gradients = {}
    for solver in ("qr", "cholesky"):
        model = get_model_class("vff")(3, n_frequencies=6, solver=solver).double()
        model.initialise(X, y)
        model.loss(X, y, 40).backward()
        gradients[solver] = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert torch.isfinite(gradients["qr"]).all()
    torch.testing.assert_close(gradients["qr"], gradients["cholesky"], rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("outside", [False, True])
def test_the_streamed_evidence_gradient_of_features_that_do_not_depend_on_the_state(outside):
    """Inside its box VFF's K_uf is phi(x) whatever the hyperparameters: a chunk of such rows has no graph to
    backpropagate through its features (the streamed backward raised on it), and the gradient over many chunks is
    the gradient over one. Rows outside the box have edge features that depend on the lengthscales."""
    from gpscale.models import get_model_class

    X, y = toy_regression(n=60, d=2)
    gradients = []
    for chunk_size in (13, 1000):
        model = get_model_class("vff")(2, n_frequencies=5, chunk_size=chunk_size).double()
        model.initialise(X, y)
        if outside:
            model.fourier.set_box(torch.tensor([-1.5, -1.5], dtype=F64), torch.tensor([1.5, 1.5], dtype=F64))
        model.loss(X, y, len(X)).backward()
        gradients.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(gradients[0], gradients[1], rtol=1e-10, atol=1e-12)

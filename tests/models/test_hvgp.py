"""HVGP (spec hkd.md §9, checks 8-13): T = 1 is SVGP, the closed-form optimum recovers the exact evidence on
orbit-closed data, the bounds order, and the model trains through the common contract."""
import math

import pytest
import torch

from gpscale import GPRegressor
from gpscale.kernels import RBF, inverse_softplus
from gpscale.kernels.harmonic import (Negation, harmonic_kernel, harmonic_kernels, negation_basis, pca_directions,
                                     subspace_negations)
from gpscale.models import get_model_class
from gpscale.models.variational.gaussian_q import gauss_kl_whitened
from gpscale.models.harmonic.hvgp import HVGP
from gpscale.models.variational.svgp import SVGP
from gpscale.train import fit

F64 = torch.float64
X0 = torch.tensor([[0.3, -1.2], [1.0, 0.4], [-0.7, 0.9]], dtype=F64)


def target(X):
    return torch.sin(3 * X[:, 0]) + X[:, 1]


def rbf_hvgp(group, m, noise=0.1, **options):
    """RBF(1, 1) and the noise set in float64: the constructor rounds them through float32 (about 1e-8)."""
    options.setdefault("jitter", 1e-10)
    model = HVGP(2, n_inducing=m, group=group, kernel=RBF(2, ard=False), **options).double()
    with torch.no_grad():
        model.kernel.raw_lengthscale.fill_(inverse_softplus(torch.tensor(1.0, dtype=F64)))
        model.kernel.raw_outputscale.fill_(inverse_softplus(torch.tensor(1.0, dtype=F64)))
        if hasattr(model.likelihood, "raw_noise"):
            noise = torch.tensor(noise, dtype=F64) - model.likelihood.noise_floor
            model.likelihood.raw_noise.fill_(inverse_softplus(noise))
    return model


def log_evidence(model, X, y):
    K = model.kernel(X, X) + model.likelihood.noise * torch.eye(len(X), dtype=F64)
    return torch.distributions.MultivariateNormal(torch.zeros(len(X), dtype=F64), K).log_prob(y).item()


def set_optimal_q(model, X, y):
    """The analytic optimum of the HVGP ELBO for a Gaussian likelihood: the joint Titsias mean and
    S_t = K_t (K_t + s^-2 K_tf K_ft)^-1 K_t per block, mapped to the whitened v_t = L_t^{-1} u_t."""
    noise = model.likelihood.noise.detach()
    with torch.no_grad():
        Kuu = model.features.Kuu() + model.jitter * torch.eye(model.n_inducing, dtype=F64)  # [T, m, m]
        Kuf = model.features.Kuf(X)  # [T, m, n]
        T, m, _ = Kuu.shape
        Kuu_joint = torch.block_diag(*Kuu)
        Kuf_joint = Kuf.reshape(T * m, -1)
        mu = Kuu_joint @ torch.linalg.solve(Kuu_joint + Kuf_joint @ Kuf_joint.T / noise, Kuf_joint @ y) / noise
        L = torch.linalg.cholesky(Kuu)
        for t in range(T):
            S = Kuu[t] @ torch.linalg.solve(Kuu[t] + Kuf[t] @ Kuf[t].T / noise, Kuu[t])
            Linv = torch.linalg.inv(L[t])
            model.q_mu[t] = Linv @ mu[t * m:(t + 1) * m]
            model.q_sqrt_raw[t] = torch.linalg.cholesky(Linv @ S @ Linv.T)


def collapsed_bound(model, X, y):
    """log N(y | 0, Q + s^2 I) - tr(K - Q) / (2 s^2) with Q = sum_t K_tf K_t^-1 K_tu."""
    noise = model.likelihood.noise.detach()
    with torch.no_grad():
        Kuu = model.features.Kuu() + model.jitter * torch.eye(model.n_inducing, dtype=F64)
        Kuf = model.features.Kuf(X)
        Q = sum(Kuf[t].T @ torch.linalg.solve(Kuu[t], Kuf[t]) for t in range(len(Kuu)))
        cov = Q + noise * torch.eye(len(X), dtype=F64)
        fit_term = torch.distributions.MultivariateNormal(torch.zeros(len(X), dtype=F64), cov).log_prob(y)
        return (fit_term - torch.trace(model.kernel(X, X) - Q) / (2 * noise)).item()


def test_10_the_optimum_on_orbit_closed_data_is_the_exact_evidence():
    X = torch.cat([X0, -X0])
    y = target(X)
    model = rbf_hvgp("negation", m=3)
    with torch.no_grad():
        model.features.Z.copy_(X0.expand(2, -1, -1))
    set_optimal_q(model, X, y)
    assert log_evidence(model, X, y) == pytest.approx(-4.9762418220, abs=1e-9)
    assert model.elbo(X, y, len(X)).item() == pytest.approx(-4.9762418220, abs=1e-6)
    assert collapsed_bound(model, X, y) == pytest.approx(-4.9762418220, abs=1e-6)
    svgp_like = rbf_hvgp("identity", m=3)  # SVGP with Z = X0 alone: the spec's -10.0342
    with torch.no_grad():
        svgp_like.features.Z.copy_(X0.expand(1, -1, -1))
    set_optimal_q(svgp_like, X, y)
    assert svgp_like.elbo(X, y, len(X)).item() == pytest.approx(-10.0342, abs=1e-3)


def test_13_nystrom_residual_vanishes_on_closed_training_data():
    X = torch.cat([X0, -X0])
    model = rbf_hvgp("negation", m=3)
    with torch.no_grad():
        model.features.Z.copy_(X0.expand(2, -1, -1))
        Kuu = model.features.Kuu() + model.jitter * torch.eye(3, dtype=F64)
        Kuf = model.features.Kuf(X)
        Q = sum((Kuf[t] * torch.linalg.solve(Kuu[t], Kuf[t])).sum(0) for t in range(2))
    assert (model.kernel.diag(X) - Q).abs().max() < 1e-8


def test_11_bounds_order_on_data_that_is_not_closed():
    g = torch.Generator().manual_seed(11)
    X = torch.randn(25, 2, generator=g, dtype=F64)
    y = target(X) + 0.3 * torch.randn(25, generator=g, dtype=F64)
    model = rbf_hvgp("negation", m=4)
    with torch.no_grad():
        model.features.Z.copy_(torch.randn(2, 4, 2, generator=g, dtype=F64))
    random_q = model.elbo(X, y, 25).item()
    set_optimal_q(model, X, y)
    optimum = model.elbo(X, y, 25).item()
    assert random_q < optimum <= collapsed_bound(model, X, y) + 1e-9 < log_evidence(model, X, y)
    with torch.no_grad():  # perturbing the optimum never raises the ELBO
        for _ in range(5):
            model.q_mu.add_(1e-3 * torch.randn(model.q_mu.shape, generator=g, dtype=F64))
            assert model.elbo(X, y, 25).item() <= optimum + 1e-12


def test_8_one_transformation_is_svgp():
    g = torch.Generator().manual_seed(8)
    X = torch.randn(40, 2, generator=g, dtype=F64)
    y = target(X)
    Z = torch.randn(6, 2, generator=g, dtype=F64)
    q_mu = torch.randn(6, generator=g, dtype=F64)
    q_sqrt = torch.tril(torch.randn(6, 6, generator=g, dtype=F64)) + 3 * torch.eye(6, dtype=F64)
    hvgp = rbf_hvgp("identity", m=6)
    svgp = SVGP(2, n_inducing=6, kernel=RBF(2, ard=False), jitter=1e-10).double()
    svgp.kernel.load_state_dict(hvgp.kernel.state_dict())
    svgp.likelihood.load_state_dict(hvgp.likelihood.state_dict())
    with torch.no_grad():
        hvgp.features.Z.copy_(Z.unsqueeze(0))
        hvgp.q_mu.copy_(q_mu.unsqueeze(0))
        hvgp.q_sqrt_raw.copy_(q_sqrt.unsqueeze(0))
        svgp.features.Z.copy_(Z)
        svgp.q_mu.copy_(q_mu)
        svgp.q_sqrt_raw.copy_(q_sqrt)
    torch.testing.assert_close(hvgp.elbo(X, y, 40), svgp.elbo(X, y, 40), rtol=1e-10, atol=1e-10)
    for model in (hvgp, svgp):
        model.fit_posterior(X, y)
    for a, b in zip(hvgp.predict(X[:7]), svgp.predict(X[:7])):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_features_are_the_sub_kernels_and_shared_inducing_points_share_one_orbit():
    g = torch.Generator().manual_seed(3)
    X = torch.randn(9, 2, generator=g, dtype=F64)
    model = rbf_hvgp("negation", m=4, shared_inducing=True)
    with torch.no_grad():
        model.features.Z.copy_(torch.randn(4, 2, generator=g, dtype=F64))
    expected = harmonic_kernels(model.kernel, Negation(), model.features.Z, X)  # [T, m, n]
    torch.testing.assert_close(model.features.Kuf(X), expected)
    assert model.q_mu.shape == (2, 4) and model.features.Z.shape == (4, 2)
    torch.testing.assert_close(model.features.Kuf(X).sum(0), model.kernel(model.features.Z, X))  # sum_t k_t = k
    separate = rbf_hvgp("negation", m=4)  # one Z per block: block t's features are k_t(Z_t, X)
    with torch.no_grad():
        separate.features.Z.copy_(torch.randn(2, 4, 2, generator=g, dtype=F64))
    for t in range(2):
        expected = harmonic_kernel(separate.kernel, Negation(), t, separate.features.Z[t], X)
        torch.testing.assert_close(separate.features.Kuf(X)[t], expected)
        torch.testing.assert_close(separate.features.Kuu()[t], harmonic_kernel(
            separate.kernel, Negation(), t, separate.features.Z[t], separate.features.Z[t]))


@pytest.mark.parametrize("group, d", [("pca_negation", 2), ("negation", 2), ("cyclic_shift", 3)])
def test_kuu_of_a_kernel_without_batches_is_formed_block_by_block_alike(group, d):
    """K_uu's blocks in one batched kernel call (a Stationary kernel) and one call per block (a kernel that takes no
    batch axis, as a user's may not) agree in value and in the gradient of Z: for a linear action, an index action
    and one whose half orbit doubles the weight of an element (a shift of period 3)."""
    model = HVGP(d, n_inducing=5, group=group, n_ways=2, kernel=RBF(d, ard=False), jitter=1e-10).double()
    g = torch.Generator().manual_seed(8)
    model.initialise(torch.randn(60, d, generator=g, dtype=F64), torch.randn(60, generator=g, dtype=F64))
    calls = []
    forward = model.kernel.forward
    model.kernel.forward = lambda X1, X2: calls.append(X1.ndim) or forward(X1, X2)
    batched = model.features.Kuu()
    model.kernel.takes_batches = False
    looped = model.features.Kuu()
    assert calls == [3] + [2] * model.features.blocks  # one batched call, then one call per block
    torch.testing.assert_close(batched, looped, rtol=0, atol=1e-13)
    weights = torch.randn(batched.shape, generator=g, dtype=F64)
    grads = [torch.autograd.grad((K * weights).sum(), model.features.Z)[0] for K in (batched, looped)]
    torch.testing.assert_close(*grads, rtol=1e-12, atol=1e-12)


def test_ard_kernels_are_refused_for_groups_that_mix_coordinates():
    with pytest.raises(ValueError, match="ard=False"):
        HVGP(3, group="cyclic_shift", kernel="rbf", ard=True)
    HVGP(3, group="negation", kernel="rbf", ard=True)  # x -> -x keeps every stationary kernel invariant
    HVGP(3, group="pca_negation", kernel="rbf", ard=True)  # coordinate negations in the PCA basis, as 'auto'
    with pytest.raises(ValueError, match="group must be one of"):
        HVGP(3, group="rotation")


@pytest.mark.parametrize("group", ["pca_negation", "auto"])
def test_a_basis_from_the_data_is_learnt_and_restored(tmp_path, group):
    g = torch.Generator().manual_seed(5)
    A = torch.tensor([[2.0, 0.5, 0.0], [0.5, 1.0, 0.3], [0.0, 0.3, 0.4]], dtype=F64)
    X = torch.randn(400, 3, generator=g, dtype=F64) @ A
    y = torch.sin(X[:, 0]) + 0.5 * X[:, 1] ** 2 + 0.05 * torch.randn(400, generator=g, dtype=F64)
    reg = GPRegressor(method="hvgp", group=group, n_inducing=8, n_ways=2, epochs=3, batch_size=100,
                      dtype="float64", seed=0).fit(X.numpy(), y.numpy())
    assert reg.model_.q_mu.shape == (4, 8)  # 2 ways: T = 4 blocks
    basis = reg.model_.features.basis
    assert not torch.allclose(basis, torch.eye(3, dtype=basis.dtype))
    reg.save(tmp_path / "hvgp.gps")
    again = GPRegressor.load(tmp_path / "hvgp.gps")
    mean, std = reg.predict(X[:20].numpy(), return_std=True)
    mean2, std2 = again.predict(X[:20].numpy(), return_std=True)
    torch.testing.assert_close(torch.as_tensor(mean2), torch.as_tensor(mean))
    torch.testing.assert_close(torch.as_tensor(std2), torch.as_tensor(std))


def test_pca_negation_is_the_negation_of_pca_subspaces_and_reads_earlier_model_files():
    """group='pca_negation' works on X B (B the PCA directions) with an isotropic kernel: its sub-kernels on B^T x
    are those of the subspace negations of B's interleaved columns on x; and a state of the earlier layout (Z in
    the inputs' coordinates, B as ``pca_basis``) loads into the same model."""
    g = torch.Generator().manual_seed(3)
    X = torch.randn(80, 4, generator=g, dtype=F64) @ torch.randn(4, 4, generator=g, dtype=F64)
    y = torch.sin(X[:, 0]) + X[:, 1]
    model = HVGP(4, n_inducing=5, group="pca_negation", n_ways=2, jitter=1e-10).double()
    model.initialise(X, y)
    _random_q(model, g)  # at q = p(u), the ELBO would not see Z
    B = model.features.basis
    torch.testing.assert_close(B, pca_directions(X))
    Z = model.features.Z  # [T, m, d] in the coordinates of B
    negations = subspace_negations(B, 2)
    for t in range(model.features.blocks):
        torch.testing.assert_close(model.features.Kuf(X[:9])[t],
                                   harmonic_kernel(model.kernel, negations, t, Z[t] @ B.T, X[:9]).detach())
    earlier = {k: v for k, v in model.state_dict().items() if k != "features.basis"}
    earlier |= {"pca_basis": B, "features.Z": Z.detach() @ B.T}
    again = HVGP(4, n_inducing=5, group="pca_negation", n_ways=2, jitter=1e-10).double()
    again.load_state_dict(earlier)
    torch.testing.assert_close(again.features.basis, B)
    torch.testing.assert_close(again.elbo(X, y, 80), model.elbo(X, y, 80), rtol=1e-12, atol=1e-12)


def test_negation_basis_keeps_the_axes_of_uncorrelated_inputs_and_takes_the_principal_directions_else():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(4000, 6, generator=g, dtype=F64) * torch.tensor([3.0, 1.0, 2.0, 0.5, 1.0, 1.0], dtype=F64)
    torch.testing.assert_close(negation_basis(X, 3), torch.eye(6, dtype=F64))  # independent columns
    rotation = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=F64))[0]
    torch.testing.assert_close(negation_basis(X @ rotation, 3), pca_directions(X @ rotation))


def test_auto_is_the_coordinate_negation_model_on_the_inputs_in_its_basis():
    """group='auto' with basis B on X is group='pixel_negation' on X B with the same ARD kernel, Z and q: the same
    ELBO and predictions; and its kernel on X B is invariant under the negations of B's interleaved columns."""
    g = torch.Generator().manual_seed(11)
    X = torch.randn(60, 4, generator=g, dtype=F64) @ torch.randn(4, 4, generator=g, dtype=F64)
    y = torch.sin(X[:, 0]) + X[:, 1]
    auto = HVGP(4, n_inducing=5, n_ways=2, jitter=1e-10).double()
    auto.initialise(X, y)
    B = auto.features.basis
    assert auto.kernel.lengthscale.shape == (4,) and not torch.allclose(B.abs(), torch.eye(4, dtype=F64))
    with torch.no_grad():
        auto.kernel.raw_lengthscale.copy_(torch.tensor([0.3, -0.2, 0.8, 0.1], dtype=F64))
        auto.features.Z.add_(0.1 * torch.randn(auto.features.Z.shape, generator=g, dtype=F64))
        auto.q_mu.copy_(torch.randn(auto.q_mu.shape, generator=g, dtype=F64))
    axes = HVGP(4, n_inducing=5, group="pixel_negation", n_ways=2, ard=True, jitter=1e-10).double()
    axes.load_state_dict({k: v for k, v in auto.state_dict().items() if k != "features.basis"})
    torch.testing.assert_close(auto.elbo(X, y, 60), axes.elbo(X @ B, y, 60), rtol=1e-10, atol=1e-10)
    for model, inputs in ((auto, X), (axes, X @ B)):
        model.fit_posterior(inputs, y)
    for a, b in zip(auto.predict(X[:7]), axes.predict(X[:7] @ B)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    negate = subspace_negations(B, 2)
    for s in range(negate.order):  # k(B^T G^s x, B^T G^s x') = k(B^T x, B^T x') for the ARD kernel
        moved = negate.apply(X[:9], s) @ B
        torch.testing.assert_close(auto.kernel(moved, moved), auto.kernel(X[:9] @ B, X[:9] @ B))


def test_hvgp_at_its_defaults_takes_inputs_of_one_or_two_columns():
    g = torch.Generator().manual_seed(2)
    for d in (1, 2):
        X = torch.randn(200, d, generator=g, dtype=F64)
        reg = GPRegressor(method="hvgp", n_inducing=8, epochs=2, batch_size=100, dtype="float64", seed=0)
        reg.fit(X.numpy(), X.sum(1).numpy())
        assert reg.model_.features.blocks == 2**d
        assert reg.predict(X[:5].numpy()).shape == (5,)


def test_17_hvgp_beats_svgp_of_one_block_on_symmetric_data():
    # inputs symmetric under the PCA negations; 2^2 x m inducing points should fit better than SVGP with m
    g = torch.Generator().manual_seed(17)
    R = torch.linalg.qr(torch.randn(2, 2, generator=g, dtype=F64))[0]
    X = (torch.randn(2000, 2, generator=g, dtype=F64) * torch.tensor([2.0, 0.7], dtype=F64)) @ R
    f = torch.sin(2 * X[:, 0]) * torch.cos(X[:, 1]) + 0.3 * X[:, 1]
    y = f + 0.1 * torch.randn(2000, generator=g, dtype=F64)
    Xt = (torch.randn(500, 2, generator=g, dtype=F64) * torch.tensor([2.0, 0.7], dtype=F64)) @ R
    ft = torch.sin(2 * Xt[:, 0]) * torch.cos(Xt[:, 1]) + 0.3 * Xt[:, 1]
    rmse = {}
    for name, model in [("hvgp", get_model_class("hvgp")(2, n_inducing=6, n_ways=2, kernel="rbf").double()),
                        ("svgp", SVGP(2, n_inducing=6, kernel="rbf", ard=False).double())]:
        fit(model, X, y, epochs=40, batch_size=250, lr=0.03, progress=False)
        rmse[name] = math.sqrt(((model.predict(Xt)[0] - ft) ** 2).mean().item())
    assert rmse["hvgp"] < 0.8 * rmse["svgp"]


def test_multiclass_latent_functions_are_independent_svgps_sharing_the_features():
    g = torch.Generator().manual_seed(21)
    X = torch.randn(30, 2, generator=g, dtype=F64)
    for group in ("identity", "negation"):
        multi = rbf_hvgp(group, m=5, likelihood="robustmax", n_classes=3)
        single = rbf_hvgp(group, m=5)
        with torch.no_grad():
            multi.features.Z.copy_(torch.randn(multi.features.Z.shape, generator=g, dtype=F64))
            single.features.Z.copy_(multi.features.Z)
            multi.q_mu.copy_(torch.randn(multi.q_mu.shape, generator=g, dtype=F64))
            multi.q_sqrt_raw.add_(0.3 * torch.randn(multi.q_sqrt_raw.shape, generator=g, dtype=F64))
        T = multi.features.blocks
        assert multi.q_mu.shape == (T, 3, 5) and multi.q_sqrt.shape == (T, 3, 5, 5)
        mean, var = multi.conditional(X, multi.Lu(), multi.q_mu, multi.q_sqrt)
        assert mean.shape == var.shape == (30, 3)
        for c in range(3):
            m_c, v_c = single.conditional(X, single.Lu(), multi.q_mu[:, c], multi.q_sqrt[:, c])
            torch.testing.assert_close(mean[:, c], m_c)
            torch.testing.assert_close(var[:, c], v_c)
        per_latent = sum(gauss_kl_whitened(multi.q_mu[:, c], multi.q_sqrt[:, c]) for c in range(3))
        torch.testing.assert_close(multi.prior_kl(), per_latent)


def test_hvgp_classifies_three_classes_with_robust_max():
    g = torch.Generator().manual_seed(4)
    X = torch.randn(600, 2, generator=g, dtype=F64)
    y = (torch.atan2(X[:, 1], X[:, 0]) + math.pi).mul(3 / (2 * math.pi)).floor().clamp(max=2)  # three sectors
    model = HVGP(2, n_inducing=10, group="negation", kernel="rbf", likelihood="robustmax", n_classes=3).double()
    fit(model, X, y, epochs=60, batch_size=200, lr=0.05, progress=False)
    probs, _ = model.likelihood.predictive(*model.predict(X))
    assert probs.shape == (600, 3)
    assert (probs.argmax(1) == y.long()).double().mean() > 0.9


def test_14_minibatch_estimates_average_to_the_full_elbo():
    g = torch.Generator().manual_seed(14)
    X = torch.randn(40, 2, generator=g, dtype=F64)
    y = target(X)
    model = rbf_hvgp("negation", m=4)
    with torch.no_grad():
        model.features.Z.copy_(torch.randn(2, 4, 2, generator=g, dtype=F64))
        model.q_mu.copy_(torch.randn(2, 4, generator=g, dtype=F64))
    full = model.elbo(X, y, 40)
    parts = [model.elbo(X[i:i + 10], y[i:i + 10], 40) for i in range(0, 40, 10)]
    torch.testing.assert_close(torch.stack(parts).mean(), full)


def test_15_the_elbo_gradient_passes_gradcheck():
    g = torch.Generator().manual_seed(15)
    X = torch.randn(8, 2, generator=g, dtype=F64)
    y = target(X)
    model = rbf_hvgp("negation", m=3, jitter=1e-6)
    with torch.no_grad():
        model.features.Z.copy_(torch.randn(2, 3, 2, generator=g, dtype=F64))
        model.q_mu.copy_(torch.randn(2, 3, generator=g, dtype=F64))
        model.q_sqrt_raw.add_(0.2 * torch.randn(2, 3, 3, generator=g, dtype=F64))
    params = [model.features.Z, model.q_mu, model.q_sqrt_raw, model.kernel.raw_lengthscale,
              model.kernel.raw_outputscale, model.likelihood.raw_noise]
    assert torch.autograd.gradcheck(lambda *_: model.elbo(X, y, 8), params)


@pytest.mark.parametrize("rows_per_chunk", [900, 100, 7])  # 3 of the 8 blocks a chunk; one block in row chunks
def test_features_formed_in_chunks_equal_the_whole_in_value_and_gradient(monkeypatch, rows_per_chunk):
    g = torch.Generator().manual_seed(5)
    X = torch.randn(300, 5, generator=g, dtype=F64)
    model = HVGP(5, n_inducing=16, group="pca_negation", n_ways=3).double()  # T = 8 blocks, orbits of S = 8
    model.initialise_from_data(X, target(X), seed=0)
    features = model.features
    inputs = [features.Z, *features.kernel.parameters()]

    def value_and_gradient(blocks=slice(None)):
        K = features.Kuf(X, blocks)
        return K, torch.autograd.grad((K * torch.linspace(-1, 1, K.numel(), dtype=F64).view(K.shape)).sum(), inputs)

    whole, whole_grad = value_and_gradient()
    row_bytes = features.action.order * 16 * X.element_size()
    monkeypatch.setattr("gpscale.models.harmonic.hvgp.KUF_CHUNK_BYTES", rows_per_chunk * row_bytes)
    chunked, chunked_grad = value_and_gradient()
    torch.testing.assert_close(chunked, whole, rtol=1e-12, atol=1e-14)
    for a, b in zip(chunked_grad, whole_grad):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(features.Kuf(X, slice(1, 4)), whole[1:4], rtol=1e-12, atol=1e-14)
    assert features.Kuf(X[:0]).shape == (8, 16, 0)  # a rank with no rows of the batch (data parallelism)


def test_features_off_the_cpu_are_formed_in_fewer_chunks(monkeypatch):
    """The CPU's chunk budget (glibc's malloc thresholds) does not apply on other devices, where every chunk costs
    its own kernel launches: there K_uf's 8 blocks take one kernel evaluation where the CPU's budget takes 8."""
    g = torch.Generator().manual_seed(6)
    X = torch.randn(64, 5, generator=g, dtype=F64)
    model = HVGP(5, n_inducing=16, group="pca_negation", n_ways=3).double()  # T = 8 blocks, orbits of S = 8
    model.initialise_from_data(X, target(X), seed=0)
    monkeypatch.setattr("gpscale.models.harmonic.hvgp.KUF_CHUNK_BYTES", 64 * model.features.action.order * 16 * 8)
    calls = []
    grams = model.kernel.weighted_grams
    model.kernel.weighted_grams = lambda A, B, W: calls.append(B.shape[0]) or grams(A, B, W)
    model.features.Kuf(X)
    assert calls == [64] * 8  # a block a chunk on the CPU
    model.to("meta")
    calls.clear()
    assert model.features.Kuf(X.to("meta")).shape == (8, 16, 64)
    assert calls == [64]


def test_prediction_chunks_shrink_with_the_orbit():
    big = HVGP(3, n_inducing=250, group="longitude", period=12)  # S = 12, T = 7: 21,000 orbit points
    assert big.chunk_size == 2**22 // 21_000
    assert HVGP(3, n_inducing=250, group="longitude", chunk_size=1000).chunk_size == 1000
    assert HVGP(2, n_inducing=4, group="negation").chunk_size == 8192


def _random_q(model, g):
    with torch.no_grad():
        model.q_mu.copy_(torch.randn(model.q_mu.shape, generator=g, dtype=F64))
        eye = torch.eye(model.n_inducing, dtype=F64)
        model.q_sqrt_raw.copy_(0.3 * torch.randn(model.q_sqrt_raw.shape, generator=g, dtype=F64) + eye)


def test_9_whitened_q_equals_the_unwhitened_q_it_maps_to():
    """u_t = L_t v_t: the whitened ELBO and predictions equal a dense unwhitened reference with m_u = L m_v and
    S_u = L S_v S_v^T L^T, KL(N(m_u, S_u) || N(0, K_t)) summed over the blocks."""
    g = torch.Generator().manual_seed(9)
    X = torch.randn(30, 2, generator=g, dtype=F64)
    y = target(X)
    model = rbf_hvgp("negation", m=5, jitter=1e-8)
    with torch.no_grad():
        model.features.Z.copy_(torch.randn(2, 5, 2, generator=g, dtype=F64))
    _random_q(model, g)
    with torch.no_grad():
        Kuu = model.features.Kuu() + model.jitter * torch.eye(5, dtype=F64)
        Kuf = model.features.Kuf(X)
        L = torch.linalg.cholesky(Kuu)
        S_v = model.q_sqrt
        m_u = (L @ model.q_mu.unsqueeze(-1)).squeeze(-1)
        S_u = L @ S_v @ S_v.mT @ L.mT
        Kinv_Kuf = torch.linalg.solve(Kuu, Kuf)  # [T, m, n]
        mean = torch.einsum("tmn,tm->n", Kinv_Kuf, m_u)
        var = (model.kernel.diag(X) - (Kuf * Kinv_Kuf).sum((0, 1))
               + (Kinv_Kuf * (S_u @ Kinv_Kuf)).sum((0, 1)))
        kl = sum(torch.distributions.kl_divergence(torch.distributions.MultivariateNormal(m_u[t], S_u[t]),
                                                   torch.distributions.MultivariateNormal(torch.zeros(5, dtype=F64),
                                                                                          Kuu[t]))
                 for t in range(2))
        noise = model.likelihood.noise
        expected = -0.5 * (torch.log(2 * math.pi * noise) + ((y - mean) ** 2 + var) / noise).sum() - kl
        torch.testing.assert_close(model.elbo(X, y, 30), expected, rtol=1e-9, atol=1e-9)
        model.fit_posterior(X, y)
        for ours, reference in zip(model.predict(X), (mean, var)):
            torch.testing.assert_close(ours, reference, rtol=1e-9, atol=1e-9)


def test_12_shared_negation_features_with_a_full_q_are_svgp_on_z_and_minus_z():
    """Thm 4.1 (P = 2): u = F u' with u' = f([Z; -Z]) and F = [[1/2, 1/2], [1/2, -1/2]] (x) I. The HVGP features
    are exactly F's rows (block-diagonal K_uu: u_0 and u_1 are uncorrelated), so an HVGP with shared Z and the
    full q mapped through F predicts as the SVGP on [Z; -Z]."""
    g = torch.Generator().manual_seed(12)
    X = torch.randn(11, 2, generator=g, dtype=F64)
    Z = torch.randn(4, 2, generator=g, dtype=F64)
    hvgp = rbf_hvgp("negation", m=4, shared_inducing=True)
    svgp = SVGP(2, n_inducing=8, kernel=RBF(2, ard=False), jitter=1e-10).double()
    svgp.kernel.load_state_dict(hvgp.kernel.state_dict())
    with torch.no_grad():
        hvgp.features.Z.copy_(Z)
        svgp.features.Z.copy_(torch.cat([Z, -Z]))
    _random_q(svgp, g)
    svgp.fit_posterior(X, None)
    svgp_mean, svgp_var = svgp.predict(X)
    with torch.no_grad():
        F = torch.kron(torch.tensor([[0.5, 0.5], [0.5, -0.5]], dtype=F64), torch.eye(4, dtype=F64))
        K_svgp = svgp.kernel(svgp.features.Z, svgp.features.Z) + 1e-10 * torch.eye(8, dtype=F64)
        Kuu = torch.block_diag(*hvgp.features.Kuu()) + 1e-10 * F @ F.T
        Kuf = hvgp.features.Kuf(X).reshape(8, -1)
        torch.testing.assert_close(F @ K_svgp @ F.T, Kuu, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(F @ svgp.kernel(svgp.features.Z, X), Kuf, rtol=1e-12, atol=1e-12)
        L_svgp = torch.linalg.cholesky(K_svgp)
        m_u = F @ L_svgp @ svgp.q_mu
        S_u = F @ L_svgp @ svgp.q_sqrt @ svgp.q_sqrt.T @ L_svgp.T @ F.T
        A = torch.linalg.solve(Kuu, Kuf)
        mean = A.T @ m_u
        var = hvgp.kernel.diag(X) - (Kuf * A).sum(0) + (A * (S_u @ A)).sum(0)
    torch.testing.assert_close(mean, svgp_mean, rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(var, svgp_var, rtol=1e-8, atol=1e-8)


def test_blocks_placed_on_several_devices_give_the_same_elbo_gradients_and_predictions():
    from unittest.mock import patch

    from gpscale.models.harmonic.hvgp import HarmonicFeatures

    g = torch.Generator().manual_seed(5)
    X = torch.randn(64, 2, generator=g, dtype=F64)
    y = target(X)
    models = [rbf_hvgp("pixel_negation", m=6, n_ways=2, jitter=1e-8, devices=devices)
              for devices in (None, ("cpu",) * 3)]
    with torch.no_grad():
        models[0].features.Z.copy_(torch.randn(4, 6, 2, generator=g, dtype=F64))
    _random_q(models[0], g)
    models[1].load_state_dict(models[0].state_dict())
    assert [b for b, _ in models[1].placement()] == [slice(0, 1), slice(1, 3), slice(3, 4)]
    with patch.object(HarmonicFeatures, "Kuf", autospec=True, side_effect=HarmonicFeatures.Kuf) as Kuf:
        elbos = [model.elbo(X, y, 64) for model in models]
    assert [call.args[2:] for call in Kuf.call_args_list] == [(), (slice(0, 1),), (slice(1, 3),), (slice(3, 4),)]
    torch.testing.assert_close(elbos[0], elbos[1], rtol=1e-10, atol=1e-10)
    grads = [torch.autograd.grad(elbo, list(model.parameters())) for elbo, model in zip(elbos, models)]
    for a, b in zip(*grads):  # blocks summed in other groupings: round-off of the sums over rows and the orbit
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-8)
    for model in models:
        model.fit_posterior(X, y)
    for a, b in zip(models[0].predict(X), models[1].predict(X)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="1 to T = 4 devices"):
        rbf_hvgp("pixel_negation", m=6, n_ways=2, devices=("cpu",) * 5)


def test_a_placed_model_with_sequence_options_saves_and_loads(tmp_path):
    g = torch.Generator().manual_seed(6)
    X = torch.randn(120, 3, generator=g, dtype=F64).numpy()
    y = X[:, 0] ** 2 + X[:, 1]
    reg = GPRegressor(method="hvgp", n_inducing=6, n_ways=2, devices=["cpu", "cpu"], epochs=2, batch_size=40,
                      progress=False).fit(X, y)
    reg.save(tmp_path / "m.gps")
    loaded = GPRegressor.load(tmp_path / "m.gps")
    assert loaded.model_.devices == (torch.device("cpu"),) * 2 and isinstance(loaded.model_.cache["Lu"], list)
    assert (loaded.predict(X[:7]) == reg.predict(X[:7])).all()

"""The orthogonally decoupled engine (odvff, odvgp, vff-svgp) against dense formulas, the paper's closed-form
optimum and the exact GP."""
import pytest
import torch
from torch.distributions import MultivariateNormal

import gpscale.linalg as gpscale_linalg
import gpscale.models.variational.gaussian_q as gpscale_gaussian_q
from gpscale import GPRegressor
from gpscale.kernels import AdditiveMatern, matern_sums
from gpscale.linalg import NumericalWarning
from gpscale.models.exact.gp import ExactGP
from gpscale.models.variational.odvgp import ODVGP
from gpscale.models.variational.svgp import SVGP
from gpscale.models.fourier.vff import ODVFF, VFF, VFFSVGP
from gpscale.train import fit

F64 = torch.float64


def problem(n=60, d=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=F64)
    y = torch.sin(6 * X[:, 0]) + 0.1 * torch.randn(n, generator=g, dtype=F64)
    return X, y


def odvff(X, y, F=5, n_mean=0, noise=0.05, **kw):
    model = ODVFF(X.shape[1], n_frequencies=F, n_mean_inducing=n_mean, lengthscale=0.2, noise=noise, **kw).double()
    model.initialise_from_data(X, y)
    return model


@pytest.fixture
def sums_at_every_size(monkeypatch):
    """The additive kernel's K v takes its sums only above DENSE_BELOW kernel values; here at every size."""
    monkeypatch.setattr(matern_sums, "DENSE_BELOW", 1)


def odvgp(X, y, M=8, n_mean=0, additive=True):
    """ODVGP on the additive Matérn (its K(., gamma) a through sorted sums, in one call for Z and gamma) or on the
    ARD Matérn (dense products)."""
    kernel = AdditiveMatern(X.shape[1], lengthscale=0.3) if additive else "matern32"
    model = ODVGP(X.shape[1], n_inducing=M, n_mean_inducing=n_mean, kernel=kernel, lengthscale=0.3,
                  noise=0.05, jitter=0.0).double()  # the dense formulas' K_bb has none
    model.initialise_from_data(X, y)
    return model


def randomise(model, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        M = model.q_mu.shape[0]
        model.q_mu.copy_(torch.randn(M, generator=g, dtype=F64))
        model.q_sqrt_raw.copy_(torch.tril(0.3 * torch.randn(M, M, generator=g, dtype=F64)) + torch.eye(M, dtype=F64))
        model.a_gamma.copy_(torch.randn(model.n_mean_inducing, generator=g, dtype=F64))


def dense(model, X):
    """K_bb, K_bx, K_bg, K_gg, K_gx, k_xx as dense matrices."""
    f = model.features
    return (f.Kuu_operator().to_dense(), f.Kuf(X).to(F64), f.Kuf(model.gamma).to(F64),
            model.kernel(model.gamma, model.gamma), model.kernel(model.gamma, X), model.kernel(X, X))


def dense_elbo(model, X, y):
    """The decoupled ELBO, its predictive mean and variance, written out with dense solves."""
    Kbb, Kbx, Kbg, Kgg, Kgx, Kxx = dense(model, X)
    m, L, a = model.q_mu, model.q_sqrt, model.a_gamma
    S = L @ L.T
    Kinv = torch.linalg.inv(Kbb)
    mean = Kgx.T @ a + Kbx.T @ Kinv @ (m - Kbg @ a)
    var = torch.diagonal(Kxx) + ((Kinv @ Kbx) * ((S - Kbb) @ Kinv @ Kbx)).sum(0)
    s2 = model.noise
    expected = (-0.5 * torch.log(2 * torch.pi * s2) - 0.5 * ((y - mean) ** 2 + var) / s2).sum()
    kl = torch.distributions.kl_divergence(MultivariateNormal(m, S), MultivariateNormal(torch.zeros_like(m), Kbb))
    kl = kl + 0.5 * (a @ Kgg @ a - a @ Kbg.T @ Kinv @ Kbg @ a)
    return expected - kl, mean, var


def test_6_at_initialisation_q_is_the_prior():
    X, y = problem()
    model = odvff(X, y, n_mean=10)
    with torch.no_grad():
        Kbb = model.Kuu_operator()
        mean, residual, A = model.q.projections(model, X, Kbb, model.q.mean_weights(model, Kbb, model.q_mu))
        var = residual + (model.q_sqrt.T @ A).square().sum(0)
        kl = model.prior_kl()
    assert mean.abs().max() == 0
    torch.testing.assert_close(var, model.kernel.diag(X), rtol=1e-9, atol=1e-9)
    assert abs(kl.item()) < 1e-9


@pytest.mark.usefixtures("sums_at_every_size")
@pytest.mark.parametrize("make", ["odvff", "odvgp-additive", "odvgp"])
@pytest.mark.parametrize("n_mean", [0, 7])
def test_8_the_elbo_equals_the_dense_formulas(n_mean, make):
    X, y = problem(40, 2)
    if make == "odvff":
        model = odvff(X, y, F=4, n_mean=n_mean)
    else:
        model = odvgp(X, y, n_mean=n_mean, additive=make == "odvgp-additive")
    randomise(model)
    with torch.no_grad():
        expected, mean, var = dense_elbo(model, X, y)
        ours = model.elbo(X, y, X.shape[0])
        model.fit_posterior(X, y)
        predicted = model.predict(X)
    torch.testing.assert_close(ours, expected, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(predicted[0], mean, rtol=1e-8, atol=1e-9)
    torch.testing.assert_close(predicted[1], var, rtol=1e-7, atol=1e-9)


def test_7_the_orthogonal_kl_term_is_the_joint_quadratic_form():
    X, y = problem(40, 1)
    model = odvff(X, y, n_mean=6)
    randomise(model)
    Kbb, _, Kbg, Kgg, _, _ = dense(model, X)
    a, m = model.a_gamma.detach(), model.q_mu.detach()
    w = torch.linalg.solve(Kbb, m - Kbg @ a)
    a_alpha = torch.cat([a, w])
    K_alpha = torch.cat([torch.cat([Kgg, Kbg.T], 1), torch.cat([Kbg, Kbb], 1)])
    joint = a_alpha @ K_alpha @ a_alpha
    split = a @ (Kgg - Kbg.T @ torch.linalg.solve(Kbb, Kbg)) @ a + m @ torch.linalg.solve(Kbb, m)
    torch.testing.assert_close(joint, split, rtol=1e-10, atol=1e-10)


def test_8_with_inducing_points_and_no_mean_basis_it_is_the_whitened_svgp():
    X, y = problem(50, 2)
    decoupled = ODVGP(2, n_inducing=8, n_mean_inducing=0, lengthscale=0.3, noise=0.1, jitter=1e-6).double()
    decoupled.initialise_from_data(X, y)
    randomise(decoupled)
    svgp = SVGP(2, n_inducing=8, lengthscale=0.3, noise=0.1, jitter=1e-6).double()
    with torch.no_grad():
        svgp.features.Z.copy_(decoupled.features.Z)
        Lu = svgp.Lu()  # q(u) = N(m, S)  <=>  q(v) = N(Lu^-1 m, Lu^-1 S Lu^-T)
        svgp.q_mu.copy_(torch.linalg.solve_triangular(Lu, decoupled.q_mu.unsqueeze(-1), upper=False).squeeze(-1))
        svgp.q_sqrt_raw.copy_(torch.linalg.solve_triangular(Lu, decoupled.q_sqrt, upper=False))
        torch.testing.assert_close(decoupled.elbo(X, y, 50), svgp.elbo(X, y, 50), rtol=1e-9, atol=1e-9)


def closed_form_optimum(model, X, y):
    """The optimal (a, m, S) of the Gaussian full-batch ELBO for fixed theta and gamma."""
    Kbb, Kbx, Kbg, Kgg, Kgx, _ = dense(model, X)
    s2 = model.noise.detach()
    S = Kbb @ torch.linalg.solve(Kbb + Kbx @ Kbx.T / s2, Kbb)
    K_alpha = torch.cat([torch.cat([Kgg, Kbg.T], 1), torch.cat([Kbg, Kbb], 1)])
    K_alpha_x = torch.cat([Kgx, Kbx])
    a_alpha = torch.linalg.solve(K_alpha_x @ K_alpha_x.T + s2 * K_alpha, K_alpha_x @ y)
    Mg = model.n_mean_inducing
    a, w = a_alpha[:Mg], a_alpha[Mg:]
    with torch.no_grad():
        model.a_gamma.copy_(a)
        model.q_mu.copy_(Kbb @ w + Kbg @ a)
        model.q_sqrt_raw.copy_(torch.linalg.cholesky(0.5 * (S + S.T)))


def optimal_elbo(model, X, y):
    closed_form_optimum(model, X, y)
    with torch.no_grad():
        return model.elbo(X, y, X.shape[0]).item()


def test_8_at_the_optimum_the_svgp_form_equals_the_collapsed_vff_bound():
    X, y = problem(70, 1)
    for F in (5, 20):
        svgp_form = odvff(X, y, F=F)
        collapsed = VFF(1, n_frequencies=F, lengthscale=0.2, noise=0.05, kernel=svgp_form.kernel).double()
        collapsed.initialise_from_data(X, y)
        with torch.no_grad():
            collapsed.fourier.set_box(svgp_form.features.lower, svgp_form.features.upper)
            bound = collapsed.elbo(X, y).item()
        assert optimal_elbo(svgp_form, X, y) == pytest.approx(bound, rel=1e-10, abs=1e-8)


def test_9_with_gamma_at_every_training_input_the_mean_is_the_exact_gps():
    X, y = problem(40, 1)
    model = odvff(X, y, F=3, n_mean=40)
    with torch.no_grad():
        model.gamma.copy_(X)
    closed_form_optimum(model, X, y)
    exact = ExactGP(1, kernel=model.kernel, noise=0.05).double()
    exact.fit_posterior(X, y)
    model.fit_posterior(X, y)
    Xt = problem(30, 1, seed=5)[0]
    torch.testing.assert_close(model.predict(Xt)[0], exact.predict(Xt)[0], rtol=0, atol=1e-7)


def test_10_the_optimal_bound_grows_with_the_mean_basis_and_stays_below_the_evidence():
    X, y = problem(60, 1)
    elbos = []
    for gamma in (X[:0], X[::6], X[::2], X):
        model = odvff(X, y, F=5, n_mean=gamma.shape[0])
        with torch.no_grad():
            model.gamma.copy_(gamma)
        elbos.append(optimal_elbo(model, X, y))
    exact = ExactGP(1, kernel=model.kernel, noise=0.05).double()
    with torch.no_grad():
        evidence = exact.log_marginal_likelihood(X, y).item()
    assert elbos == sorted(elbos) and elbos[-1] <= evidence + 1e-8


def test_11_one_natural_gradient_step_of_one_reaches_the_optimum_of_q_beta():
    X, y = problem(50, 1)
    model = odvff(X, y, F=4, n_mean=5, natgrad_step=1.0)
    randomise(model)
    Kbb, Kbx, Kbg, _, Kgx, _ = dense(model, X)
    s2 = model.noise.detach()
    a = model.a_gamma.detach()
    c = (Kgx.T - Kbx.T @ torch.linalg.solve(Kbb, Kbg)) @ a
    Kinv = torch.linalg.inv(Kbb)
    S_star = torch.linalg.inv(Kinv + Kinv @ Kbx @ Kbx.T @ Kinv / s2)
    m_star = S_star @ Kinv @ Kbx @ (y - c) / s2
    model.natural_gradient_step(X, y, X.shape[0])
    L = model.q_sqrt.detach()
    torch.testing.assert_close(L @ L.T, S_star, rtol=1e-7, atol=1e-8)
    torch.testing.assert_close(model.q_mu.detach(), m_star, rtol=1e-7, atol=1e-8)
    before = (model.q_mu.detach().clone(), L.clone())
    model.natural_gradient_step(X, y, X.shape[0])
    torch.testing.assert_close(model.q_mu.detach(), before[0], rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(model.q_sqrt.detach(), before[1], rtol=1e-8, atol=1e-8)


def test_11_a_natural_gradient_step_below_one_moves_the_natural_parameters_that_fraction_of_the_way():
    """For a Gaussian likelihood on the full batch, theta <- (1 - rho) theta + rho theta* in the natural parameters
    (S^{-1} m, S^{-1}): twice in a row (the second step reuses the first's precision) and again after q(beta) is
    overwritten (which must not)."""
    X, y = problem(50, 1)
    rho = 0.3
    model = odvff(X, y, F=4, n_mean=5, natgrad_step=rho)
    randomise(model)
    Kbb, Kbx, Kbg, _, Kgx, _ = dense(model, X)
    s2 = model.noise.detach()
    c = (Kgx.T - Kbx.T @ torch.linalg.solve(Kbb, Kbg)) @ model.a_gamma.detach()
    Kinv = torch.linalg.inv(Kbb)
    P_star = Kinv + Kinv @ Kbx @ Kbx.T @ Kinv / s2
    theta_star = (Kinv @ Kbx @ (y - c) / s2, P_star)

    def natural(model):
        L = model.q_sqrt.detach()
        P = torch.linalg.inv(L @ L.T)
        return P @ model.q_mu.detach(), P

    for steps in (1, 2):
        theta = natural(model)
        model.natural_gradient_step(X, y, X.shape[0])
        for ours, before, optimum in zip(natural(model), theta, theta_star):
            torch.testing.assert_close(ours, (1 - rho) * before + rho * optimum, rtol=1e-7, atol=1e-7)
    with torch.no_grad():  # a new q(beta), a_gamma as before
        model.q_sqrt_raw.copy_(2 * torch.eye(model.q_mu.shape[0], dtype=F64))
        model.q_mu.zero_()
    theta = natural(model)
    model.natural_gradient_step(X, y, X.shape[0])
    for ours, before, optimum in zip(natural(model), theta, theta_star):
        torch.testing.assert_close(ours, (1 - rho) * before + rho * optimum, rtol=1e-7, atol=1e-7)


@pytest.mark.usefixtures("sums_at_every_size")
@pytest.mark.parametrize("make", ["odvgp", "odvff", "odvff-extra"])
def test_a_steps_loss_takes_the_matrices_of_its_natural_gradient_step_and_the_same_gradients(make):
    """The natural-gradient step forms K_uu (with its factorisation), K_uf, Kuu^{-1} K_uf with its residual, K_u,gamma
    and k(x, gamma) with their graph and the loss of the same training step takes them (VariationalGP.training_loss): the loss
    and every gradient equal those of forming them again, and K_uu is formed once a step."""
    X, y = problem(80, d=2)

    def build():
        torch.manual_seed(0)
        if make == "odvgp":
            model = ODVGP(2, n_inducing=8, n_mean_inducing=12, kernel=AdditiveMatern(2, lengthscale=0.3),
                          noise=0.05).double()
            model.initialise_from_data(X, y)
        else:
            extra = dict(n_extra_inducing=4, extra_kernel="periodic") if make == "odvff-extra" else {}
            model = odvff(X, y, F=4, n_mean=12, **extra)
        randomise(model)
        return model

    shared, fresh = build(), build()
    formed = []
    original = shared.features.Kuu_operator

    def counted(*args, **kwargs):
        formed.append(1)
        return original(*args, **kwargs)

    shared.features.Kuu_operator = counted
    fresh.natural_gradient_step(X, y, 80)  # a step of its own, and a loss that forms them again
    losses = [shared.training_loss(X, y, 80), fresh.loss(X, y, 80)]
    assert len(formed) == 1 and shared.step_kernels is None
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-13, atol=0)
    for loss in losses:
        loss.backward()
    named = [dict(model.named_parameters()) for model in (shared, fresh)]
    assert any(p.grad is not None for p in named[0].values())
    for name, a in named[0].items():
        b = named[1][name]
        assert (a.grad is None) == (b.grad is None), name
        if a.grad is not None:
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-12, msg=name)


def test_natural_gradients_leave_q_beta_out_of_adam():
    X, y = problem(30, 1)
    model = odvff(X, y, n_mean=3)
    adam = {id(p) for group in model.parameter_groups() for p in group["params"]}
    assert id(model.q_mu) not in adam and id(model.q_sqrt_raw) not in adam and id(model.a_gamma) in adam
    plain = odvff(X, y, n_mean=3, natural_gradients=False)
    adam = {id(p) for group in plain.parameter_groups() for p in group["params"]}
    assert id(plain.q_mu) in adam and id(plain.q_sqrt_raw) in adam


@pytest.mark.usefixtures("sums_at_every_size")
@pytest.mark.parametrize("make", ["odvff", "odvgp-additive"])
def test_14_the_elbo_gradient_passes_gradcheck(make):
    X, y = problem(12, 1)
    model = odvff(X, y, F=2, n_mean=3) if make == "odvff" else odvgp(X, y, M=3, n_mean=3)
    randomise(model)
    params = [model.kernel.raw_lengthscale, model.kernel.raw_variance, model.likelihood.raw_noise, model.gamma,
              model.a_gamma, model.q_mu, model.q_sqrt_raw] + ([model.features.Z] if make != "odvff" else [])
    # gradcheck perturbs its inputs in place: here the model's own parameters, which elbo() reads
    assert torch.autograd.gradcheck(lambda *_: model.elbo(X, y, 12), params)


def test_training_odvff_beats_vff_svgp_when_the_features_are_too_few():
    g = torch.Generator().manual_seed(3)
    X = torch.rand(1500, 1, generator=g, dtype=F64)
    f = lambda x: torch.sin(15 * x[:, 0]) + 0.3 * torch.sin(45 * x[:, 0])  # noqa: E731
    y = f(X) + 0.1 * torch.randn(1500, generator=g, dtype=F64)
    Xt = torch.rand(400, 1, generator=g, dtype=F64)
    scores = {}
    for name, model in [("vff-svgp", VFFSVGP(1, n_frequencies=5).double()),
                        ("odvff", ODVFF(1, n_frequencies=5, n_mean_inducing=60).double())]:
        fit(model, X, y, epochs=30, batch_size=300, lr=0.03, progress=False)
        mean, var = model.predict(Xt)
        scores[name] = (((mean - f(Xt)) ** 2).mean().sqrt().item(),
                        -model.likelihood.log_predictive_density(f(Xt), mean, var).mean().item())
    assert scores["odvff"][0] < 0.5 * scores["vff-svgp"][0]  # 11 features cannot carry the 45-rad/unit part
    assert scores["odvff"][1] < scores["vff-svgp"][1]


@pytest.mark.parametrize("method", ["odvff", "odvgp", "vff-svgp"])
def test_regressor_fits_predicts_and_round_trips(method, tmp_path):
    X, y = problem(80, 2)
    options = {"n_frequencies": 4} if method != "odvgp" else {"n_inducing": 10}
    reg = GPRegressor(method=method, epochs=5, batch_size=40, lr=0.05, progress=False, **options)
    reg.fit(X.numpy(), y.numpy())
    if method != "vff-svgp":
        assert reg.model_.n_mean_inducing == 80  # the default 300 capped at the training rows
    mean, std = reg.predict(X.numpy(), return_std=True)
    path = tmp_path / "model.gps"
    reg.save(path)
    torch.testing.assert_close(torch.as_tensor(GPRegressor.load(path).predict(X.numpy())), torch.as_tensor(mean))
    assert (std > 0).all()


@pytest.mark.parametrize("options, message", [
    (dict(n_mean_inducing=-1), "non-negative"),
    (dict(natgrad_step=0.0), "natgrad_step"),
    (dict(kernel="rbf"), "Matérn"),
])
def test_bad_options_get_a_clear_error(options, message):
    with pytest.raises(ValueError, match=message):
        ODVFF(2, **options)


def test_too_many_mean_inducing_points_get_a_clear_error():
    X, y = problem(10, 1)
    with pytest.raises(ValueError, match="exceeds the 10 training rows"):
        ODVFF(1, n_mean_inducing=20).double().initialise_from_data(X, y)
    with pytest.raises(ValueError, match="no mean basis"):
        VFFSVGP(1, n_mean_inducing=3)


def test_additive_kernel_objects_are_accepted():
    model = ODVFF(2, kernel=AdditiveMatern(2, nu=2.5))
    assert model.kernel.nu == 2.5 and model.features.num_inducing == 2 * 33


def test_the_extra_component_joins_the_covariance_basis_block_diagonally():
    # paper App. C: k = k_S + k_NS, beta = [Fourier features of f_S, f_NS at inducing points r]
    X, y = problem(40, 1)
    model = ODVFF(1, n_frequencies=4, n_mean_inducing=5, extra_kernel="periodic", n_extra_inducing=6,
                  lengthscale=0.2, noise=0.05).double()
    model.initialise_from_data(X, y)
    randomise(model)
    Kbb = model.Kuu_operator().to_dense()
    assert Kbb.shape == (9 + 6, 9 + 6) and torch.all(Kbb[:9, 9:] == 0)
    extra = model.extra.kernel
    torch.testing.assert_close(Kbb[9:, 9:], extra(model.extra.Z, model.extra.Z) + 1e-4 * torch.eye(6, dtype=F64))
    torch.testing.assert_close(model.features.Kuf(X)[9:], extra(model.extra.Z, X))
    with torch.no_grad():
        expected, mean, var = dense_elbo(model, X, y)
        torch.testing.assert_close(model.elbo(X, y, 40), expected, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(model.kernel(X, X), model.fourier.kernel(X, X) + extra(X, X))


@pytest.mark.parametrize("options, message", [
    (dict(n_extra_inducing=3), "needs an extra_kernel"),
    (dict(extra_kernel="periodic"), "n_extra_inducing >= 1"),
    (dict(extra_kernel="linear", n_extra_inducing=3), "Unknown extra_kernel"),
])
def test_bad_extra_component_options(options, message):
    with pytest.raises(ValueError, match=message):
        ODVFF(1, **options)


def test_12_the_minibatch_elbo_averaged_over_a_partition_is_the_full_elbo():
    X, y = problem(60, 2)
    model = odvff(X, y, F=3, n_mean=6)
    randomise(model)
    with torch.no_grad():
        full = model.elbo(X, y, 60)
        batches = [model.elbo(X[idx], y[idx], 60) for idx in torch.arange(60).split(15)]
    torch.testing.assert_close(sum(batches) / len(batches), full, rtol=1e-12, atol=1e-10)


def test_15_one_natural_gradient_step_on_inducing_points_reaches_the_sgpr_bound():
    from gpscale.models.linear.sgpr import SGPR

    X, y = problem(50, 2)
    decoupled = ODVGP(2, n_inducing=12, n_mean_inducing=0, lengthscale=0.4, noise=0.05, jitter=1e-6,
                      natgrad_step=1.0).double()
    decoupled.initialise_from_data(X, y)
    sgpr = SGPR(2, n_inducing=12, lengthscale=0.4, noise=0.05, jitter=1e-6).double()
    with torch.no_grad():
        sgpr.features.Z.copy_(decoupled.features.Z)
    decoupled.natural_gradient_step(X, y, 50)
    with torch.no_grad():
        torch.testing.assert_close(decoupled.elbo(X, y, 50), sgpr.elbo(X, y), rtol=1e-9, atol=1e-8)


def test_a_natural_gradient_step_that_cannot_keep_s_positive_definite_is_skipped_with_a_warning(monkeypatch):
    X, y = problem(30, 1)
    model = odvff(X, y, n_mean=3)
    before = (model.q_mu.detach().clone(), model.q_sqrt.detach().clone())

    def never(*args, **kwargs):
        raise gpscale_linalg.NotPSDError("not positive definite")

    monkeypatch.setattr(gpscale_gaussian_q, "inverse_cholesky", never)
    with pytest.warns(NumericalWarning, match="natgrad_step"):
        model.natural_gradient_step(X, y, 30)
    torch.testing.assert_close(model.q_mu.detach(), before[0])
    torch.testing.assert_close(model.q_sqrt.detach(), before[1])

"""SoftKI against dense references: the verification list of shared/specs/softki.md §11 (items numbered there)."""
import math
import warnings
from unittest.mock import patch

import numpy as np
import pytest
import torch
from scipy.stats import multivariate_normal

from gpscale import GPRegressor
from gpscale.kernels import GPyTorchKernel
from gpscale.models.linear import softki as softki_module
from gpscale.models.exact.gp import ExactGP
from gpscale.models.linear.softki import SoftKI, batch_covariance_solve, hutchinson_pseudo_log_likelihood, softmax_weights
from gpscale.train import fit

F64 = torch.float64


pytestmark = pytest.mark.usefixtures("one_thread")


def make_data(n=60, d=3, seed=1, noise=0.1, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=dtype) * 4 - 2
    return X, torch.sin(X.sum(1)) + noise * torch.randn(n, generator=g, dtype=dtype)


def build(Z, lengthscale=0.9, outputscale=1.3, noise=1e-2, **options):
    """The paper's model (no calibration after training, unless ``options`` ask for it), at given parameters."""
    options.setdefault("calibrate_noise", None)
    model = SoftKI(Z.shape[1], n_inducing=Z.shape[0], lengthscale=lengthscale, outputscale=outputscale,
                   noise=noise, **options).to(Z.dtype)
    with torch.no_grad():
        model.Z.copy_(Z)
    return model


@pytest.fixture
def setting():
    """n = 60, m = 12, d = 3, Z near data points, a few test points."""
    X, y = make_data()
    g = torch.Generator().manual_seed(2)
    Z = X[:12] + 0.3 * torch.randn(12, 3, generator=g, dtype=F64)
    Xs = torch.rand(9, 3, generator=g, dtype=F64) * 4 - 2
    return X, y, Z, Xs


def Qtilde(model, X1, X2):
    """Dense Q~ = W1 K_zz W2^T."""
    return model.weights(X1) @ model.Kzz() @ model.weights(X2).T


def covariance(model, X):
    """Dense Sigma = W K_zz W^T + beta^2 I [n, n], differentiable."""
    return Qtilde(model, X, X) + model.noise * torch.eye(len(X), dtype=X.dtype)


def pseudo(model, X, y, probes):
    return hutchinson_pseudo_log_likelihood(model.weights(X), model.Kzz(), model.noise, y, probes)


def hand_weights(X, Z):
    D = ((X[:, None, :] - Z[None, :, :]) ** 2).sum(-1).sqrt()
    E = torch.exp(-D)
    return E / E.sum(1, keepdim=True)


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


# --- interpolation (items 1-5) ----------------------------------------------------------------------------
def test_1_weights_are_a_stochastic_matrix(setting):
    X, _, Z, _ = setting
    W = softmax_weights(X, Z)
    assert W.shape == (60, 12)
    assert (W >= 0).all()
    assert (W.sum(1) - 1).abs().max() < 1e-12


def test_2_the_nearest_point_gets_the_largest_weight(setting):
    X, _, Z, _ = setting
    assert torch.equal(softmax_weights(X, Z).argmax(1), torch.cdist(X, Z).argmin(1))


def test_3_permutation_and_translation_equivariance(setting):
    X, _, Z, _ = setting
    W = softmax_weights(X, Z)
    perm = torch.randperm(12)
    torch.testing.assert_close(softmax_weights(X, Z[perm]), W[:, perm], rtol=0, atol=1e-12)
    shift = torch.tensor([3.0, -1.5, 0.7], dtype=F64)
    torch.testing.assert_close(softmax_weights(X + shift, Z + shift), W, rtol=0, atol=1e-12)


def test_4_weights_equal_the_handwritten_formula(setting):
    X, _, Z, _ = setting
    torch.testing.assert_close(softmax_weights(X, Z), hand_weights(X, Z), rtol=0, atol=1e-12)
    # the optional temperature divides x only: ||x / T - z||
    model = build(Z, learn_temperature=True)
    with torch.no_grad():
        model.raw_temperature.copy_(torch.tensor([0.3, 1.0, 2.0], dtype=F64))
    T = model.temperature
    assert (T >= softki_module.MIN_TEMPERATURE).all()
    torch.testing.assert_close(model.weights(X), hand_weights(X / T, Z), rtol=0, atol=1e-12)
    default = build(Z)
    assert default.temperature is None  # the paper's weights have no temperature
    torch.testing.assert_close(default.weights(X), hand_weights(X, Z), rtol=0, atol=1e-12)


def test_5_weights_and_gradients_are_finite_at_coincident_and_far_points(setting):
    X, _, Z, _ = setting
    for Xq, Zq in ((X, torch.cat([X[:1], Z[1:]])), (X * 1e3, Z)):  # z_0 = x_0 exactly; distances >= 1e3
        Zp = Zq.clone().requires_grad_(True)
        W = softmax_weights(Xq, Zp)
        (W * torch.randn_like(W)).sum().backward()
        assert torch.isfinite(W).all() and torch.isfinite(Zp.grad).all()
    assert softmax_weights(X, torch.cat([X[:1], Z[1:]]))[0].argmax() == 0


def test_the_weights_closed_form_backward_is_autograds_through_the_expression(setting):
    X, _, Z, _ = setting
    Zq = torch.cat([X[:2], Z[2:]]).requires_grad_(True)  # two centres on data points: the clamp's zero gradient
    Xq = X.clone().requires_grad_(True)
    G = torch.randn(X.shape[0], Z.shape[0], generator=torch.Generator().manual_seed(7), dtype=F64)
    clamped = ((Xq[:, None, :] - Zq[None, :, :]) ** 2).sum(-1).clamp_min(softki_module.MIN_SQ_DIST).sqrt()
    ours = torch.autograd.grad((softmax_weights(Xq, Zq) * G).sum(), [Xq, Zq])
    reference = torch.autograd.grad((torch.softmax(-clamped, -1) * G).sum(), [Xq, Zq])
    for a, b in zip(ours, reference):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert torch.autograd.gradcheck(softmax_weights, (X[2:9].clone().requires_grad_(), Z[2:].clone().requires_grad_()))


# --- kernel (item 6) --------------------------------------------------------------------------------------
def test_6_softki_kernel_is_psd_low_rank_and_bounded(setting):
    X, _, Z, _ = setting
    model = build(Z)
    with torch.no_grad():
        Q = Qtilde(model, X, X)
    torch.testing.assert_close(Q, Q.T, rtol=0, atol=1e-14)
    eig = torch.linalg.eigvalsh(Q)
    assert eig.min() >= -1e-10 * Q.norm()
    assert torch.linalg.matrix_rank(Q, hermitian=True, atol=1e-10 * eig.max().item()) <= 12
    assert (Q.diagonal() <= model.kernel.outputscale + 1e-12).all()


# --- marginal likelihood (item 7) -------------------------------------------------------------------------
@pytest.mark.parametrize("solver", ["qr", "cholesky"])
@pytest.mark.parametrize("noise", [1e-2, 1e-3])
def test_7_log_marginal_likelihood_equals_scipy(setting, solver, noise):
    X, y, Z, _ = setting
    model = build(Z, noise=noise, solver=solver)
    with torch.no_grad():
        Sigma = (Qtilde(model, X, X) + model.noise * torch.eye(60, dtype=F64)).numpy()
        lml = model.log_marginal_likelihood(X, y).item()
    expected = multivariate_normal(np.zeros(60), Sigma).logpdf(y.numpy())
    assert lml == pytest.approx(expected, rel=1e-8)


def test_7_log_marginal_likelihood_is_differentiable(setting):
    X, y, Z, _ = setting
    model = build(Z)
    model.log_marginal_likelihood(X, y).backward()
    dense = build(Z)
    torch.distributions.MultivariateNormal(torch.zeros(60, dtype=F64), covariance(dense, X)).log_prob(y).backward()
    torch.testing.assert_close(model.Z.grad, dense.Z.grad, rtol=1e-7, atol=1e-9)


# --- pseudo-loss (items 8-11) -----------------------------------------------------------------------------
def gradient(model, value):
    params = [model.kernel.raw_lengthscale, model.kernel.raw_outputscale, model.Z, model.likelihood.raw_noise]
    params = [p for p in params if p.requires_grad]  # the noise only with learn_noise=True
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(value, params)])


def exact_gradient(model, X, y):
    Sigma = covariance(model, X)
    return gradient(model, torch.distributions.MultivariateNormal(torch.zeros_like(y), Sigma).log_prob(y))


def test_8_deterministic_gradient_identity(setting):
    """With probes sqrt(B) I, (1/L) sum a a^T = I exactly: the probe term is 1/2 tr(stopgrad(Sigma^-1) Sigma),
    and the gradient must equal that of log N(y | 0, Sigma). Catches the paper's sign, a lost 1/2 and
    undetached solves."""
    X, y, Z, _ = setting
    model = build(Z, learn_noise=True)  # the gradient in beta^2 too
    probes = math.sqrt(60) * torch.eye(60, dtype=F64)
    pseudo_gradient = gradient(model, pseudo(model, X, y, probes))
    exact = exact_gradient(model, X, y)
    assert exact.norm() > 1.0
    assert rel(pseudo_gradient, exact) < 1e-8


@pytest.mark.parametrize("m", [12, 80])  # m < B: the m x m (Woodbury) form; m >= B: Sigma formed and solved
def test_8_the_batch_solve_equals_the_dense_solve_to_round_off(setting, m):
    X, _, _, _ = setting
    g = torch.Generator().manual_seed(4)
    model = build(torch.rand(m, 3, generator=g, dtype=F64) * 4 - 2)
    R = torch.randn(60, 11, generator=g, dtype=F64)
    with torch.no_grad():
        dense = torch.linalg.solve(covariance(model, X), R)
        assert rel(batch_covariance_solve(model.weights(X), model.Kzz(), model.noise, R), dense) < 1e-10
        # in float32 the m x m form keeps its core in float64: nearer the float64 answer than a float32 LU
        low = batch_covariance_solve(model.weights(X).float(), model.Kzz().float(), model.noise.float(), R.float())
        assert rel(low.double(), dense) < 1e-4


def test_9_stochastic_gradient_with_many_probes(setting):
    X, y, Z, _ = setting
    model = build(Z)
    torch.manual_seed(3)
    probes = torch.randn(60, 20000, dtype=F64)
    zero = torch.zeros_like(y)  # b_0 = 0 leaves the trace part alone
    trace_part = gradient(model, pseudo(model, X, zero, probes))
    exact_trace = gradient(model, -0.5 * torch.logdet(covariance(model, X)))
    # (lengthscale, outputscale) each within 3%; the many small Z components are noisier one by one
    assert ((trace_part[:2] - exact_trace[:2]).abs() < 0.03 * exact_trace[:2].abs()).all()
    total = gradient(model, pseudo(model, X, y, probes))
    assert rel(total, exact_gradient(model, X, y)) < 0.01
    # the paper's unit-norm probes shrink the trace term by a factor B: they must fail this check
    unit = probes / probes.norm(dim=0)
    unit_part = gradient(model, pseudo(model, X, zero, unit))
    assert ((unit_part[:2] - exact_trace[:2]).abs() > 0.9 * exact_trace[:2].abs()).all()


def test_10_probes_are_fresh_standard_normal_and_solves_detached(setting):
    X, y, Z, _ = setting
    model = build(Z)
    seen, solved = [], []
    original_solve = softki_module.batch_covariance_solve

    def spy_pseudo(W, Kzz, noise, yb, probes):
        seen.append(probes)
        return hutchinson_pseudo_log_likelihood(W, Kzz, noise, yb, probes)

    def spy_solve(*args, **kwargs):
        out = original_solve(*args, **kwargs)
        solved.append(out.requires_grad)
        return out

    with patch.object(softki_module, "hutchinson_pseudo_log_likelihood", spy_pseudo), \
            patch.object(softki_module, "batch_covariance_solve", spy_solve):
        for _ in range(200):
            model.loss(X, y, num_data=60)
    assert all(p.shape == (60, 10) for p in seen)  # L = 10 by default
    assert not torch.equal(seen[0], seen[1])  # fresh every step
    mean_sq_norm = torch.stack([(p**2).sum(0) for p in seen]).mean().item()
    assert abs(mean_sq_norm / 60 - 1) < 0.05  # E||a||^2 = B: N(0, I), not unit norm
    assert solved and not any(solved)


def test_11_pseudo_gradient_points_along_the_exact_gradient(setting):
    X, y, Z, _ = setting
    model = build(Z)
    exact = exact_gradient(model, X, y)
    torch.manual_seed(4)

    def undetached(model, X, yb, probes):  # the mistake of spec §10.2: gradients through Sigma^{-1}
        Sigma = covariance(model, X)
        solves = torch.linalg.solve(Sigma, torch.cat([yb.unsqueeze(-1), probes], 1))
        b0, Bp = solves[:, :1], solves[:, 1:]
        return 0.5 * (b0 * (Sigma @ b0)).sum() - (Bp * (Sigma @ probes)).sum() / (2 * probes.shape[1])

    def mean_gradient(pseudo_fn):
        draws = [gradient(model, pseudo_fn(model, X, y, torch.randn(60, 10, dtype=F64))) for _ in range(200)]
        return torch.stack(draws).mean(0)

    cosine = torch.nn.functional.cosine_similarity
    assert cosine(mean_gradient(pseudo), exact, dim=0) > 0.99
    assert cosine(mean_gradient(undetached), exact, dim=0) < -0.9  # the check discriminates
    # and the training loss is the negated pseudo-log-likelihood per point: descent on it ascends log p
    loss_grad = torch.stack([gradient(model, model.loss(X, y, num_data=10**6)) for _ in range(200)]).mean(0)
    assert cosine(-loss_grad, exact, dim=0) > 0.99


# --- solvers (items 12-15) --------------------------------------------------------------------------------
def direct_alpha(model, X, y):
    """alpha = C^{-1} K^_zx y / beta^2, C^ = K_zz + K^_zx K^_xz / beta^2, by LU (the normal equations)."""
    K, W, s2 = model.Kzz(), model.weights(X), model.noise
    Khat = W @ K
    return torch.linalg.solve(K + Khat.T @ Khat / s2, Khat.T @ y / s2)


def alpha_of(model):
    """alpha from the fitted cache: v = K_zz alpha = L_zz E[w], so alpha = L_zz^{-T} E[w]."""
    L = model.cache["Lzz"]
    return torch.linalg.solve_triangular(L.T, model.cache["w_mean"].unsqueeze(-1), upper=True).squeeze(-1)


def test_12_qr_equals_direct_solve_when_well_conditioned(setting):
    X, y, Z, _ = setting
    model = build(Z)
    with torch.no_grad():
        model.fit_posterior(X, y)
        torch.testing.assert_close(alpha_of(model), direct_alpha(model, X, y), rtol=1e-8, atol=1e-10)


def ill_conditioned(dtype, lengthscale):
    g = torch.Generator().manual_seed(0)
    X = torch.rand(2000, 4, generator=g, dtype=F64) * 4 - 2
    y = torch.sin(X.sum(1)) + 0.05 * torch.randn(2000, generator=g, dtype=F64)
    Z = X[:128] + 1e-3 * torch.randn(128, 4, generator=g, dtype=F64)
    model64 = build(Z, lengthscale=lengthscale, outputscale=SoftKI(4).kernel.outputscale.item(), noise=1e-3)
    with torch.no_grad():
        Q = Qtilde(model64, X, X)
        reference = Q @ torch.linalg.solve(Q + model64.noise * torch.eye(2000, dtype=F64), y)
    model = model64.to(dtype)
    return model, X.to(dtype), y.to(dtype), reference


@pytest.mark.parametrize("solver", ["qr", "cholesky"])
@pytest.mark.parametrize("dtype, lengthscale", [(torch.float64, 3.0), (torch.float32, 1.0)])
def test_13_qr_beats_the_normal_equations_when_ill_conditioned(dtype, lengthscale, solver):
    """Both of our solvers whiten by L_zz (features W L_zz, prior I): neither forms C^, whose condition number
    is that of the stacked matrix squared and amplified by an ill-conditioned K_zz."""
    model, X, y, reference = ill_conditioned(dtype, lengthscale)
    model.solver = solver
    with torch.no_grad():
        model.fit_posterior(X, y)
        qr_mean = model.predict(X)[0].to(F64)
        lu_mean = (model.weights(X) @ model.Kzz() @ direct_alpha(model, X, y)).to(F64)
    err_qr = (qr_mean - reference).pow(2).mean().sqrt().item()
    err_lu = (lu_mean - reference).pow(2).mean().sqrt().item()
    if dtype == torch.float64:
        assert err_qr * 100 < err_lu
    else:
        assert err_qr < 1e-4 < 1e-3 < err_lu


def test_14_stacked_matrix_uses_the_upper_factor(setting):
    X, _, Z, _ = setting
    model = build(Z, noise=1e-3)
    with torch.no_grad():
        L, K, W, s2 = model.feature_state()["Lzz"], model.Kzz(), model.weights(X), model.noise
        Khat = W @ K
        C = K + Khat.T @ Khat / s2
        for factor, ok in ((L.T, True), (L, False)):  # U = L^T has U^T U = K_zz; the paper's U U^T does not
            A = torch.cat([Khat / s2.sqrt(), factor])
            assert ((A.T @ A - C).norm() < 1e-10 * C.norm()) == ok
        # the model's features are the rows of [Phi / beta; I] L_zz^T = A: Phi Phi^T = Q~
        Phi = model.feature_map({"Lzz": L})(X)
        torch.testing.assert_close(Phi @ Phi.T, Qtilde(model, X, X), rtol=0, atol=1e-12)


@pytest.mark.parametrize("solver", ["qr", "cholesky"])
def test_15_chunked_fit_equals_one_shot_fit(setting, solver):
    X, y, Z, Xs = setting
    one_shot, chunked = build(Z, solver=solver), build(Z, solver=solver, chunk_size=7)
    one_shot.chunk_size = 10**6
    for model in (one_shot, chunked):
        model.fit_posterior(X, y)
    for key in ("w_mean", "L_B"):
        torch.testing.assert_close(chunked.cache[key], one_shot.cache[key], rtol=0, atol=1e-10)
    for a, b in zip(chunked.predict(Xs), one_shot.predict(Xs)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


# --- posterior (items 16-19) ------------------------------------------------------------------------------
def dense_posterior(model, X, y, Xs):
    with torch.no_grad():
        Sigma = Qtilde(model, X, X) + model.noise * torch.eye(len(X), dtype=F64)
        Qsx = Qtilde(model, Xs, X)
        mean = Qsx @ torch.linalg.solve(Sigma, y)
        var = Qtilde(model, Xs, Xs).diagonal() - (Qsx * torch.linalg.solve(Sigma, Qsx.T).T).sum(1)
    return mean, var


@pytest.mark.parametrize("solver", ["qr", "cholesky"])
def test_16_17_mean_and_variance_equal_the_dense_formulas(setting, solver):
    X, y, Z, Xs = setting
    model = build(Z, solver=solver)
    model.fit_posterior(X, y)
    mean, var = model.predict(Xs)
    dense_mean, dense_var = dense_posterior(model, X, y, Xs)
    torch.testing.assert_close(mean, dense_mean, rtol=0, atol=1e-9)
    torch.testing.assert_close(var, dense_var, rtol=0, atol=1e-10)
    with torch.no_grad():
        prior_var = Qtilde(model, Xs, Xs).diagonal()
    assert (var >= 0).all() and (var <= prior_var + 1e-12).all()
    _, var_y = model.likelihood.predictive(mean, var)
    torch.testing.assert_close(var_y, var + model.noise)


def test_18_lemma_a2_holds_and_the_printed_eq_24_does_not(setting):
    X, y, Z, Xs = setting
    model = build(Z)
    model.fit_posterior(X, y)
    _, var = model.predict(Xs)
    with torch.no_grad():
        K, s2 = model.Kzz(), model.noise
        Khat, Khat_s = model.weights(X) @ K, model.weights(Xs) @ K
        C = K + Khat.T @ Khat / s2
        Qxx, Qsx, Qss = Qtilde(model, X, X), Qtilde(model, Xs, X), Qtilde(model, Xs, Xs)
        eye = torch.eye(60, dtype=F64)
        lemma_lhs = Khat_s @ torch.linalg.solve(C, Khat.T) / s2
        lemma_rhs = Qsx @ torch.linalg.inv(Qxx + s2 * eye)
        torch.testing.assert_close(lemma_lhs, lemma_rhs, rtol=1e-8, atol=1e-10)
        printed = eye / s2 - Khat @ torch.linalg.solve(C, Khat.T) @ Qxx / s2**3  # the extra Q~_xx Lambda^-1
        printed_var = (Qss - Qsx @ printed @ Qsx.T).diagonal()
    assert (printed_var - var).abs().max() > 1.0


def test_19_with_identity_weights_softki_is_the_exact_gp(setting):
    """Z = [X; X*] and one-hot weights (W = I on the stacked points): Q~ is the exact kernel on X and X*."""
    X, y, _, Xs = setting
    X, y, Xs = X[:30], y[:30], Xs[:5]
    hypers = dict(lengthscale=0.5, outputscale=1.3, noise=1e-2)
    model = build(torch.cat([X, Xs]), **hypers)
    exact = ExactGP(3, ard=False, **hypers).double()

    def one_hot(Xq):
        return (Xq[:, None, :] == model.Z[None, :, :]).all(-1).to(Xq.dtype)

    with patch.object(model, "weights", one_hot):
        assert torch.equal(model.weights(X), torch.eye(35, dtype=F64)[:30])
        lml = model.log_marginal_likelihood(X, y)
        model.fit_posterior(X, y)
        mean, var = model.predict(Xs)
    exact.fit_posterior(X, y)
    exact_mean, exact_var = exact.predict(Xs)
    torch.testing.assert_close(mean, exact_mean, rtol=0, atol=1e-8)
    torch.testing.assert_close(var, exact_var, rtol=0, atol=1e-8)
    torch.testing.assert_close(lml, exact.log_marginal_likelihood(X, y).detach(), rtol=1e-8, atol=0)


# --- training (item 20) and memory (item 21, as a chunking guard) -----------------------------------------
def smoke_data():
    g = torch.Generator().manual_seed(0)
    X = torch.rand(3000, 5, generator=g, dtype=F64) * 4 - 2
    y = torch.sin(2 * X[:, 0]) + X[:, 1] ** 2 / 2 + 0.1 * torch.randn(3000, generator=g, dtype=F64)
    y = (y - y.mean()) / y.std()
    X = (X - X.mean(0)) / X.std(0)
    return X[:2700], y[:2700], X[2700:], y[2700:]


def test_20_training_smoke():
    X, y, Xt, yt = smoke_data()
    model = SoftKI(5, n_inducing=64, calibrate_noise=None).double()  # the paper's fixed beta^2 throughout
    model.initialise_from_data(X, y, seed=0)
    model.fit_posterior(X, y)
    rmse_untrained = (model.predict(Xt)[0] - yt).pow(2).mean().sqrt().item()
    Z0, noise0 = model.Z.detach().clone(), model.noise.item()
    assert all(p is not model.likelihood.raw_noise for p in model.parameters())  # beta^2 is not trained
    fit(model, X, y, epochs=10, batch_size=256, lr=0.01, seed=0, progress=False)
    mean, var = model.predict(Xt)
    rmse = (mean - yt).pow(2).mean().sqrt().item()
    assert torch.isfinite(mean).all() and torch.isfinite(var).all()
    assert rmse < 0.45 and rmse < rmse_untrained
    assert (model.Z - Z0).abs().max() > 1e-2
    assert model.noise.item() == noise0 == pytest.approx(1e-3)
    assert model.kernel.lengthscale.numel() == 1  # one shared lengthscale by default


def test_a_singular_kzz_is_never_factored_in_training_and_the_batch_solve_is_still_exact():
    """k-means centres on duplicated rows (keggundirected has many) make K_zz singular at every step; the m x m
    batch solve factors beta^2 I + G K_zz, never K_zz, so a training step takes no jitter and warns nothing."""
    X, y, _, _ = smoke_data()
    X = X[:40].repeat(20, 1)  # 40 distinct rows, 800 in all: 64 centres cannot all be distinct
    y = y[:40].repeat(20)
    model = SoftKI(5, n_inducing=64, calibrate_noise=None).double()
    model.initialise_from_data(X, y, seed=0)
    with torch.no_grad():
        assert torch.linalg.eigvalsh(model.Kzz()).min() < 1e-12  # singular
    factorisations = []
    original = torch.linalg.cholesky_ex

    def counted(M, *args, **kwargs):
        factorisations.append(M.shape[-1])
        return original(M, *args, **kwargs)

    with patch.object(torch.linalg, "cholesky_ex", counted), warnings.catch_warnings():
        warnings.simplefilter("error")
        for step in range(3):
            model.loss(X[256 * step:256 * (step + 1)], y[256 * step:256 * (step + 1)], 800).backward()
    assert factorisations == []
    R = torch.randn(256, 11, dtype=F64)
    with torch.no_grad():
        dense = torch.linalg.solve(covariance(model, X[:256]), R)
        assert rel(batch_covariance_solve(model.weights(X[:256]), model.Kzz(), model.noise, R), dense) < 1e-8


def rows_weighted(model, action):
    """The row counts of every ``model.weights`` call (one per chunk of a data pass) while ``action()`` runs."""
    rows = []
    original = model.weights

    def spy(Xq):
        rows.append(Xq.shape[0])
        return original(Xq)

    with patch.object(model, "weights", spy):
        action()
    return rows


def test_21_every_full_data_pass_is_chunked():
    X, y, _, _ = smoke_data()
    model = SoftKI(5, n_inducing=32, chunk_size=500, calibrate_noise="variance").double()
    model.initialise_from_data(X, y)
    rows = rows_weighted(model, lambda: (model.fit_posterior(X, y), model.log_marginal_likelihood(X, y)))
    assert sum(rows) == 3 * 2700 and max(rows) <= 500  # statistics, the mean's QR fit, evidence: 3 passes


@pytest.mark.parametrize(("solver", "passes"), [("qr", 2), ("cholesky", 1)])
def test_variance_calibration_reads_the_data_once_per_statistic(solver, passes):
    X, y, _, _ = smoke_data()
    model = SoftKI(5, n_inducing=32, chunk_size=500, solver=solver, calibrate_noise="variance").double()
    model.initialise_from_data(X, y)
    rows = rows_weighted(model, lambda: model.fit_posterior(X, y))
    assert sum(rows) == passes * 2700  # the Cholesky solver takes the trained mean from the same statistics


# --- options ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("solver", ["qr", "cholesky"])
def test_calibrated_noise_maximises_the_evidence_and_improves_nlpd(solver):
    X, y, Xt, yt = smoke_data()
    fixed = SoftKI(5, n_inducing=32, solver=solver, calibrate_noise=None).double()
    fixed.initialise_from_data(X, y)
    calibrated = SoftKI(5, n_inducing=32, solver=solver, calibrate_noise="posterior").double()
    calibrated.load_state_dict(fixed.state_dict())
    fixed.fit_posterior(X, y)
    calibrated.fit_posterior(X, y)
    s2 = calibrated.noise.item()
    assert s2 > 10 * 1e-3
    with torch.no_grad():
        best = calibrated.log_marginal_likelihood(X, y).item()
        for factor in (0.97, 1.03, 0.1):
            calibrated.likelihood.raw_noise.fill_(math.log(math.expm1(s2 * factor)))
            assert calibrated.log_marginal_likelihood(X, y).item() < best
        calibrated.likelihood.raw_noise.fill_(math.log(math.expm1(s2)))
        # the posterior is the plain posterior under the calibrated noise, whatever the solver
        reference = SoftKI(5, n_inducing=32, noise=s2).double()
        reference.load_state_dict({k: v for k, v in fixed.state_dict().items() if "noise" not in k}, strict=False)
        reference.fit_posterior(X, y)
        for ours, theirs in zip(calibrated.predict(Xt), reference.predict(Xt)):
            torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-9)

    def nlpd(model):
        return -model.likelihood.log_predictive_density(yt, *model.predict(Xt)).mean().item()

    assert nlpd(calibrated) < nlpd(fixed)
    calibrated.clear_cache()  # the calibrated noise belongs to the posterior; training resumes with 1e-3
    assert calibrated.noise.item() == pytest.approx(1e-3)


def test_variance_calibration_keeps_the_trained_mean_and_takes_the_calibrated_variance():
    X, y, Xt, yt = smoke_data()
    models = {mode: SoftKI(5, n_inducing=32, calibrate_noise=mode).double() for mode in (None, "variance", "posterior")}
    models[None].initialise_from_data(X, y)
    for model in models.values():
        model.load_state_dict(models[None].state_dict())
        model.fit_posterior(X, y)
    (mean0, var0), (mean_v, var_v), (mean_p, var_p) = (m.predict(Xt) for m in models.values())
    torch.testing.assert_close(mean_v, mean0)  # the paper's mean, bit for bit up to the QR's round-off
    torch.testing.assert_close(var_v, var_p)  # the calibrated posterior's variance
    assert models["variance"].noise.item() == pytest.approx(models["posterior"].noise.item())
    assert (mean_p - mean0).abs().max() > 1e-3 and (var_v > var0).all()

    def nlpd(model):
        return -model.likelihood.log_predictive_density(yt, *model.predict(Xt)).mean().item()

    assert nlpd(models["variance"]) < nlpd(models[None])


def test_calibrate_noise_rejects_unknown_modes():
    with pytest.raises(ValueError, match="calibrate_noise must be one of"):
        SoftKI(3, calibrate_noise=True)


def test_learned_noise_and_gpytorch_kernel_options(setting):
    X, y, Z, _ = setting
    learned = build(Z, learn_noise=True)
    assert any(p is learned.likelihood.raw_noise for p in learned.parameters())
    gpytorch = pytest.importorskip("gpytorch")
    inner = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).double()
    inner.outputscale, inner.base_kernel.lengthscale = 1.3, 0.9
    wrapped = SoftKI(3, n_inducing=12, kernel=GPyTorchKernel(inner), noise=1e-2).double()
    with torch.no_grad():
        wrapped.Z.copy_(Z)
        torch.testing.assert_close(wrapped.log_marginal_likelihood(X, y), build(Z).log_marginal_likelihood(X, y))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_regressor_fits_predicts_and_round_trips(tmp_path, dtype):
    X, y, Xt, _ = smoke_data()
    X, y, Xt = X.numpy()[:600] * 3 + 1, y.numpy()[:600] * 2 - 5, Xt.numpy() * 3 + 1
    reg = GPRegressor(method="softki", n_inducing=32, epochs=20, batch_size=128, noise=1e-3, learn_noise=False,
                      calibrate_noise="variance", dtype=dtype, progress=False).fit(X, y)
    mean, std = reg.predict(Xt, return_std=True)
    assert np.isfinite(mean).all() and np.isfinite(std).all() and (std > 0).all()
    assert reg.score(X, y) > 0.2
    reg.save(tmp_path / "softki.gps")
    loaded = GPRegressor.load(tmp_path / "softki.gps")
    mean2, std2 = loaded.predict(Xt, return_std=True)
    np.testing.assert_array_equal(mean, mean2)
    np.testing.assert_array_equal(std, std2)

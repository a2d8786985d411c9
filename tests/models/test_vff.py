"""VFF with the collapsed bound, its features in D dimensions and the separable Matérn kernels (spec odvff.md §10
checks 4, 8 and 13, the collapsed part)."""
import math

import pytest
import torch

from gpscale import GPRegressor
from gpscale.kernels import AdditiveMatern, Matern, ProductMatern
from gpscale.kernels.fourier import vff_Kuf, vff_Kuu
from gpscale.models.exact.gp import ExactGP
from gpscale.models.fourier.vff import VFF, FourierFeatures
from gpscale.train import fit

F64 = torch.float64


def problem(n=200, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=F64)
    y = torch.sin(6 * X[:, 0]) + (0.5 * torch.cos(4 * X[:, 1]) if d > 1 else 0) + 0.1 * torch.randn(
        n, generator=g, dtype=F64)
    return X, y


def test_separable_kernels_are_sums_and_products_of_one_dimensional_materns():
    X1, X2 = problem(7, 3)[0], problem(5, 3, seed=1)[0]
    additive = AdditiveMatern(3, nu=2.5, lengthscale=0.4, outputscale=1.5).double()
    product = ProductMatern(3, nu=0.5, lengthscale=0.3, outputscale=2.0).double()
    one_d = [Matern(1, nu=nu, lengthscale=ls, outputscale=var).double()
             for nu, ls, var in [(2.5, 0.4, 0.5), (0.5, 0.3, 1.0)]]
    expected_sum = sum(one_d[0](X1[:, [d]], X2[:, [d]]) for d in range(3))
    expected_product = 2.0 * math.prod(one_d[1](X1[:, [d]], X2[:, [d]]) for d in range(3))
    torch.testing.assert_close(additive(X1, X2), expected_sum)
    torch.testing.assert_close(product(X1, X2), expected_product)
    torch.testing.assert_close(additive.diag(X1), torch.full((7,), 1.5, dtype=F64))
    torch.testing.assert_close(product.diag(X1), torch.full((7,), 2.0, dtype=F64))


def _separable_by_autograd(kind, nu, X1, X2, lengthscale, scale):
    """The separable kernel as a plain differentiable expression (no custom backward): [D, n1, n2] factors."""
    z = math.sqrt(2 * nu) * ((X1.T[:, :, None] - X2.T[:, None, :]).abs() / lengthscale[:, None, None])
    g = {0.5: 1.0, 1.5: 1.0 + z, 2.5: 1.0 + z + z * z / 3}[nu] * torch.exp(-z)
    return (scale[:, None, None] * g).sum(0) if kind == "additive" else scale * g.prod(0)


@pytest.mark.parametrize("nu", [0.5, 1.5, 2.5])
@pytest.mark.parametrize("kind", ["additive", "product"])
def test_separable_closed_form_backward_equals_autograd_of_the_formula(kind, nu):
    X1, X2 = problem(7, 3)[0], problem(5, 3, seed=1)[0]
    X2[1, 0] = X1[2, 0]  # a coordinate shared by two points: u = 0 in one dimension, where |u| has its kink
    X1, X2 = X1.requires_grad_(), X2.requires_grad_()
    cls = AdditiveMatern if kind == "additive" else ProductMatern
    k = cls(3, nu=nu, lengthscale=0.4, outputscale=1.5).double()
    with torch.no_grad():
        k.raw_lengthscale.add_(torch.tensor([0.0, 0.3, -0.2], dtype=F64))
    scale_param = k.raw_variance if kind == "additive" else k.raw_outputscale
    params = [X1, X2, k.raw_lengthscale, scale_param]
    weights = torch.randn(7, 5, dtype=F64, generator=torch.Generator().manual_seed(3))
    ours = torch.autograd.grad((k(X1, X2) * weights).sum(), params)
    softplus = torch.nn.functional.softplus
    reference_K = _separable_by_autograd(kind, nu, X1, X2, softplus(k.raw_lengthscale), softplus(scale_param))
    torch.testing.assert_close(k(X1, X2), reference_K)
    reference = torch.autograd.grad((reference_K * weights).sum(), params)
    for a, b in zip(ours, reference):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_separable_factors_are_laid_out_one_dimension_after_another():
    """The [D, n1, n2] differences and everything formed from them are contiguous, so that the passes over them
    (sums over rows and columns, the weighted sum over D) read memory in order; from the inputs' transposes as
    strided views torch had laid them out [n1, n2, D]."""
    from gpscale.kernels.separable import _differences
    X1, X2 = problem(7, 3)[0], problem(5, 3, seed=1)[0]
    assert all(t.shape == (3, 7, 5) and t.is_contiguous() for t in _differences(X1, X2))
    assert ProductMatern(3).double().factors(X1, X2).is_contiguous()


@pytest.mark.parametrize("needed", ["X1", "X2", "variance", "none"])
def test_additive_kernel_gradient_of_only_some_inputs(needed):
    """The additive kernel's backward when only one of its inputs is differentiated (gamma fixed, frozen
    variances): that gradient still equals autograd's of the formula."""
    X1, X2 = problem(6, 3)[0], problem(4, 3, seed=1)[0]
    k = AdditiveMatern(3, nu=1.5, lengthscale=0.4, outputscale=1.5).double()
    k.raw_lengthscale.requires_grad_(False)
    k.raw_variance.requires_grad_(needed == "variance")
    X1.requires_grad_(needed == "X1")
    X2.requires_grad_(needed == "X2")
    weights = torch.randn(6, 4, dtype=F64, generator=torch.Generator().manual_seed(3))
    K = k(X1, X2)
    softplus = torch.nn.functional.softplus
    reference_K = _separable_by_autograd("additive", 1.5, X1, X2, softplus(k.raw_lengthscale),
                                         softplus(k.raw_variance))
    torch.testing.assert_close(K, reference_K)
    if needed == "none":
        assert not K.requires_grad
        return
    wrt = {"X1": X1, "X2": X2, "variance": k.raw_variance}[needed]
    ours, = torch.autograd.grad((K * weights).sum(), wrt)
    reference, = torch.autograd.grad((reference_K * weights).sum(), wrt)
    torch.testing.assert_close(ours, reference, rtol=1e-9, atol=1e-11)


def additive_features(D, F, lengthscale=0.1, variance=1.0, nu=1.5):
    kernel = AdditiveMatern(D, nu=nu, lengthscale=lengthscale, outputscale=variance * D).double()
    features = FourierFeatures(kernel, F).double()
    features.set_box(torch.full((D,), -0.5, dtype=F64), torch.full((D,), 1.5, dtype=F64))
    return kernel, features


def test_13_additive_features_in_one_dimension_equal_the_one_dimensional_ones():
    kernel, features = additive_features(1, 7)
    x = torch.rand(9, 1, dtype=F64)
    ls, var = kernel.lengthscale[0], kernel.variance[0]  # 0.1 and 1, as stored
    torch.testing.assert_close(features.Kuu(), vff_Kuu(1.5, -0.5, 1.5, 7, ls, var).to_dense())
    torch.testing.assert_close(features.Kuf(x), vff_Kuf(1.5, x[:, 0], -0.5, 1.5, 7, ls))


def test_13_additive_kuu_is_block_diagonal_and_reconstructs_the_kernel():
    X = problem(40, 2)[0]
    errors = []
    for F in (10, 30, 60):
        kernel, features = additive_features(2, F)
        Kuu = features.Kuu()
        M = 2 * F + 1
        assert features.num_inducing == 2 * M and torch.all(Kuu[:M, M:] == 0)
        Kuf = features.Kuf(X)
        Q = Kuf.T @ torch.linalg.solve(Kuu, Kuf)
        torch.testing.assert_close(Q, Kuf.T @ features.Kuu_operator().solve(Kuf))  # structured = dense
        errors.append((kernel(X, X) - Q).abs().max().item())
    assert errors == sorted(errors, reverse=True) and errors[-1] < 2e-3


def test_13_product_features_are_the_kronecker_of_the_one_dimensional_ones():
    kernel = ProductMatern(2, nu=1.5, lengthscale=0.1, outputscale=1.3).double()
    features = FourierFeatures(kernel, 6).double()
    features.set_box(torch.tensor([-0.5, -0.4], dtype=F64), torch.tensor([1.5, 1.6], dtype=F64))
    ls = kernel.lengthscale
    K1 = vff_Kuu(1.5, -0.5, 1.5, 6, ls[0], kernel.outputscale).to_dense()
    K2 = vff_Kuu(1.5, -0.4, 1.6, 6, ls[1], torch.tensor(1.0, dtype=F64)).to_dense()
    torch.testing.assert_close(features.Kuu(), torch.kron(K1, K2))
    x = torch.tensor([[0.2, 0.7]], dtype=F64)
    phi1, phi2 = vff_Kuf(1.5, x[:, 0], -0.5, 1.5, 6, ls[0]), vff_Kuf(1.5, x[:, 1], -0.4, 1.6, 6, ls[1])
    torch.testing.assert_close(features.Kuf(x)[:, 0], torch.kron(phi1[:, 0], phi2[:, 0]))


def dense_titsias_bound(K, Kuf, Kuu, y, noise):
    Q = Kuf.T @ torch.linalg.solve(Kuu, Kuf)
    n = y.shape[0]
    fit = torch.distributions.MultivariateNormal(torch.zeros(n, dtype=F64), Q + noise * torch.eye(n, dtype=F64))
    return fit.log_prob(y) - torch.trace(K - Q) / (2 * noise)


@pytest.mark.parametrize("structure", ["additive", "product"])
def test_8_the_collapsed_bound_equals_the_dense_titsias_bound(structure):
    X, y = problem(60, 2)
    model = VFF(2, n_frequencies=5, structure=structure, lengthscale=0.3, noise=0.05, chunk_size=17).double()
    model.initialise_from_data(X, y)
    with torch.no_grad():
        ours = model.elbo(X, y)
        expected = dense_titsias_bound(model.kernel(X, X), model.features.Kuf(X), model.features.Kuu(), y, model.noise)
    torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-10)


def test_10_the_bound_grows_with_the_frequencies_and_stays_below_the_evidence():
    X, y = problem(80, 1)
    exact = ExactGP(1, kernel=AdditiveMatern(1, nu=1.5, lengthscale=0.2, outputscale=1.0), noise=0.05).double()
    bounds = []
    for F in (3, 10, 40):
        model = VFF(1, n_frequencies=F, kernel=AdditiveMatern(1, nu=1.5, lengthscale=0.2, outputscale=1.0),
                    noise=0.05).double()
        model.initialise_from_data(X, y)
        with torch.no_grad():
            bounds.append(model.elbo(X, y).item())
    with torch.no_grad():
        evidence = exact.log_marginal_likelihood(X, y).item()
    assert bounds == sorted(bounds) and bounds[-1] <= evidence + 1e-9
    assert evidence - bounds[-1] < 0.05 * abs(evidence)


def test_vff_predicts_like_the_exact_gp_of_its_kernel_when_f_is_large():
    X, y = problem(150, 2)
    kernel = AdditiveMatern(2, nu=1.5, lengthscale=0.3, outputscale=1.0).double()
    model = VFF(2, n_frequencies=60, kernel=kernel, noise=0.02).double()
    model.initialise_from_data(X, y)
    model.fit_posterior(X, y)
    exact = ExactGP(2, kernel=kernel, noise=0.02).double()
    exact.fit_posterior(X, y)
    Xt = problem(50, 2, seed=3)[0]
    (m, v), (me, ve) = model.predict(Xt), exact.predict(Xt)
    torch.testing.assert_close(m, me, rtol=0, atol=2e-3)
    torch.testing.assert_close(v, ve, rtol=0, atol=2e-3)


def test_training_fits_and_warns_when_the_margin_is_too_small():
    X, y = problem(200, 2)
    model = VFF(2, n_frequencies=30, margin=1.0).double()
    fit(model, X, y, epochs=80, lr=0.05, progress=False)
    mean, _ = model.predict(X)
    assert ((mean - y) ** 2).mean().sqrt() < 0.15  # noise std 0.1
    narrow = VFF(2, n_frequencies=30, margin=0.05).double()
    with pytest.warns(UserWarning, match="larger margin"):
        fit(narrow, X, y, epochs=2, lr=0.05, progress=False)


@pytest.mark.parametrize("options, message", [
    (dict(kernel="rbf"), "need a Matérn kernel"),
    (dict(structure="product"), "not usable for D = 4"),
    (dict(structure="tensor"), "structure must be"),
    (dict(margin=0.0), "margin .* must be a number > 0"),
    (dict(n_frequencies=0), "n_frequencies .* must be an integer >= 1"),
    (dict(kernel=ProductMatern(4)), "needs a AdditiveMatern"),
])
def test_bad_options_get_a_clear_error(options, message):
    with pytest.raises(ValueError, match=message):
        VFF(4, **options)


def test_regressor_fits_predicts_and_round_trips(tmp_path):
    X, y = problem(120, 2)
    reg = GPRegressor(method="vff", n_frequencies=20, epochs=30, lr=0.05, progress=False).fit(X.numpy(), y.numpy())
    assert reg.model_.kernel.nu == 1.5  # the method's default kernel, Matérn-3/2
    mean, std = reg.predict(X.numpy(), return_std=True)
    path = tmp_path / "vff.gps"
    reg.save(path)
    again = GPRegressor.load(path)
    torch.testing.assert_close(torch.as_tensor(again.predict(X.numpy())), torch.as_tensor(mean))
    assert (std > 0).all()

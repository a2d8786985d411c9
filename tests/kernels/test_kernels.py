import math

import numpy as np
import pytest
import torch
from sklearn.gaussian_process.kernels import RBF as SkRBF
from sklearn.gaussian_process.kernels import Matern as SkMatern
from torch.utils._python_dispatch import TorchDispatchMode

from gpscale.kernels import RBF, GPyTorchKernel, Kernel, Matern, Periodic, inverse_softplus, make_kernel
from gpscale.kernels.grid import cross_factors, grid_points, pad_grids
from gpscale.kernels.separable import ProductMatern
from gpscale.kernels.stationary import underflow_cutoff

LS = [0.7, 1.3, 0.4]


def with_params(kernel, lengthscale, outputscale):
    with torch.no_grad():
        kernel.raw_lengthscale.copy_(inverse_softplus(torch.tensor(lengthscale, dtype=torch.float64)))
        kernel.raw_outputscale.copy_(inverse_softplus(torch.tensor(outputscale, dtype=torch.float64)))
    return kernel


@pytest.fixture
def points():
    g = torch.Generator().manual_seed(1)
    return torch.randn(15, 3, generator=g, dtype=torch.float64), torch.randn(9, 3, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("name, reference", [
    ("rbf", SkRBF(length_scale=LS)),
    ("matern12", SkMatern(length_scale=LS, nu=0.5)),
    ("matern32", SkMatern(length_scale=LS, nu=1.5)),
    ("matern52", SkMatern(length_scale=LS, nu=2.5)),
])
def test_kernels_match_scikit_learn(points, name, reference):
    X1, X2 = points
    k = with_params(make_kernel(name, 3).double(), LS, 2.5)
    expected = 2.5 * reference(X1.numpy(), X2.numpy())
    np.testing.assert_allclose(k(X1, X2).detach().numpy(), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kernel", [RBF(3), Matern(3, nu=0.5), Matern(3, nu=2.5), RBF(3, ard=False)])
def test_diag_equals_diagonal_of_full_matrix(points, kernel):
    X, _ = points
    kernel = kernel.double()
    torch.testing.assert_close(kernel.diag(X), kernel(X, X).diagonal())


def test_shared_lengthscale_has_one_parameter_and_equals_ard_with_equal_values(points):
    X1, X2 = points
    shared = with_params(RBF(3, ard=False).double(), [0.8], 1.0)
    ard = with_params(RBF(3).double(), [0.8, 0.8, 0.8], 1.0)
    assert shared.raw_lengthscale.numel() == 1
    torch.testing.assert_close(shared(X1, X2), ard(X1, X2))


def test_matern_gradient_is_finite_at_zero_distance(points):
    X, _ = points
    k = Matern(3, nu=0.5).double()
    k(X, X).sum().backward()
    assert torch.isfinite(k.raw_lengthscale.grad).all()


@pytest.mark.parametrize("name", ["rbf", "matern12", "matern32", "matern52"])
def test_round_off_never_takes_a_kernel_value_above_the_outputscale(name):
    """Far from the origin the Gram expansion ``|a|^2 - 2 a.b + |b|^2`` cancels to round-off, which can leave a
    squared distance below 0: clamped, every value is at most s^2 (the kernel's value at distance 0) and finite,
    where unclamped the RBF's exp(+) passes s^2 and a Matérn's square root of a negative is NaN. At distance 0
    the value is s^2 exactly."""
    g = torch.Generator().manual_seed(3)
    X = 300.0 + 1e-3 * torch.randn(40, 3, generator=g)  # float32, rows nearly equal and far from 0
    k = with_params(make_kernel(name, 3), LS, 2.5)
    with torch.no_grad():
        K, s2 = k(X, X), k.outputscale
    assert torch.isfinite(K).all()
    assert (K <= s2).all()
    with torch.no_grad():  # at distance 0 exactly s^2, as diag gives it (not exp(log s^2), an ulp off)
        for scale in torch.linspace(0.1, 20.0, 25).tolist():  # exp(log s^2) misses about half of them
            k.raw_outputscale.fill_(float(inverse_softplus(torch.tensor(scale))))
            assert (k(torch.zeros(3, 3), torch.zeros(2, 3)) == k.outputscale).all()


def _by_autograd(name, X1, X2, lengthscale, outputscale):
    """The kernel as a plain differentiable expression (no custom backward)."""
    A, B = X1 / lengthscale, X2 / lengthscale
    sq = ((A[:, None, :] - B[None, :, :]) ** 2).sum(-1)
    if name == "rbf":
        return outputscale * torch.exp(-0.5 * sq)
    nu = {"matern12": 0.5, "matern32": 1.5, "matern52": 2.5}[name]
    z = (2 * nu * sq).clamp_min(1e-30).sqrt()
    poly = {0.5: 1.0, 1.5: 1.0 + z, 2.5: 1.0 + z + z * z / 3}[nu]
    return outputscale * poly * torch.exp(-z)


@pytest.mark.parametrize("name", ["rbf", "matern12", "matern32", "matern52"])
def test_the_closed_form_backward_equals_autograd_of_the_formula(points, name):
    X1, X2 = (x.clone().requires_grad_() for x in points)
    k = with_params(make_kernel(name, 3).double(), LS, 2.5)
    weights = torch.randn(15, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    ours = torch.autograd.grad((k(X1, X2) * weights).sum(), [X1, X2, k.raw_lengthscale, k.raw_outputscale])
    ls, scale = torch.nn.functional.softplus(k.raw_lengthscale), torch.nn.functional.softplus(k.raw_outputscale)
    reference = torch.autograd.grad((_by_autograd(name, X1, X2, ls, scale) * weights).sum(),
                                    [X1, X2, k.raw_lengthscale, k.raw_outputscale])
    for a, b in zip(ours, reference):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    if name != "matern12":  # exp(-r) has a kink at r = 0; the others are smooth there, with a finite slope
        X = points[0][:6].clone().requires_grad_()  # rows that coincide with X2's
        torch.autograd.gradcheck(lambda x: k(x, points[0][:4].clone()), (X,))


class _SlowNumbers(TorchDispatchMode):
    """Records every operator that returns a subnormal number, and every exponential of an argument whose result
    leaves the normal range (log(tiny) and below): the operations that run at a tenth of their speed or less on
    x86 processors (see ``underflow_cutoff``)."""

    def __init__(self):
        super().__init__()
        self.slow = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.exp, torch.ops.aten.exp_):
            x = args[0]
            if (x < math.log(torch.finfo(x.dtype).tiny)).any():
                self.slow.append(f"{func} of {x.min().item():.4g}")
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
                if ((t != 0) & (t.abs() < torch.finfo(t.dtype).tiny)).any():
                    self.slow.append(f"{func} returned a subnormal")
        return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ["rbf", "matern12", "matern32", "matern52"])
def test_far_apart_points_take_no_slow_numbers_and_their_covariance_is_held_near_zero(name, dtype):
    """Points hundreds of lengthscales apart: the kernel matrix and its gradient are formed without a subnormal
    number or an exponential below the normal range, the far entries are held at the kernel's value where its
    exponential is tiny^(1/3) (s^2 tiny^(1/3) times the Matérn polynomial there: not 0, not subnormal), the near
    ones are the formula's, and the gradients are finite."""
    g = torch.Generator().manual_seed(0)
    spread = 2e4 if dtype == torch.float64 else 300.0  # past exp's range for every kernel in each dtype
    # five rows near the origin with a neighbour each in X2 (near it, so the Gram expansion's round-off is small)
    X1 = (torch.randn(40, 3, generator=g, dtype=torch.float64) * torch.tensor([0.3] * 5 + [spread] * 35)[:, None])
    X2 = torch.cat([X1[:5] + 0.1, spread * torch.randn(35, 3, generator=g, dtype=torch.float64)]).to(dtype)
    X1 = X1.to(dtype)
    k = with_params(make_kernel(name, 3), LS, 2.5).to(dtype)
    X1.requires_grad_(True)
    with _SlowNumbers() as mode:
        K = k(X1, X2)
        grads = torch.autograd.grad((K * torch.linspace(0.5, 1.5, K.numel(), dtype=dtype).view_as(K)).sum(),
                                    [X1, k.raw_lengthscale, k.raw_outputscale])
    assert mode.slow == []
    floor = 2.5 * torch.finfo(dtype).tiny ** (1 / 3)
    reference = _by_autograd(name, X1.detach().double(), X2.double(), k.lengthscale.detach().double(),
                             k.outputscale.detach().double())
    far = reference < floor
    held = K.detach().double()[far]
    # the held value: s^2 tiny^(1/3) times the Matérn polynomial at the held distance (29 in float32, 236 in float64)
    assert far.sum() > 1000 and (held == held[0]).all() and floor * (1 - 1e-5) < held[0] < 1e5 * floor
    torch.testing.assert_close(K.detach().double()[~far], reference[~far], rtol=1e-5 if dtype == torch.float32
                               else 1e-12, atol=0)
    assert all(torch.isfinite(gr).all() for gr in grads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_additive_materns_factors_take_no_slow_numbers_far_apart(dtype):
    """As the stationary kernels: each dimension's difference is held where exp(-|u|) is tiny^(1/3), never
    subnormal; the far points' covariance stays flat there however far they are, and takes nothing from the
    gradient of a near point's."""
    g = torch.Generator().manual_seed(0)
    spread = 2e4 if dtype == torch.float64 else 300.0
    X1, X2 = (spread * torch.randn(n, 3, generator=g, dtype=dtype) for n in (40, 30))
    k = make_kernel("additive_matern32", 3).to(dtype)
    X1.requires_grad_(True)
    with _SlowNumbers() as mode:
        K = k(X1, X2)
        grads = torch.autograd.grad(K.sum(), [X1, *k.parameters()])
    assert mode.slow == [] and all(torch.isfinite(gr).all() for gr in grads)
    near = torch.tensor([[0.5, 0.2, -0.3]], dtype=dtype)
    farther = torch.tensor([[1e2, -1e3, 1e4], [1e5, 1e5, -1e5]], dtype=dtype) * spread / 300
    x = torch.zeros(1, 3, dtype=dtype, requires_grad=True)
    alone = torch.autograd.grad(k(x, near).sum(), x)[0]
    with_far = torch.autograd.grad(k(x, torch.cat([near, farther])).sum(), x)[0]
    torch.testing.assert_close(with_far, alone, rtol=1e-6, atol=0)
    held = k(x, farther).detach()
    assert held[0, 0] == held[0, 1] and 0 < held[0, 0] < 1e-9


@pytest.mark.parametrize("D", [3, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_product_materns_product_of_many_held_factors_takes_no_slow_numbers(dtype, D):
    """Three held factors multiply to about tiny, five to tiny^(5/3), below the normal range (times an outputscale
    below 1, three do too): the product is held at tiny^(1/3) step by step, flat there (no gradient), and near
    points keep the product of their factors."""
    g = torch.Generator().manual_seed(0)
    spread = 2e4 if dtype == torch.float64 else 300.0
    X1, X2 = (spread * torch.randn(n, D, generator=g, dtype=dtype) for n in (40, 30))
    k = ProductMatern(D, nu=1.5, outputscale=0.5).to(dtype)
    X1.requires_grad_(True)
    with _SlowNumbers() as mode:
        K = k(X1, X2)
        grads = torch.autograd.grad(K.sum(), [X1, k.raw_lengthscale])
    assert mode.slow == [] and all((gr == 0).all() for gr in grads)
    assert (K.detach() == k.outputscale.detach() * math.exp(underflow_cutoff(dtype))).all()
    near = torch.randn(6, D, generator=g, dtype=dtype) * 0.3
    torch.testing.assert_close(k(near, near), k.outputscale * k.factors(near, near).prod(0))


def test_the_periodic_kernel_with_a_short_lengthscale_takes_no_slow_numbers():
    X = torch.rand(50, 26, generator=torch.Generator().manual_seed(0))
    k = Periodic(26, lengthscale=0.1)
    with _SlowNumbers() as mode:
        K = k(X, X)
    assert mode.slow == [] and torch.equal(K.diagonal(), k.diag(X)) and K.detach().min() > 0


def test_gp_griefs_cross_factors_take_no_slow_numbers_and_hold_far_entries_flat():
    """GP-GRIEF's [d, n, M] one-dimensional cross factors at a lengthscale short against the grid: no subnormal
    number, no exponential below the normal range, far entries held at tiny^(1/3) with no gradient, near ones the
    formula's."""
    X = torch.linspace(-1, 1, 50, dtype=torch.float64).unsqueeze(-1).expand(50, 2).clone()
    grid, sizes = pad_grids(grid_points(X, 10))
    ls = torch.tensor([0.02], dtype=torch.float64, requires_grad=True)
    with _SlowNumbers() as mode:
        K = cross_factors(X, grid, sizes, ls, torch.tensor(1.0, dtype=torch.float64))
        (grad,) = torch.autograd.grad(K.sum(), [ls], retain_graph=True)
    assert mode.slow == [] and torch.isfinite(grad)
    exact = torch.exp(-0.5 * ((X[:, 0, None] - grid[0]) / 0.02) ** 2)
    held = exact < math.exp(underflow_cutoff(torch.float64))
    assert held.any() and (~held).any()
    torch.testing.assert_close(K[0][~held], exact[~held].detach())
    assert (K[0][held] == math.exp(underflow_cutoff(torch.float64))).all()
    far = K[0][held].sum()
    assert torch.autograd.grad(far, [ls], allow_unused=True, materialize_grads=True)[0] == 0


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", ["rbf", "matern12", "matern32", "matern52"])
def test_a_gram_matrix_of_points_with_themselves_has_s2_on_its_diagonal_exactly(name, dtype):
    # the expanded |a|^2 - 2 a.b + |b|^2 leaves about eps |a|^2 at a = b, whose root (Matern's distance) moved
    # Matern-1/2's k(a, a) by up to 5e-7 relative in float64 on some CPUs; k(x, x) = s^2 is what diag() and the
    # posterior assume
    X = 3 * torch.randn(200, 3, generator=torch.Generator().manual_seed(0)).to(dtype)
    k = with_params(make_kernel(name, 3), LS, 2.5).to(dtype)
    s2 = k.outputscale.detach().expand(200)
    batch = X.view(4, 50, 3)
    assert torch.equal(k(X, X).diagonal(), s2)
    assert torch.equal(k(batch, batch).diagonal(dim1=-2, dim2=-1), s2.view(4, 50))
    assert torch.equal(k.scaled_sq_dist(X, X).diagonal(), torch.zeros(200, dtype=dtype))
    pick = torch.zeros(5, 5, dtype=dtype)
    pick[2, 2] = 1.0  # each set's value is then k(a_2, a_2) alone
    assert torch.equal(k.weighted_self_grams(X.view(40, 5, 3), pick), s2[:40])


@pytest.mark.parametrize("name", ["rbf", "matern12", "matern32", "matern52"])
def test_weighted_self_grams_equal_one_gram_matrix_per_set_in_value_and_gradient(name):
    """Stationary.weighted_self_grams (the conv kernel's diagonal: sum_pq W_pq k(a_p, a_q) per set, in one batched
    call with its own backward) against the base Kernel's loop of one Gram matrix per set, in value and in the
    gradient of every input: the points, the symmetric weights and the hyperparameters."""
    g = torch.Generator().manual_seed(5)
    A = torch.randn(4, 7, 3, dtype=torch.float64, generator=g, requires_grad=True)
    B = torch.randn(7, 7, dtype=torch.float64, generator=g)
    W = (B + B.T).requires_grad_()
    k = with_params(make_kernel(name, 3).double(), LS, 2.5)
    outer = torch.randn(4, dtype=torch.float64, generator=g)
    wrt = [A, W, k.raw_lengthscale, k.raw_outputscale]
    batched = k.weighted_self_grams(A, W)
    looped = Kernel.weighted_self_grams(k, A, W)
    torch.testing.assert_close(batched, looped, rtol=1e-12, atol=1e-12)
    for a, b in zip(torch.autograd.grad((batched * outer).sum(), wrt),
                    torch.autograd.grad((looped * outer).sum(), wrt)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", ["rbf", "matern12", "matern32", "matern52"])
def test_weighted_grams_equal_a_weighted_sum_of_kernel_matrices_in_value_and_gradient(name, dtype):
    """Stationary.weighted_grams (HVGP's sub-kernels against a batch: sum_s W[t, s] k(a_tsi, b_j), one call with
    its own backward, which never forms dL/dK) against the base Kernel's kernel matrix and weighted sum, in value
    and in the gradient of the points of both arguments and the hyperparameters, with weights of either sign, and
    an incoming gradient that is contiguous or not (read through a transpose); empty sets too."""
    g = torch.Generator().manual_seed(6)
    A = torch.randn(2, 4, 5, 3, generator=g).to(dtype).requires_grad_()  # T = 2 groups of S = 4 sets
    B = torch.randn(7, 3, generator=g).to(dtype).requires_grad_()
    W = torch.randn(2, 4, generator=g).to(dtype)
    k = with_params(make_kernel(name, 3).to(dtype), LS, 2.5)
    outer = torch.randn(2, 5, 7, generator=g).to(dtype)
    across = torch.randn(5, 2, generator=g).to(dtype)
    wrt = [A, B, k.raw_lengthscale, k.raw_outputscale]
    fused = k.weighted_grams(A, B, W)
    summed = Kernel.weighted_grams(k, A, B, W)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fused, summed, **tol)
    torch.testing.assert_close(summed[1], sum(W[1, s] * k(A[1, s], B) for s in range(4)))
    tol = dict(rtol=1e-10, atol=1e-11) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-5)
    for loss in (lambda V: (V * outer).sum(), lambda V: (V.mT @ across).square().sum()):
        for a, b in zip(torch.autograd.grad(loss(fused), wrt, retain_graph=True),
                        torch.autograd.grad(loss(summed), wrt, retain_graph=True)):
            torch.testing.assert_close(a, b, **tol)
    empty = A[:0].detach().requires_grad_()
    (grad_empty,) = torch.autograd.grad(k.weighted_grams(empty, B, W[:0]).sum(), [empty], allow_unused=True,
                                        materialize_grads=True)
    assert grad_empty.shape == empty.shape
    W.requires_grad_()  # a gradient the closed form does not give: the weighted sum's
    (grad_W,) = torch.autograd.grad(k.weighted_grams(A, B, W).sum(), [W])
    torch.testing.assert_close(grad_W[0, 1], k(A[0, 1], B).sum())


def test_hyperparameters_stay_positive_under_any_raw_value():
    k = RBF(2)
    with torch.no_grad():
        k.raw_lengthscale.fill_(-50.0)
    assert (k.lengthscale > 0).all()


def test_unknown_kernel_and_bad_nu_are_rejected():
    with pytest.raises(ValueError, match="matern52"):
        make_kernel("laplace", 2)
    with pytest.raises(ValueError, match="nu"):
        Matern(2, nu=1.0)


def test_gpytorch_adapter_equals_the_wrapped_kernel(points):
    gpytorch = pytest.importorskip("gpytorch")
    X1, X2 = points
    inner = gpytorch.kernels.ScaleKernel(gpytorch.kernels.PeriodicKernel()).double()
    k = GPyTorchKernel(inner)
    torch.testing.assert_close(k(X1, X2), inner(X1, X2).to_dense())
    torch.testing.assert_close(k.diag(X1), inner(X1, X1).to_dense().diagonal())
    assert set(map(id, k.parameters())) == set(map(id, inner.parameters()))


def test_additive_matern_by_name_and_gpytorchs_additive_peer_kernel_agree():
    from gpscale.bench.peers.gpytorch_models import peer_kernel
    from gpscale.kernels import AdditiveMatern

    ours = make_kernel("additive_matern32", 3, lengthscale=0.7, outputscale=1.5).double()
    assert isinstance(ours, AdditiveMatern) and ours.variance.sum().item() == pytest.approx(1.5)
    peer = peer_kernel("additive_matern32", 3).double()
    with torch.no_grad():
        for d, term in enumerate(peer.kernels):
            term.base_kernel.lengthscale = ours.lengthscale[d]
            term.outputscale = ours.variance[d]
    X1 = torch.randn(6, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    X2 = torch.randn(4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(ours(X1, X2), peer(X1, X2).to_dense(), rtol=1e-10, atol=1e-12)


def test_periodic_kernel_repeats_with_its_period_and_sums_add():
    from gpscale.kernels import Periodic, Sum

    k = Periodic(1, period=0.5, lengthscale=0.3, outputscale=2.0).double()
    x = torch.rand(5, 1, dtype=torch.float64)
    period, ls, var = k.period.detach(), k.lengthscale.detach(), k.outputscale.detach()  # 0.5, 0.3, 2 as stored
    torch.testing.assert_close(k(x, x + period), k(x, x))
    torch.testing.assert_close(torch.diagonal(k(x, x)), k.diag(x))
    expected = var * torch.exp(-2 * torch.sin(torch.pi * (x - x.T).abs() / period) ** 2 / ls**2)
    torch.testing.assert_close(k(x, x), expected)
    assert torch.linalg.eigvalsh(k(x, x)).min() > -1e-10
    m = Matern(1, nu=1.5).double()
    torch.testing.assert_close(Sum(k, m)(x, x), k(x, x) + m(x, x))
    torch.testing.assert_close(Sum(k, m).diag(x), k.diag(x) + m.diag(x))


def test_median_distance_is_the_median_pairwise_distance_of_a_seeded_subset():
    from gpscale.kernels import median_distance

    X = torch.tensor([[0.0, 0.0], [3.0, 0.0], [0.0, 4.0]], dtype=torch.float64)
    assert median_distance(X) == 4.0  # distances 3, 4, 5
    Y = torch.randn(50, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    assert median_distance(Y, max_rows=20, seed=1) == median_distance(Y, max_rows=20, seed=1)
    assert median_distance(Y, max_rows=20, seed=1) != median_distance(Y)


def test_median_lengthscale_starts_where_the_kernel_sees_the_data():
    from gpscale.kernels import Sum, median_distance
    from gpscale.models import get_model_class

    SVGP = get_model_class("svgp")
    X = 30 * torch.randn(300, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    model = SVGP(4, n_inducing=8, lengthscale="median").double()
    model.initialise(X, X[:, 0], seed=0)
    torch.testing.assert_close(model.kernel.lengthscale, torch.full((4,), median_distance(X), dtype=torch.float64))
    with pytest.raises(ValueError, match="'median'"):
        SVGP(4, lengthscale="mean")
    with pytest.raises(ValueError, match="has none"):
        SVGP(4, kernel=Sum(RBF(4), RBF(4)), lengthscale="median")

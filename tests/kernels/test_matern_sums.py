"""The additive Matérn's K(X1, X2) v through sorted prefix sums (gpscale.kernels.matern_sums) against the dense
sums it replaces: values, ties, targets far outside the sources, every gradient, and the dense fallback."""
import pytest
import torch

from gpscale.device import deferred_checks
from gpscale.kernels import AdditiveMatern
from gpscale.kernels import matern_sums as sums_module
from gpscale.kernels.matern_sums import HALF_SPAN, matern_sums, too_wide
from gpscale.kernels.separable import _AdditiveMaternMatvec

F64 = torch.float64
NUS = (0.5, 1.5, 2.5)


@pytest.fixture(autouse=True)
def sums_at_every_size(monkeypatch):
    """The kernel takes the sums only from DENSE_BELOW values up; these tests' small sets take them too (an empty set
    still takes the dense product)."""
    monkeypatch.setattr(sums_module, "DENSE_BELOW", 1)


def dense_sums(t, s, v, nu):
    """sum_j g(t - s_j) v_j and sum_j h(t - s_j) v_j [D, n_t] from the [D, n_t, n_s] matrices."""
    u = t.unsqueeze(-1) - s.unsqueeze(-2)
    z = u.abs()
    P = {0.5: torch.ones_like(z), 1.5: 1 + z, 2.5: 1 + z + z * z / 3}[nu]
    Q = {0.5: torch.ones_like(z), 1.5: z, 2.5: z + z * z}[nu]
    e = torch.exp(-z)
    return (P * e) @ v, (torch.sign(u) * Q * e) @ v


def points(D, n, scale, seed):
    return scale * torch.randn(D, n, dtype=F64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("nu", NUS)
def test_sums_equal_the_dense_sums_with_ties_and_targets_outside_the_sources(nu):
    """Targets equal to sources (where h(0) = 0 though the left sums take the source), repeated sources, targets
    left and right of every source; weights of both signs."""
    s, t = points(3, 40, 2.0, 0), points(3, 50, 4.0, 1)
    s[:, 5] = s[:, 6]  # a repeated source
    t[:, :10] = s[:, :10]
    t[:, 10], t[:, 11] = s.amin(-1) - 3.0, s.amax(-1) + 3.0
    v = torch.randn(40, dtype=F64, generator=torch.Generator().manual_seed(2))
    g, h = matern_sums(t, s, v, nu)
    g_ref, h_ref = dense_sums(t, s, v, nu)
    torch.testing.assert_close(g, g_ref, rtol=0, atol=1e-13)
    torch.testing.assert_close(h, h_ref, rtol=0, atol=1e-13)


@pytest.mark.parametrize("nu", NUS)
def test_sums_stay_exact_across_a_span_near_the_limit(nu):
    """Sources spread over most of the 2 HALF_SPAN the moments allow (e^{+-s} near e^{450}), and targets beyond the
    clamp of their factor: every sum finite and equal to the dense one (whose far terms underflow to 0) within the
    binomial expansion's round-off, about |t|^p times the unit round-off (p = nu - 1/2, |t| up to 450 here)."""
    s = torch.linspace(-0.9 * HALF_SPAN, 0.9 * HALF_SPAN, 301, dtype=F64).expand(2, 301).contiguous()
    s = s + 0.3 * torch.rand(2, 301, dtype=F64, generator=torch.Generator().manual_seed(0))
    t = torch.cat([s[:, ::7] + 0.1, torch.tensor([[-3e3, 3e3], [-2e3, 2e3]], dtype=F64)], -1)
    v = torch.randn(301, dtype=F64, generator=torch.Generator().manual_seed(1))
    assert not too_wide(s.T)
    g, h = matern_sums(t, s, v, nu)
    assert torch.isfinite(g).all() and torch.isfinite(h).all()
    g_ref, h_ref = dense_sums(t, s, v, nu)
    tolerance = 50 * torch.finfo(F64).eps * (0.9 * HALF_SPAN) ** (nu - 0.5)
    torch.testing.assert_close(g, g_ref, rtol=0, atol=tolerance)
    torch.testing.assert_close(h, h_ref, rtol=0, atol=tolerance)


@pytest.mark.parametrize("nu", NUS)
def test_matvec_function_passes_gradcheck(nu):
    g = torch.Generator().manual_seed(4)
    A = torch.randn(9, 2, dtype=F64, generator=g).requires_grad_()
    B = torch.randn(7, 2, dtype=F64, generator=g).requires_grad_()
    w = torch.rand(2, dtype=F64, generator=g).requires_grad_()
    v = torch.randn(7, dtype=F64, generator=g).requires_grad_()
    assert torch.autograd.gradcheck(lambda *x: _AdditiveMaternMatvec.apply(*x, nu), (A, B, w, v))


def kernel_problem(nu, lengthscale=0.4, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = AdditiveMatern(3, nu=nu, lengthscale=lengthscale, outputscale=1.5).double()
    with torch.no_grad():
        k.raw_variance.add_(0.3 * torch.randn(3, dtype=F64, generator=g))
    X1, X2 = torch.rand(20, 3, dtype=F64, generator=g), torch.rand(11, 3, dtype=F64, generator=g)
    X1[:4] = X2[:4]  # the KL's K_gamma,gamma a has every target among the sources
    return k, X1, X2, torch.randn(11, dtype=F64, generator=g), torch.randn(20, dtype=F64, generator=g)


@pytest.mark.parametrize("needed", ["all", "X1", "X2", "v", "kernel"])
@pytest.mark.parametrize("nu", NUS)
def test_matvec_and_its_gradients_equal_the_dense_product(nu, needed):
    """K(X1, X2) v and the gradient of G . K v in X1, X2, v and the kernel's parameters, together and one at a
    time, equal those through the dense K."""
    k, X1, X2, v, G = kernel_problem(nu)
    inputs = {"X1": X1, "X2": X2, "v": v}
    for name, x in inputs.items():
        x.requires_grad_(needed in ("all", name))
    for p in k.parameters():
        p.requires_grad_(needed in ("all", "kernel"))
    wrt = [x for x in (*inputs.values(), *k.parameters()) if x.requires_grad]
    ours, reference = k.matvec(X1, X2, v), k(X1, X2) @ v
    torch.testing.assert_close(ours, reference, rtol=1e-12, atol=1e-13)
    for a, b in zip(torch.autograd.grad(ours @ G, wrt), torch.autograd.grad(reference @ G, wrt)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_matvec_falls_back_to_the_dense_product_beyond_the_span():
    """A lengthscale so short that the scaled inputs span more than 2 HALF_SPAN: the dense product, the same
    numbers, in v's dtype."""
    k, X1, X2, v, _ = kernel_problem(1.5, lengthscale=1e-3)
    assert too_wide(k.scaled(X2))
    torch.testing.assert_close(k.matvec(X1, X2, v), k(X1, X2) @ v, rtol=1e-12, atol=1e-13)
    assert k.float().matvec(X1.float(), X2.float(), v.float()).dtype == torch.float32


@pytest.mark.parametrize("nu", NUS)
def test_targets_spread_wider_than_the_sources(nu):
    """Sources within the span, targets far beyond it (up to 1e25 away): without a gradient in X2 or v the sums
    run (a target over 100 from every source gets its sums at that distance, below 1e-40, as the dense product's
    underflow gives 0); with one, X1 is the backward's sources and the dense product is taken: every gradient as
    the dense one's."""
    k, X1, X2, v, G = kernel_problem(nu)
    X1 = torch.cat([X1, torch.tensor([[300.0, 0.5, 0.5], [-1e25, 0.5, 0.5], [1e25, 1e25, -1e25]], dtype=F64)])
    G = torch.cat([G, torch.ones(3, dtype=F64)])
    assert not too_wide(k.scaled(X2)) and too_wide(k.scaled(X1))
    with torch.no_grad():
        torch.testing.assert_close(k.matvec(X1, X2, v), k(X1, X2) @ v, rtol=1e-12, atol=1e-13)
    X2.requires_grad_(), v.requires_grad_()
    ours = torch.autograd.grad(k.matvec(X1, X2, v) @ G, [X2, v])
    reference = torch.autograd.grad((k(X1, X2) @ v) @ G, [X2, v])
    for a, b in zip(ours, reference):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("magnitude", [1e-300, 1e-200, 1.0, 1e200, 1e280])
@pytest.mark.parametrize("nu", NUS)
def test_weights_of_any_magnitude_keep_their_relative_accuracy(nu, magnitude):
    """The weights are scaled to at most 1 inside, so neither e^{-s} v underflows nor s^p e^{s} v overflows: the
    sums equal the dense ones relative to the weights' size, near the span's edge too."""
    s = torch.linspace(-0.95 * HALF_SPAN, 0.95 * HALF_SPAN, 41, dtype=F64).expand(2, 41).contiguous()
    t = torch.cat([s + 0.25, s[:, :1] - 1.0], -1)
    v = magnitude * torch.randn(41, dtype=F64, generator=torch.Generator().manual_seed(5))
    tolerance = 50 * torch.finfo(F64).eps * (0.95 * HALF_SPAN) ** (nu - 0.5)
    for ours, dense in zip(matern_sums(t, s, v, nu), dense_sums(t, s, v, nu)):
        assert torch.isfinite(ours).all()
        torch.testing.assert_close(ours / magnitude, dense / magnitude, rtol=0, atol=tolerance)


def test_the_slope_at_a_tie_does_not_depend_on_far_weights():
    """nu = 1/2, whose slope jumps at 0: h at a target equal to a source is read from the sums below it, not as a
    difference of running sums, so a huge weight far away leaves no round-off there."""
    s = torch.tensor([[-400.0, 0.0]], dtype=F64)
    v = torch.tensor([1e12 + 0.123, 0.3], dtype=F64)
    t = torch.tensor([[0.0]], dtype=F64)
    h, h_dense = matern_sums(t, s, v, 0.5)[1], dense_sums(t, s, v, 0.5)[1]
    torch.testing.assert_close(h, h_dense, rtol=1e-12, atol=1e-300)


def test_within_a_training_step_the_span_check_is_recorded_not_read():
    """Inside deferred checks (a speculated training epoch) the span's flag is recorded on the device and the sums
    run; the epoch is then redone with the check read (below)."""
    k, X1, X2, v, _ = kernel_problem(1.5, lengthscale=1e-3)
    with deferred_checks() as checks:
        k.matvec(X1, X2, v)
    assert bool(checks.flag)
    k, X1, X2, v, _ = kernel_problem(1.5)
    with deferred_checks() as checks:
        k.matvec(X1, X2, v)
    assert not bool(checks.flag)


@pytest.mark.parametrize("lengthscale", [0.3, 1e-3])
def test_training_takes_the_dense_products_parameters(lengthscale, monkeypatch):
    """ODVGP on the additive kernel, two epochs of `fit` with its natural-gradient steps (which share their k(x,
    gamma) a with the loss): the trained parameters equal those of a kernel that only takes the dense product. At
    a lengthscale of 1e-3 the scaled inputs span too far: fit's speculated epoch finds the flag, undoes the epoch
    and runs it again with the dense product."""
    from gpscale.models.variational.odvgp import ODVGP
    from gpscale.train import fit

    g = torch.Generator().manual_seed(0)
    X = torch.rand(60, 2, dtype=F64, generator=g)
    y = torch.sin(6 * X[:, 0]) + 0.1 * torch.randn(60, dtype=F64, generator=g)

    def trained():
        torch.manual_seed(0)
        model = ODVGP(2, n_inducing=6, n_mean_inducing=8, kernel=AdditiveMatern(2, lengthscale=lengthscale)).double()
        model.initialise_from_data(X, y)
        fit(model, X, y, epochs=2, batch_size=20, lr=0.01, progress=False)
        return {name: p.detach().clone() for name, p in model.named_parameters()}

    ours = trained()
    monkeypatch.setattr(AdditiveMatern, "matvec", lambda self, X1, X2, v: self(X1, X2).to(v.dtype) @ v)
    dense = trained()
    for name, value in ours.items():
        assert torch.isfinite(value).all(), name
        torch.testing.assert_close(value, dense[name], rtol=1e-10, atol=1e-12, msg=name)


def test_small_matrices_take_the_dense_product(monkeypatch):
    """Below DENSE_BELOW kernel values the dense product is the shorter, and is taken (no sums are called)."""
    monkeypatch.setattr(sums_module, "DENSE_BELOW", 20 * 11 * 3 + 1)
    monkeypatch.setattr(sums_module, "matern_sums", None)
    k, X1, X2, v, _ = kernel_problem(1.5)
    torch.testing.assert_close(k.matvec(X1, X2, v), k(X1, X2) @ v, rtol=0, atol=0)


def test_empty_sets_give_the_dense_products_zeros():
    """No targets, or no sources: zeros, and zero gradients (the backward's sources are the targets)."""
    k, X1, X2, v, _ = kernel_problem(2.5)
    X2.requires_grad_(), v.requires_grad_()
    out = k.matvec(X1[:0], X2, v)
    assert out.shape == (0,)
    assert all((g == 0).all() for g in torch.autograd.grad(out.sum(), [X2, v]))
    assert (k.matvec(X1, X2[:0], v[:0]) == 0).all()

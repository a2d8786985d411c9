"""The additive Matérn's K(X1, X2) v through sorted prefix sums (gpscale.kernels.matern_sums) against the dense
sums it replaces: values, ties, targets far outside the sources, every gradient, and the dense fallback."""
import pytest
import torch

from gpscale.device import deferred_checks
from gpscale.kernels import AdditiveMatern
from gpscale.kernels.matern_sums import HALF_SPAN, matern_sums, too_wide
from gpscale.kernels.separable import _AdditiveMaternMatvec

F64 = torch.float64
NUS = (0.5, 1.5, 2.5)


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
    numbers (and on float32 inputs, v's dtype out)."""
    k, X1, X2, v, _ = kernel_problem(1.5, lengthscale=1e-3)
    assert too_wide(k.scaled(X2))
    torch.testing.assert_close(k.matvec(X1, X2, v), k(X1, X2) @ v, rtol=1e-12, atol=1e-13)
    out = k.float().matvec(X1.float(), X2.float(), v)
    assert out.dtype == F64


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


def test_training_on_too_short_a_lengthscale_redoes_the_epoch_with_the_dense_product(monkeypatch):
    """ODVGP with an additive kernel whose scaled inputs span too far: fit's speculated epoch finds the flag, undoes
    it and runs it again with the dense product, so the trained parameters equal those of a kernel that only ever
    took the dense product."""
    from gpscale.models.odvgp import ODVGP
    from gpscale.train import fit

    g = torch.Generator().manual_seed(0)
    X = torch.rand(60, 2, dtype=F64, generator=g)
    y = torch.sin(6 * X[:, 0]) + 0.1 * torch.randn(60, dtype=F64, generator=g)

    def trained():
        torch.manual_seed(0)
        model = ODVGP(2, n_inducing=6, n_mean_inducing=8, kernel=AdditiveMatern(2, lengthscale=1e-3)).double()
        model.init(X, y)
        fit(model, X, y, epochs=2, batch_size=20, lr=0.01, progress=False)
        return {name: p.detach().clone() for name, p in model.named_parameters()}

    speculated = trained()
    monkeypatch.setattr(AdditiveMatern, "matvec", lambda self, X1, X2, v: self(X1, X2).to(v.dtype) @ v)
    dense = trained()
    for name, value in speculated.items():
        assert torch.isfinite(value).all(), name
        torch.testing.assert_close(value, dense[name], rtol=1e-10, atol=1e-12, msg=name)


def test_matvec_of_no_targets_is_empty():
    k, _, X2, v, _ = kernel_problem(2.5)
    assert k.matvec(X2[:0], X2, v).shape == (0,)

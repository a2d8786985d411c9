"""Variational Fourier features against numerical RKHS inner products, Fourier integrals and the kernel itself
(spec odvff.md §10, checks 1-5 and 13)."""
import math

import numpy as np
import pytest
import torch

from gpscale.kernels.fourier import (
    fourier_basis,
    matern_lambda,
    row_kronecker,
    vff_Kuf,
    vff_Kuu,
)
from gpscale.operators import BlockDiagonal, DenseSPD, DiagPlusLowRank, Kronecker

F64 = torch.float64


def matern(nu, r, lengthscale, variance):
    """Matérn-nu k(r) written from the textbook forms (§3.1), independently of the feature code."""
    lam = math.sqrt(2 * nu) / lengthscale
    z = lam * r
    poly = {0.5: 1.0, 1.5: 1 + z, 2.5: 1 + z + z**2 / 3}[nu]
    return variance * poly * torch.exp(-z)


def derivatives(bank, k, t, order):
    """[g, g', ..., g^(order)] [k, n] of the k functions of ``bank`` (T [k, n] -> [k, n], elementwise in T) at
    the points t [n], by nested autograd."""
    T = t.expand(k, -1).clone().requires_grad_(True)
    values = [bank(T)]
    for _ in range(order):
        (dg,) = torch.autograd.grad(values[-1].sum(), T, create_graph=True)
        values.append(dg)
    return [v.detach() for v in values]


def gauss_legendre(lo, hi, n=200, pieces=8):
    """Composite Gauss-Legendre nodes and weights on [lo, hi]."""
    x, w = np.polynomial.legendre.leggauss(n)
    edges = np.linspace(lo, hi, pieces + 1)
    nodes, weights = [], []
    for left, right in zip(edges[:-1], edges[1:]):
        nodes.append(0.5 * (right - left) * x + 0.5 * (right + left))
        weights.append(0.5 * (right - left) * w)
    return torch.tensor(np.concatenate(nodes), dtype=F64), torch.tensor(np.concatenate(weights), dtype=F64)


def rkhs_inner(nu, g, h, a, b, lengthscale, variance, kinks=()):
    """Gram matrix [k_g, k_h] of <g_i, h_j>_H in the Matérn-nu RKHS on [a, b] (the VFF / Durrande forms of §3.2),
    by quadrature with the derivatives taken by autograd; g and h are (bank, k) pairs, and the integral is split at
    ``kinks`` (where k(x0, .) is not smooth)."""
    lam = math.sqrt(2 * nu) / lengthscale
    order = int(nu + 0.5)
    coefficients = {0.5: [lam, 1.0], 1.5: [lam**2, 2 * lam, 1.0], 2.5: [lam**3, 3 * lam**2, 3 * lam, 1.0]}[nu]
    ends = [a, *sorted(kinks), b]
    integral = 0.0
    for lo, hi in zip(ends[:-1], ends[1:]):
        t, w = gauss_legendre(lo, hi)
        LG = sum(c * d for c, d in zip(coefficients, derivatives(*g, t, order)))
        LH = sum(c * d for c, d in zip(coefficients, derivatives(*h, t, order)))
        integral = integral + (LG * w) @ LH.T
    at_a = torch.tensor([a], dtype=F64)
    Ga = [d[:, 0] for d in derivatives(*g, at_a, 2)]
    Ha = [d[:, 0] for d in derivatives(*h, at_a, 2)]

    def outer(i, j):
        return torch.outer(Ga[i], Ha[j])

    if nu == 0.5:
        return integral / (2 * lam * variance) + outer(0, 0) / variance
    if nu == 1.5:
        return integral / (4 * lam**3 * variance) + outer(0, 0) / variance + outer(1, 1) / (lam**2 * variance)
    return (3 * integral / (16 * lam**5 * variance) + 9 / (8 * variance) * outer(0, 0)
            + 9 / (8 * lam**4 * variance) * outer(2, 2)
            + 3 / (lam**2 * variance) * (outer(1, 1) + (outer(2, 0) + outer(0, 2)) / 8))


def basis_bank(a, b, F):
    """The 2F + 1 Fourier basis functions as a bank."""
    def bank(T):
        return torch.stack([fourier_basis(row, a, b, F)[j] for j, row in enumerate(T)])

    return bank, 2 * F + 1


def kernel_bank(nu, x0, lengthscale, variance):
    return (lambda T: matern(nu, (T - x0).abs(), lengthscale, variance)), 1


@pytest.mark.parametrize("nu", [0.5, 1.5, 2.5])
def test_1_closed_form_kuu_equals_numerical_rkhs_inner_products(nu):
    a, b, F, lengthscale, variance = -0.37, 1.21, 4, 0.43, 1.7
    Kuu = vff_Kuu(nu, a, b, F, torch.tensor(lengthscale, dtype=F64), torch.tensor(variance, dtype=F64))
    dense = Kuu.to_dense()
    numeric = rkhs_inner(nu, basis_bank(a, b, F), basis_bank(a, b, F), a, b, lengthscale, variance)
    torch.testing.assert_close(dense, numeric, rtol=1e-6, atol=1e-9)
    assert torch.all(dense[: F + 1, F + 1:] == 0)  # the cos-sin block is exactly zero
    assert Kuu.W.shape[1] == {0.5: 1, 1.5: 2, 2.5: 3}[nu]  # the rank of the boundary terms, cos and sin


@pytest.mark.parametrize("nu", [0.5, 1.5, 2.5])
def test_2_reproducing_property_inside_the_interval(nu):
    a, b, F, lengthscale, variance = -0.5, 1.5, 3, 0.3, 1.3
    x0, x1 = 0.31, 0.77
    k0 = kernel_bank(nu, x0, lengthscale, variance)
    k1 = kernel_bank(nu, x1, lengthscale, variance)
    features = vff_Kuf(nu, torch.tensor([x0], dtype=F64), a, b, F, torch.tensor(lengthscale, dtype=F64))[:, 0]
    numeric = rkhs_inner(nu, k0, basis_bank(a, b, F), a, b, lengthscale, variance, kinks=(x0,))[0]
    torch.testing.assert_close(features, numeric, rtol=1e-5, atol=1e-5)
    k01 = rkhs_inner(nu, k0, k1, a, b, lengthscale, variance, kinks=(x0, x1)).item()
    assert k01 == pytest.approx(matern(nu, torch.tensor(x1 - x0), lengthscale, variance).item(), abs=1e-5)


@pytest.mark.parametrize("nu", [0.5, 1.5, 2.5])
@pytest.mark.parametrize("offset", [-0.3, 0.25])
def test_3_edge_features_equal_the_numerical_inner_products(nu, offset):
    a, b, F, lengthscale, variance = -0.3, 1.7, 3, 0.4, 0.8
    x0 = a + offset if offset < 0 else b + offset
    k0 = kernel_bank(nu, x0, lengthscale, variance)
    features = vff_Kuf(nu, torch.tensor([x0], dtype=F64), a, b, F, torch.tensor(lengthscale, dtype=F64))[:, 0]
    numeric = rkhs_inner(nu, k0, basis_bank(a, b, F), a, b, lengthscale, variance)[0]
    torch.testing.assert_close(features, numeric, rtol=1e-6, atol=1e-8)


def test_3_the_specs_edge_values_for_matern52():
    features = vff_Kuf(2.5, torch.tensor([-0.6], dtype=F64), -0.3, 1.7, 1, torch.tensor(0.4, dtype=F64))[:, 0]
    assert features.tolist() == pytest.approx([0.76327, 0.68025, -0.47162], abs=5e-6)  # cos_0, cos_1, sin_1


def induced_kernel(nu, x, a, b, F, lengthscale, variance):
    ls, var = torch.tensor(lengthscale, dtype=F64), torch.tensor(variance, dtype=F64)
    phi = vff_Kuf(nu, x, a, b, F, ls)
    return phi.T @ vff_Kuu(nu, a, b, F, ls, var).solve(phi)


def test_4_the_induced_kernel_converges_inside_the_interval():
    x = torch.linspace(0, 1, 50, dtype=F64)
    K = matern(1.5, (x[:, None] - x).abs(), 0.1, 1.0)
    errors = []
    for F, published in [(5, 1.8e-1), (20, 7.6e-3), (50, 5.5e-4), (100, 7.2e-5)]:
        Q = induced_kernel(1.5, x, -0.5, 1.5, F, 0.1, 1.0)
        errors.append((K - Q).abs().max().item())
        assert errors[-1] == pytest.approx(published, rel=0.05)
        assert torch.linalg.eigvalsh(K - Q).min() > -1e-9  # Q <= k in the PSD order
    assert errors == sorted(errors, reverse=True)


def test_5_the_endpoint_residual_stays_near_half_the_variance():
    a = torch.tensor([-0.5, -0.45, -0.3], dtype=F64)  # a, a + 0.05, a + 2 l
    residuals = {F: (1.0 - torch.diagonal(induced_kernel(1.5, a, -0.5, 1.5, F, 0.1, 1.0))) for F in (10, 40, 160)}
    assert residuals[10][0].item() == pytest.approx(0.51, abs=0.01)
    for F in (40, 160):
        assert residuals[F][0].item() == pytest.approx(0.500, abs=2e-3)
        assert residuals[F][1].item() == pytest.approx(0.38, abs=0.02)
        assert residuals[F][2].item() == pytest.approx(0.016, abs=3e-3)


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_diag_plus_low_rank_solves_and_log_determinant_equal_dense(rank):
    g = torch.Generator().manual_seed(rank)
    M = DiagPlusLowRank(torch.rand(7, generator=g, dtype=F64) + 0.1, torch.randn(7, rank, generator=g, dtype=F64))
    dense = M.to_dense()
    B = torch.randn(7, 3, generator=g, dtype=F64)
    torch.testing.assert_close(M.solve(B), torch.linalg.solve(dense, B))
    torch.testing.assert_close(M.matmul(B), dense @ B)
    torch.testing.assert_close(M.logdet(), torch.logdet(dense))
    torch.testing.assert_close(M.inv_quad(B), torch.trace(B.T @ torch.linalg.solve(dense, B)))


def test_block_diagonal_kronecker_and_dense_operators_equal_dense():
    g = torch.Generator().manual_seed(1)

    def block(n, r):
        return DiagPlusLowRank(torch.rand(n, generator=g, dtype=F64) + 0.5, torch.randn(n, r, generator=g, dtype=F64))

    blocks = BlockDiagonal([block(3, 1), block(4, 2), block(2, 0)])
    merged = DiagPlusLowRank.block_diagonal(blocks.blocks)
    kron = Kronecker([BlockDiagonal([block(2, 1), block(1, 0)]), block(4, 2), block(2, 1)])
    torch.testing.assert_close(merged.to_dense(), blocks.to_dense(), rtol=0, atol=0)
    spd = torch.randn(5, 5, generator=g, dtype=F64)
    for operator in (blocks, merged, kron, DenseSPD(spd @ spd.T + torch.eye(5, dtype=F64))):
        dense = operator.to_dense()
        B = torch.randn(dense.shape[0], 2, generator=g, dtype=F64)
        torch.testing.assert_close(operator.solve(B), torch.linalg.solve(dense, B))
        torch.testing.assert_close(operator.matmul(B), dense @ B)
        torch.testing.assert_close(operator.logdet(), torch.logdet(dense))
        torch.testing.assert_close(operator.inv_quad(B), torch.trace(B.T @ torch.linalg.solve(dense, B)))
    assert kron.size == 24 and blocks.size == 9


@pytest.mark.parametrize("nu", [0.5, 1.5, 2.5])
def test_the_dimensions_of_an_additive_kernel_in_one_call_are_their_one_dimensional_blocks(nu):
    """Intervals, lengthscales and variances [D] give blockdiag over d of the 1-D K_uu, and the 1-D K_uf stacked,
    rows outside the intervals included."""
    g = torch.Generator().manual_seed(3)
    D, F = 4, 5
    lower = -1.0 - torch.rand(D, generator=g, dtype=F64)
    upper = 1.0 + torch.rand(D, generator=g, dtype=F64)
    ls, var = 0.2 + torch.rand(D, generator=g, dtype=F64), 0.1 + torch.rand(D, generator=g, dtype=F64)
    X = 1.5 * torch.randn(40, D, generator=g, dtype=F64)
    assert ((X < lower) | (X > upper)).any(0).all()  # every dimension has rows outside its interval
    intervals = list(zip(lower.tolist(), upper.tolist()))
    blocks = DiagPlusLowRank.block_diagonal([vff_Kuu(nu, a, b, F, ls[d], var[d]) for d, (a, b) in enumerate(intervals)])
    joint = vff_Kuu(nu, lower, upper, F, ls, var)
    torch.testing.assert_close(joint.to_dense(), blocks.to_dense(), rtol=1e-13, atol=0)
    assert joint.W.shape == blocks.W.shape
    per_dim = torch.cat([vff_Kuf(nu, X[:, d], a, b, F, ls[d]) for d, (a, b) in enumerate(intervals)])
    torch.testing.assert_close(vff_Kuf(nu, X.T, lower, upper, F, ls).flatten(0, 1), per_dim, rtol=1e-13, atol=0)


def test_13_product_features_reconstruct_the_product_kernel():
    g = torch.Generator().manual_seed(13)
    X = torch.rand(30, 2, generator=g, dtype=F64)
    ls, var = torch.tensor(0.1, dtype=F64), torch.tensor(1.0, dtype=F64)
    K = matern(1.5, (X[:, None, 0] - X[:, 0]).abs(), 0.1, 1.0) * matern(1.5, (X[:, None, 1] - X[:, 1]).abs(), 0.1, 1.0)
    errors = []
    for F, published in [(10, 8.9e-2), (30, 4.8e-3), (60, 6.4e-4)]:
        Kuu = Kronecker([vff_Kuu(1.5, -0.5, 1.5, F, ls, var) for _ in range(2)])
        phi = row_kronecker([vff_Kuf(1.5, X[:, i], -0.5, 1.5, F, ls) for i in range(2)])
        assert phi.shape == ((2 * F + 1) ** 2, 30)
        errors.append((K - phi.T @ Kuu.solve(phi)).abs().max().item())
        assert errors[-1] == pytest.approx(published, rel=0.1)
    torch.testing.assert_close(row_kronecker([torch.eye(2, dtype=F64)[:, :1], torch.tensor([[2.0], [3.0]])]),
                               torch.tensor([[2.0], [3.0], [0.0], [0.0]], dtype=F64))


def test_kuu_is_differentiable_in_the_hyperparameters():
    def logdet(lengthscale, variance):
        return vff_Kuu(2.5, -0.4, 1.3, 6, lengthscale, variance).logdet()

    inputs = (torch.tensor(0.3, dtype=F64, requires_grad=True), torch.tensor(1.4, dtype=F64, requires_grad=True))
    assert torch.autograd.gradcheck(logdet, inputs)


def test_matern_lambda_and_bad_smoothness():
    assert matern_lambda(1.5, torch.tensor(2.0)).item() == pytest.approx(math.sqrt(3) / 2)
    with pytest.raises(ValueError, match="Fourier basis"):
        vff_Kuu(3.5, 0.0, 1.0, 3, torch.tensor(1.0), torch.tensor(1.0))

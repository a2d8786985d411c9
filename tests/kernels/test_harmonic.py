"""Group actions and real harmonic sub-kernels against the HKD identities and closed forms (spec hkd.md §9, checks
1-7): weights, group laws, invariance (with a negative control), sum to k, symmetry and PSD, closed forms,
equivariance and orthogonality of the sub-processes."""
import math

import pytest
import torch
from scipy.linalg import hadamard

from gpscale.kernels import RBF, Matern, inverse_softplus
from gpscale.kernels.harmonic import (
    CyclicShift,
    GroupAction,
    Identity,
    ImageFlip,
    ImageRoll,
    LongitudeRotation,
    Negation,
    OrthogonalAction,
    Product,
    SubspaceNegation,
    block_harmonic_grams,
    check_invariant,
    harmonic_gram,
    harmonic_kernel,
    harmonic_kernels,
    pca_directions,
    pca_negations,
    real_weights,
    sphere_embedding,
    subspace_negations,
)

pytestmark = pytest.mark.usefixtures("one_thread")

F64 = torch.float64
R90 = torch.tensor([[0.0, -1.0], [1.0, 0.0]], dtype=F64)  # rotation by 90 degrees


def exact(kernel, lengthscale, outputscale):
    """Sets the hyperparameters in float64: the constructors store them through float32 (errors ~1e-8)."""
    with torch.no_grad():
        kernel.raw_lengthscale.fill_(inverse_softplus(torch.tensor(lengthscale, dtype=F64)))
        kernel.raw_outputscale.fill_(inverse_softplus(torch.tensor(outputscale, dtype=F64)))
    return kernel


def rbf(d, lengthscale=1.0, outputscale=1.0, ard=False):
    return exact(RBF(d, ard=ard).double(), lengthscale, outputscale)


def points(n, d, seed=0):
    """Gaussian points [n, d] with |x - x'|^2 of order 1..2 whatever d, so kernel values are neither 0 nor 1."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=F64) * min(1.0, 1.5 / math.sqrt(d))


def rotated_data(n, d, seed=0):
    """Centred, correlated inputs [n, d]: their principal axes are not the coordinate axes."""
    g = torch.Generator().manual_seed(seed)
    mixing = torch.randn(d, d, generator=g, dtype=F64)
    X = torch.randn(n, d, generator=g, dtype=F64) @ mixing
    return X - X.mean(0)


def sphere_points(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return sphere_embedding(torch.rand(n, generator=g, dtype=F64) * 360 - 180,
                            torch.rand(n, generator=g, dtype=F64) * 180 - 90)


def shift_product(*periods):
    """Commuting cyclic shifts of disjoint coordinate blocks with the given periods, on d = sum(periods)."""
    starts = [sum(periods[:j]) for j in range(len(periods))]
    return Product([CyclicShift(range(a, a + P)) for a, P in zip(starts, periods)])


def make_case(name):
    """(kernel, action, X [7, d], X2 [5, d]) with the kernel invariant to the action."""
    if name == "identity":
        return rbf(2), Identity(), points(7, 2, 1), points(5, 2, 2)
    if name == "negation":
        return rbf(3), Negation(), points(7, 3, 1), points(5, 3, 2)
    if name == "axis_negation_ard":  # negating raw axes keeps an ARD kernel invariant
        kernel = rbf(3, ard=True)
        with torch.no_grad():
            kernel.raw_lengthscale.copy_(torch.tensor([-0.5, 0.3, 1.0]))
        return kernel, Negation(dims=[0, 2]), points(7, 3, 1), points(5, 3, 2)
    if name == "pca_2^3":
        return rbf(5, 1.5, 1.3), pca_negations(rotated_data(40, 5), 3), points(7, 5, 1), points(5, 5, 2)
    if name == "pca_matern":
        kernel = exact(Matern(5, nu=2.5, ard=False).double(), 1.2, 0.8)
        return kernel, pca_negations(rotated_data(40, 5), 2), points(7, 5, 1), points(5, 5, 2)
    if name == "rotation_P4":
        return rbf(2), OrthogonalAction(R90, 4), points(7, 2, 1), points(5, 2, 2)
    if name == "shifts_3x4":
        return rbf(7), shift_product(3, 4), points(7, 7, 1), points(5, 7, 2)
    if name == "roll_7x7":
        action = Product([ImageRoll(7, 7, 1, axis=0), ImageRoll(7, 7, 1, axis=1)])
        return rbf(49), action, points(7, 49, 1), points(5, 49, 2)
    if name == "flips":
        action = Product([ImageFlip(4, 5, axis=0, channels=2), ImageFlip(4, 5, axis=1, channels=2)])
        return rbf(40), action, points(7, 40, 1), points(5, 40, 2)
    if name == "longitude_P12":
        return rbf(3), LongitudeRotation(12), sphere_points(7, 1), sphere_points(5, 2)
    raise KeyError(name)


CASES = ["identity", "negation", "axis_negation_ard", "pca_2^3", "pca_matern", "rotation_P4", "shifts_3x4",
         "roll_7x7", "flips", "longitude_P12"]


def generators(action):
    """(s, P_j) of each way's generator G_j: exponent 1 on way j, 0 elsewhere (row-major numbering)."""
    strides = [math.prod(action.periods[j + 1:]) for j in range(len(action.periods))]
    return [(stride, P) for stride, P in zip(strides, action.periods) if P > 1]


# ----------------------------------------------------------------------------------------------------------------
# 1. Weights


@pytest.mark.parametrize("periods", [(1,), (2,), (3,), (4,), (7,), (12,), (2, 2), (7, 7), (3, 4, 2)])
def test_weights_columns_sum_to_delta(periods):
    W = shift_product(*periods).weights()
    delta = torch.zeros(math.prod(periods), dtype=F64)
    delta[0] = 1.0
    torch.testing.assert_close(W.sum(0), delta, rtol=0, atol=1e-14)


def test_weights_exact_values_and_shapes():
    torch.testing.assert_close(real_weights(2), torch.tensor([[0.5, 0.5], [0.5, -0.5]], dtype=F64), rtol=0, atol=0)
    W4 = torch.tensor([[0.25, 0.25, 0.25, 0.25], [0.5, 0.0, -0.5, 0.0], [0.25, -0.25, 0.25, -0.25]], dtype=F64)
    torch.testing.assert_close(real_weights(4), W4, rtol=0, atol=1e-16)
    assert real_weights(7).shape == (4, 7)
    grid = Product([ImageRoll(28, 28, 4, axis=0), ImageRoll(28, 28, 4, axis=1)])
    assert grid.weights().shape == (16, 49) and (grid.n_subkernels, grid.order) == (16, 49)
    torch.testing.assert_close(grid.weights(), torch.kron(real_weights(7), real_weights(7)), rtol=0, atol=0)
    assert real_weights(1).tolist() == [[1.0]]


@pytest.mark.parametrize("n_ways", [1, 2, 3])
def test_negation_weights_are_hadamard(n_ways):
    action = pca_negations(rotated_data(30, 4), n_ways)
    assert action.order == action.n_subkernels == 2**n_ways
    expected = torch.tensor(hadamard(2**n_ways), dtype=F64) / 2**n_ways
    torch.testing.assert_close(action.weights(), expected, rtol=0, atol=0)


@pytest.mark.parametrize("P", [1, 2, 3, 4, 5, 7, 12])
def test_weights_shift_identity(P):
    """sum_s W[t, s] W[t', s + r] = delta_{tt'} W[t, r]: what makes the real sub-processes uncorrelated."""
    W = real_weights(P)
    for r in range(P):
        shifted = torch.roll(W, -r, dims=1)  # shifted[:, s] = W[:, (s + r) mod P]
        torch.testing.assert_close(W @ shifted.T, torch.diag(W[:, r]), rtol=0, atol=1e-14)


# ----------------------------------------------------------------------------------------------------------------
# 2. Group laws and invariance

SINGLE_WAYS = {
    "roll_rows_28x28_4px": (ImageRoll(28, 28, 4, axis=0), 784),
    "roll_columns_28x28_4px": (ImageRoll(28, 28, 4, axis=1), 784),
    "longitude_30deg": (LongitudeRotation(12), 3),
    "negation": (Negation(), 3),
    "negation_dims": (Negation(dims=[1]), 3),
    "subspace_negation": (SubspaceNegation(torch.linalg.qr(torch.randn(4, 2, dtype=F64)).Q), 4),
    "flip_up_down": (ImageFlip(28, 28, axis=0), 784),
    "flip_left_right_rgb": (ImageFlip(5, 4, axis=1, channels=3), 60),
    "cyclic_shift_all": (CyclicShift(n_features=4), 4),
    "cyclic_shift_dims": (CyclicShift(dims=[0, 2, 3]), 5),
    "rotation_90deg": (OrthogonalAction(R90, 4), 2),
}


@pytest.mark.parametrize("name", SINGLE_WAYS)
def test_generator_has_period_P(name):
    """Applying G once P times is the identity, and not before; G^s agrees with s applications of G."""
    action, d = SINGLE_WAYS[name]
    X = points(3, d) if name != "longitude_30deg" else sphere_points(3)
    (P,) = action.periods
    Y = X
    for s in range(1, P + 1):
        Y = action.apply(Y, 1)
        if s < P:
            torch.testing.assert_close(Y, action.apply(X, s), rtol=0, atol=1e-12)
            assert (Y - X).abs().max() > 1e-3
    torch.testing.assert_close(Y, X, rtol=0, atol=1e-12)
    assert action.order == P and action.orbit(X).shape == (P, 3, d)


@pytest.mark.parametrize("action, d", [
    (Product([ImageRoll(28, 28, 4, axis=0), ImageRoll(28, 28, 4, axis=1)]), 784),
    (Product([ImageFlip(4, 5, axis=0, channels=2), ImageFlip(4, 5, axis=1, channels=2)]), 40),
    (pca_negations(rotated_data(30, 5), 3), 5),
    (shift_product(3, 4, 2), 9),
    (Negation(dims=[0]).product(CyclicShift(dims=[1, 2])), 3),
], ids=["rolls_7x7", "flips", "pca_2^3", "shifts_3x4x2", "negation_x_shift"])
def test_ways_commute_and_compose_row_major(action, d):
    X = points(3, d)
    gens = generators(action)
    for a, Pa in gens:
        Y = X
        for _ in range(Pa):
            Y = action.apply(Y, a)
        torch.testing.assert_close(Y, X, rtol=0, atol=1e-12)
        for b, _ in gens:
            if b != a:
                ab = action.apply(action.apply(X, b), a)
                torch.testing.assert_close(ab, action.apply(action.apply(X, a), b), rtol=0, atol=1e-12)
                torch.testing.assert_close(ab, action.apply(X, a + b), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", CASES)
def test_the_orbit_is_each_element_applied_in_turn_in_value_and_gradient(name):
    """``orbit`` (one batched product of the ways' matrices multiplied out, for the linear actions: subspace
    negations, rotations, their products) against ``apply`` of each element, the chain of the ways' own
    operations; for a subset of the elements too (the half orbit of a Gram matrix)."""
    _, action, X, _ = make_case(name)
    X = X.clone().requires_grad_()
    orbit = action.orbit(X)
    applied = torch.stack([action.apply(X, s) for s in range(action.order)])
    torch.testing.assert_close(orbit, applied, rtol=0, atol=1e-13)
    weights = torch.randn(orbit.shape, dtype=F64, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(torch.autograd.grad((orbit * weights).sum(), X)[0],
                               torch.autograd.grad((applied * weights).sum(), X)[0], rtol=0, atol=1e-12)
    half = action.half_orbit()
    torch.testing.assert_close(action.orbit(X, half), applied[half], rtol=0, atol=1e-13)


def test_products_of_subspace_negations_and_rotations_are_linear_and_the_rest_are_not():
    assert pca_negations(rotated_data(40, 5), 3).is_linear and LongitudeRotation(12).is_linear
    assert not SubspaceNegation(torch.eye(784, dtype=F64)[:, :3]).is_linear  # a map dearer than its two products
    assert not Product([SubspaceNegation(torch.eye(3)[:, :1]), Negation()]).is_linear
    assert not any(a.is_linear for a in (Identity(), Negation(), CyclicShift(n_features=3), ImageFlip(4, 5, 0)))


def test_the_orbit_of_a_product_of_periods_4_and_2_in_float32_and_past_the_maps_cap(monkeypatch):
    """A rotation by 90 degrees of the first two coordinates (P = 4) times the negation of the third (P = 2): the
    maps' row-major numbering over unequal periods, the maps' float32 copy beside the float64 one, and the
    element-by-element path where the maps would hold more than MAPS_ENTRIES numbers."""
    R = torch.eye(3, dtype=F64)
    R[:2, :2] = R90
    action = Product([OrthogonalAction(R, 4), SubspaceNegation(torch.eye(3, dtype=F64)[:, 2:])])
    assert action.is_linear and action.order == 8
    X = points(6, 3, 3)
    applied = torch.stack([action.apply(X, s) for s in range(8)])
    torch.testing.assert_close(action.orbit(X), applied, rtol=0, atol=1e-13)
    torch.testing.assert_close(action.orbit(X.float()), applied.float(), rtol=0, atol=1e-6)
    torch.testing.assert_close(action.orbit(X, torch.tensor([5, 2])), applied[[5, 2]], rtol=0, atol=1e-13)
    monkeypatch.setattr("gpscale.kernels.harmonic.group.MAPS_ENTRIES", 8 * 9 - 1)
    torch.testing.assert_close(action.orbit(X), applied, rtol=0, atol=1e-13)
    with pytest.raises(ValueError, match="s=8"):
        action.orbit(X, [0, 8])
    with pytest.raises(ValueError, match="s=-1"):
        action.orbit(X, [-1])


def test_flip_orbit_order_and_image_layout():
    """Row-major [height, width, channels] flattening; the official code's orbit [Z, LR Z, UD Z, UD LR Z]."""
    images = torch.randn(2, 4, 5, 3, dtype=F64)
    Z = images.reshape(2, -1)
    flips = Product([ImageFlip(4, 5, axis=0, channels=3), ImageFlip(4, 5, axis=1, channels=3)])
    expected = torch.stack([images, images.flip(2), images.flip(1), images.flip(1).flip(2)]).reshape(4, 2, -1)
    torch.testing.assert_close(flips.orbit(Z), expected, rtol=0, atol=0)


def test_image_roll_is_a_torus_roll():
    images = torch.randn(2, 6, 4, 2, dtype=F64)
    X = images.reshape(2, -1)
    down = ImageRoll(6, 4, 2, axis=0, channels=2).apply(X, 1).reshape(2, 6, 4, 2)
    right = ImageRoll(6, 4, 2, axis=1, channels=2).apply(X, 1).reshape(2, 6, 4, 2)
    for i in range(6):
        for j in range(4):
            assert torch.equal(down[:, (i + 2) % 6, j], images[:, i, j])  # pixel (i, j) moves to row i + 2
            assert torch.equal(right[:, i, (j + 2) % 4], images[:, i, j])  # wrapping around: no zero padding
    assert ImageRoll(6, 4, 2, axis=0).periods == (3,) and ImageRoll(6, 4, 2, axis=1).periods == (2,)


def test_longitude_rotation_adds_360_over_P_degrees():
    lon = torch.tensor([-170.0, 0.0, 95.0], dtype=F64)
    lat = torch.tensor([-90.0, 10.0, 60.0], dtype=F64)
    X = sphere_embedding(lon, lat)
    for s in range(12):
        torch.testing.assert_close(LongitudeRotation(12).apply(X, s), sphere_embedding(lon + 30 * s, lat),
                                   rtol=0, atol=1e-12)


def test_cyclic_shift_moves_the_last_coordinate_first():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]], dtype=F64)
    assert CyclicShift(n_features=5).apply(x, 1).tolist() == [[5.0, 1.0, 2.0, 3.0, 4.0]]
    assert CyclicShift(dims=[0, 2, 3]).apply(x, 1).tolist() == [[4.0, 2.0, 1.0, 3.0, 5.0]]


def test_pca_negations_assign_sorted_directions_to_ways_in_turn():
    """Exact covariance Q diag(4, 3, 2, 1) Q^T: way 0 negates directions 1 and 3 (largest, third), way 1 the rest."""
    g = torch.Generator().manual_seed(3)
    Q = torch.linalg.qr(torch.randn(4, 4, generator=g, dtype=F64)).Q
    Z = torch.randn(50, 4, generator=g, dtype=F64)
    Z = Z - Z.mean(0)
    Z = Z @ torch.linalg.inv(torch.linalg.cholesky(Z.T @ Z / 49)).T  # sample covariance exactly I
    X = Z @ torch.diag(torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=F64).sqrt()) @ Q[:, [3, 2, 1, 0]].T
    ways = pca_negations(X, 2).actions
    for way, columns in zip(ways, ([0, 2], [1, 3])):
        torch.testing.assert_close(way.U @ way.U.T, Q[:, columns] @ Q[:, columns].T, rtol=0, atol=1e-10)
    directions = pca_directions(X)  # the same basis, one column per direction
    assert directions.dtype == F64
    torch.testing.assert_close((directions * Q).sum(0).abs(), torch.ones(4, dtype=F64), rtol=0, atol=1e-10)
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]], dtype=F64)
    axes = subspace_negations(torch.eye(4, dtype=F64), 2)  # way 0: columns 0 and 2, way 1: columns 1 and 3
    assert axes.apply(x, 2).tolist() == [[-1.0, 2.0, -3.0, 4.0]]
    assert axes.apply(x, 1).tolist() == [[1.0, -2.0, 3.0, -4.0]]


def test_float32_basis_gives_an_exact_reflection():
    """A float32 basis (e.g. a model buffer) is accepted and re-orthonormalised in float64: G^2 = id, k invariant."""
    U = torch.linalg.qr(torch.randn(5, 2, dtype=F64)).Q.float()
    action, X = SubspaceNegation(U), points(6, 5)
    torch.testing.assert_close(action.apply(action.apply(X, 1), 1), X, rtol=0, atol=1e-14)
    torch.testing.assert_close(action.U @ action.U.T, (U @ U.T).double(), rtol=0, atol=1e-6)
    check_invariant(rbf(5), action, X, atol=1e-13)


@pytest.mark.parametrize("name", CASES)
def test_kernel_is_invariant(name):
    kernel, action, X, X2 = make_case(name)
    check_invariant(kernel, action, X)
    for s in range(action.order):
        torch.testing.assert_close(kernel(action.apply(X, s), action.apply(X2, s)), kernel(X, X2), rtol=0,
                                   atol=1e-12)


def test_ard_kernel_under_pca_negation_is_rejected():
    """Negative control: unequal ARD lengthscales break invariance to a rotated reflection. The sub-kernels still
    sum to k, but they are not symmetric, which is why invariance has to be checked separately."""
    kernel = rbf(5, ard=True)
    with torch.no_grad():
        kernel.raw_lengthscale.copy_(torch.linspace(-1.0, 1.0, 5))
    action, X = pca_negations(rotated_data(40, 5), 2), points(7, 5)
    with pytest.raises(ValueError, match="ard=False"):
        check_invariant(kernel, action, X)
    with torch.no_grad():
        K_t = harmonic_kernels(kernel, action, X, X)
        torch.testing.assert_close(K_t.sum(0), kernel(X, X), rtol=0, atol=1e-12)
        assert (K_t - K_t.transpose(-1, -2)).abs().max() > 1e-3


def test_ard_kernel_under_cyclic_shift_is_rejected():
    kernel = rbf(3, ard=True)
    with torch.no_grad():
        kernel.raw_lengthscale.copy_(torch.tensor([0.1, 0.5, 1.0]))
    with pytest.raises(ValueError, match="not invariant"):
        check_invariant(kernel, CyclicShift(n_features=3), points(6, 3))


# ----------------------------------------------------------------------------------------------------------------
# 3-4. Sum, symmetry, PSD


@pytest.mark.parametrize("name", CASES)
def test_subkernels_sum_to_k(name):
    kernel, action, X, X2 = make_case(name)
    with torch.no_grad():
        K_t = harmonic_kernels(kernel, action, X, X2)
        assert K_t.shape == (action.n_subkernels, 7, 5)
        torch.testing.assert_close(K_t.sum(0), kernel(X, X2), rtol=0, atol=1e-12)
        for t in range(action.n_subkernels):
            torch.testing.assert_close(harmonic_kernel(kernel, action, t, X, X2), K_t[t], rtol=0, atol=1e-15)


@pytest.mark.parametrize("name", CASES)
def test_subkernels_are_symmetric_and_psd(name):
    kernel, action, X, _ = make_case(name)
    with torch.no_grad():
        K = kernel(X, X)
        for K_t in harmonic_kernels(kernel, action, X, X):
            assert (K_t - K_t.T).abs().max() < 1e-12
            assert torch.linalg.eigvalsh(K_t).min() > -1e-10 * torch.linalg.matrix_norm(K, 2)


def test_identity_gives_the_kernel_itself():
    kernel, action, X, X2 = make_case("identity")
    assert (action.order, action.n_subkernels) == (1, 1)
    torch.testing.assert_close(harmonic_kernels(kernel, action, X, X2)[0], kernel(X, X2), rtol=0, atol=0)


# ----------------------------------------------------------------------------------------------------------------
# 5. Closed forms


def test_negation_1d_closed_form():
    x, x2 = torch.tensor([[1.0]], dtype=F64), torch.tensor([[0.5]], dtype=F64)
    kernel = rbf(1)
    with torch.no_grad():
        k0, k1 = harmonic_kernels(kernel, Negation(), x, x2).flatten().tolist()
        assert kernel(x, x2).item() == pytest.approx(0.8824969026, abs=1e-10)
    assert k0 == pytest.approx(0.6035746850, abs=1e-10) and k1 == pytest.approx(0.2789222176, abs=1e-10)
    envelope = math.exp(-(1.0 + 0.25) / 2)
    assert k0 == pytest.approx(envelope * math.cosh(0.5), abs=1e-14)
    assert k1 == pytest.approx(envelope * math.sinh(0.5), abs=1e-14)


def test_rotation_90deg_closed_form():
    a, b = torch.tensor([[1.0, 0.0]], dtype=F64), torch.tensor([[0.5, 0.5]], dtype=F64)
    kernel, action = rbf(2), OrthogonalAction(R90, 4)
    with torch.no_grad():
        orbit_values = kernel(a, action.orbit(b).reshape(4, 2)).flatten()
        K_t = harmonic_kernels(kernel, action, a, b).flatten()
    expected_orbit = torch.tensor([0.7788007831, 0.2865047969, 0.2865047969, 0.7788007831], dtype=F64)
    torch.testing.assert_close(orbit_values, expected_orbit, rtol=0, atol=1e-10)
    torch.testing.assert_close(K_t, torch.tensor([0.5326527900, 0.2461479931, 0.0], dtype=F64), rtol=0, atol=1e-10)
    assert K_t.sum().item() == pytest.approx(0.7788007831, abs=1e-10)


def test_cyclic_shift_closed_form():
    a, b = torch.tensor([[1.0, 0.0, 0.0]], dtype=F64), torch.tensor([[0.2, 0.5, -0.3]], dtype=F64)
    kernel, action = rbf(3), CyclicShift(n_features=3)
    with torch.no_grad():
        orbit_values = kernel(a, action.orbit(b).reshape(3, 3)).flatten()
        K_t = harmonic_kernels(kernel, action, a, b).flatten()
    expected_orbit = torch.tensor([0.6126263942, 0.3715766910, 0.8269591339], dtype=F64)
    torch.testing.assert_close(orbit_values, expected_orbit, rtol=0, atol=1e-10)
    torch.testing.assert_close(K_t, torch.tensor([0.6037207397, 0.0089056545], dtype=F64), rtol=0, atol=1e-10)


def test_subspace_negation_rbf_is_a_cosh_sinh_product():
    """k_b = s^2 prod_j exp(-(|P_j x|^2 + |P_j x'|^2) / 2 l^2) (cosh if b_j = 0 else sinh)(P_j x . P_j x' / l^2)."""
    lengthscale, outputscale = 1.5, 1.3
    kernel, action, X, X2 = make_case("pca_2^3")
    with torch.no_grad():
        K_t = harmonic_kernels(kernel, action, X, X2)
    expected = torch.full_like(K_t, outputscale)
    for t in range(action.n_subkernels):
        bits = [(t >> (2 - j)) & 1 for j in range(3)]  # row-major: way 0 is the slowest index
        for way, b in zip(action.actions, bits):
            A, B = X @ way.U / lengthscale, X2 @ way.U / lengthscale  # coordinates in the subspace
            envelope = torch.exp(-((A * A).sum(-1, keepdim=True) + (B * B).sum(-1)) / 2)
            expected[t] *= envelope * (torch.sinh if b else torch.cosh)(A @ B.T)
    torch.testing.assert_close(K_t, expected, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------------------------------------------
# 6. Shift / equivariance


@pytest.mark.parametrize("name", CASES)
def test_k0_is_invariant_in_each_argument(name):
    kernel, action, X, X2 = make_case(name)
    with torch.no_grad():
        K0 = harmonic_kernel(kernel, action, 0, X, X2)
        for s in range(action.order):
            torch.testing.assert_close(harmonic_kernel(kernel, action, 0, X, action.apply(X2, s)), K0, rtol=0,
                                       atol=1e-12)


@pytest.mark.parametrize("name", ["negation", "pca_2^3"])
def test_negation_subkernels_flip_sign_with_their_ways(name):
    """k_b(x, G_j x') = (-1)^{b_j} k_b(x, x'); for one way, k_1(x, -x') = -k_1(x, x') (the odd part)."""
    kernel, action, X, X2 = make_case(name)
    with torch.no_grad():
        K_t = harmonic_kernels(kernel, action, X, X2)
        for j, (s, _) in enumerate(generators(action)):
            signs = torch.tensor([(-1.0) ** ((t >> (len(action.periods) - 1 - j)) & 1) for t in range(len(K_t))],
                                 dtype=F64)
            torch.testing.assert_close(harmonic_kernels(kernel, action, X, action.apply(X2, s)),
                                       signs[:, None, None] * K_t, rtol=0, atol=1e-12)


def test_rotation_subkernels_are_equivariant():
    """P = 4: k_2 flips sign under a 90-degree rotation, k_1 = k_1 + k_3 (complex) under 180 degrees."""
    kernel, action, X, X2 = make_case("rotation_P4")
    with torch.no_grad():
        k0, k1, k2 = harmonic_kernels(kernel, action, X, X2)
        k0_90, _, k2_90 = harmonic_kernels(kernel, action, X, action.apply(X2, 1))
        _, k1_180, _ = harmonic_kernels(kernel, action, X, action.apply(X2, 2))
    torch.testing.assert_close(k0_90, k0, rtol=0, atol=1e-12)
    torch.testing.assert_close(k2_90, -k2, rtol=0, atol=1e-12)
    torch.testing.assert_close(k1_180, -k1, rtol=0, atol=1e-12)
    assert k2.abs().max() > 1e-3 and k1.abs().max() > 1e-3


# ----------------------------------------------------------------------------------------------------------------
# 7. Orthogonality of the sub-processes


@pytest.mark.parametrize("name", ["negation", "pca_2^3", "pca_matern", "rotation_P4", "shifts_3x4", "roll_7x7",
                                  "flips", "longitude_P12"])
def test_subprocesses_are_uncorrelated(name):
    """Cov(f_t(x), f_t'(x')) = sum_{s, s'} W[t, s] W[t', s'] k(G^s x, G^s' x') = delta_{tt'} k_t(x, x')."""
    kernel, action, X, X2 = make_case(name)
    S, d = action.order, X.shape[-1]
    with torch.no_grad():
        K_orbit = kernel(action.orbit(X).reshape(-1, d), action.orbit(X2).reshape(-1, d)).reshape(S, 7, S, 5)
        W = action.weights()
        cov = torch.einsum("ts,uv,sivj->tuij", W, W, K_orbit)
        K_t = harmonic_kernels(kernel, action, X, X2)
    eye = torch.eye(action.n_subkernels, dtype=F64)
    torch.testing.assert_close(cov, eye[:, :, None, None] * K_t, rtol=0, atol=1e-12)


def test_sampled_subprocesses_sum_to_f_and_are_uncorrelated():
    """Monte Carlo on an orbit-closed set: f = sum_t f_t exactly, Cov(f_t, f_t') ~ delta_{tt'} k_t, and the odd
    part of a negation is odd, f_1(-x) = -f_1(x)."""
    kernel, action = rbf(2), OrthogonalAction(R90, 4)
    X0 = points(3, 2)
    orbit = action.orbit(X0)  # [4, 3, 2]
    with torch.no_grad():
        K = kernel(orbit.reshape(-1, 2), orbit.reshape(-1, 2))
    n_samples = 20000
    g = torch.Generator().manual_seed(1)
    L = torch.linalg.cholesky(K + 1e-10 * torch.eye(12, dtype=F64))
    f = (L @ torch.randn(12, n_samples, generator=g, dtype=F64)).reshape(4, 3, n_samples)  # f(G^s x_i)
    f_t = torch.einsum("ts,sin->tin", action.weights(), f)  # [T, 3, N] at the points X0
    torch.testing.assert_close(f_t.sum(0), f[0], rtol=0, atol=1e-12)
    empirical = torch.einsum("tin,ujn->tuij", f_t, f_t) / n_samples
    with torch.no_grad():
        K_t = harmonic_kernels(kernel, action, X0, X0)
    expected = torch.eye(3, dtype=F64)[:, :, None, None] * K_t
    assert (empirical - expected).abs().max() < 0.05  # Monte Carlo error ~ 1 / sqrt(N) ~ 0.007

    odd = real_weights(2)[1]
    f_odd = torch.einsum("s,sin->in", odd, f[[0, 2]])  # negation is the 180-degree rotation G^2
    f_odd_at_minus_x = torch.einsum("s,sin->in", odd, f[[2, 0]])
    torch.testing.assert_close(f_odd_at_minus_x, -f_odd, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------------------------------------------
# Gradients and input validation


@pytest.mark.parametrize("name", ["pca_2^3", "rotation_P4", "flips"])
def test_gradients_reach_hyperparameters_and_inducing_points(name):
    kernel, action, X, X2 = make_case(name)
    Z = X2[:3].clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda Z: harmonic_kernels(kernel, action, X[:3], Z), (Z,))
    harmonic_kernels(kernel, action, X, Z)[-1].sum().backward()
    for parameter in (kernel.raw_lengthscale, kernel.raw_outputscale, Z):
        assert parameter.grad is not None and parameter.grad.abs().max() > 0


def test_invalid_inputs_raise():
    X = points(4, 3)
    with pytest.raises(ValueError, match="outside 0..1"):
        Negation().apply(X, 2)
    with pytest.raises(ValueError, match="outside"):
        Negation().apply(X, -1)
    with pytest.raises(ValueError, match="d=4"):
        SubspaceNegation(torch.eye(4, dtype=F64)[:, :2]).apply(X, 1)
    with pytest.raises(ValueError, match=r"X \[n, d\]"):
        Negation().apply(X[0], 1)
    with pytest.raises(ValueError, match="orthonormal"):
        SubspaceNegation(torch.ones(3, 2, dtype=F64))
    with pytest.raises(ValueError, match="divide"):
        ImageRoll(28, 28, 5, axis=0)
    with pytest.raises(ValueError, match="axis"):
        ImageFlip(28, 28, axis=2)
    with pytest.raises(ValueError, match="n_ways=4"):
        pca_negations(X, 4)
    with pytest.raises(ValueError, match="n_ways=0"):
        pca_negations(X, 0)
    with pytest.raises(ValueError, match="n >= 2"):
        pca_directions(X[:1])
    with pytest.raises(ValueError, match="period"):
        OrthogonalAction(R90, 3)
    with pytest.raises(ValueError, match="already has period 4"):
        OrthogonalAction(R90, 8)
    with pytest.raises(ValueError, match="orthogonal"):
        OrthogonalAction(2 * torch.eye(2, dtype=F64), 1)
    with pytest.raises(ValueError, match="n_features"):
        CyclicShift()
    with pytest.raises(ValueError, match="distinct"):
        CyclicShift(dims=[0, 0])
    with pytest.raises(ValueError, match="coordinates"):
        Negation(dims=[3]).apply(X, 1)
    with pytest.raises(ValueError, match="different input dimensions"):
        Product([LongitudeRotation(4), OrthogonalAction(R90, 4)])
    with pytest.raises(ValueError, match="P >= 1"):
        real_weights(0)
    kernel = rbf(3)
    with pytest.raises(ValueError, match="t=2"):
        harmonic_kernel(kernel, Negation(), 2, X, X)
    with pytest.raises(ValueError, match="share d"):
        harmonic_kernels(kernel, Negation(), X, points(2, 2))
    assert isinstance(Negation().product(Identity()), GroupAction)


@pytest.mark.parametrize("name", CASES)
def test_gram_from_half_the_orbit_equals_the_full_sum(name):
    kernel, action, X, _ = make_case(name)
    assert sorted({s for s in range(action.order)} - {action.inverse(s) for s in range(action.order)}) == []
    assert all(action.inverse(action.inverse(s)) == s for s in range(action.order))
    with torch.no_grad():
        full = harmonic_kernels(kernel, action, X, X)
        torch.testing.assert_close(harmonic_gram(kernel, action, X), 0.5 * (full + full.mT), rtol=0, atol=1e-14)
        torch.testing.assert_close(harmonic_gram(kernel, action, X, action.n_subkernels - 1), full[-1],
                                   rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["negation", "pca_matern", "rotation_P4", "shifts_3x4", "flips"])
def test_block_grams_in_one_call_equal_one_gram_per_block_in_value_and_gradient(name):
    """block_harmonic_grams (every block's half orbit and Gram matrix in one batched call) against harmonic_gram
    of each block with its own sub-kernel, in value and in the gradients of the points and the hyperparameters."""
    kernel, action, _, _ = make_case(name)
    T, d = action.n_subkernels, kernel.n_features
    Z = torch.randn(T, 4, d, dtype=F64, generator=torch.Generator().manual_seed(6)).requires_grad_()
    ts = list(range(T))[::-1]  # not in order: block b takes sub-kernel ts[b]
    batched = block_harmonic_grams(kernel, action, Z, ts)
    looped = torch.stack([harmonic_gram(kernel, action, Z[b], t) for b, t in enumerate(ts)])
    torch.testing.assert_close(batched, looped, rtol=0, atol=1e-13)
    weights = torch.randn(batched.shape, dtype=F64, generator=torch.Generator().manual_seed(7))
    wrt = [Z, kernel.raw_lengthscale, kernel.raw_outputscale]
    for a, b in zip(torch.autograd.grad((batched * weights).sum(), wrt),
                    torch.autograd.grad((looped * weights).sum(), wrt)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_inverse_negates_each_ways_exponent():
    action = Product([CyclicShift(range(0, 3)), CyclicShift(range(3, 7))])  # periods (3, 4), s = 4 s_1 + s_2
    assert action.inverse(4 * 1 + 1) == 4 * 2 + 3
    assert action.inverse(4 * 0 + 2) == 2  # the half turn of the second way is its own inverse
    with pytest.raises(ValueError, match="outside"):
        harmonic_gram(rbf(7), action, points(3, 7), t=action.n_subkernels)

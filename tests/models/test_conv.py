"""Inducing patches of convolutional GPs, plain and harmonic: every covariance the engine takes equals the
covariance of the inducing variables and f as linear functionals of the patch process g, built by hand on a finite
set of (patch, position) points; k-means initialisation is seeded; and a small convolutional classifier trains
through the variational engine."""
import pytest
import torch

from gpscale.kernels import RBF, inverse_softplus
from gpscale.kernels.patches import (ConvKernel, PatchGeometry, checkerboard_negation, patch_negation,
                                     tick_location_kernel)
from gpscale.models.variational.engine import VariationalGP
from gpscale.models.conv.features import ConvolutionalFeatures, kmeans_patches
from gpscale.train import fit

pytestmark = pytest.mark.usefixtures("one_thread")

F64 = torch.float64
SHAPE = (6, 6, 2)


def set_exact(kernel, lengthscale, outputscale):
    with torch.no_grad():
        kernel.raw_lengthscale.fill_(inverse_softplus(torch.tensor(lengthscale, dtype=F64)))
        kernel.raw_outputscale.fill_(inverse_softplus(torch.tensor(outputscale, dtype=F64)))
    return kernel


def conv_features(m, action=None, shared=False, weights=False, tick=False, shape=SHAPE, filter_size=3, stride=1,
                  padding="valid", seed=0):
    """Features over a conv kernel with float64 hyperparameters, random inducing patches (and positions)."""
    geometry = PatchGeometry(shape, filter_size, stride, padding)
    patch_kernel = set_exact(RBF(geometry.patch_dim, ard=False).double(), 3.0, 0.9)
    location_kernel = set_exact(tick_location_kernel().double(), 2.0, 1.2) if tick else None
    kernel = ConvKernel(patch_kernel, geometry, location_weights=weights, location_kernel=location_kernel)
    features = ConvolutionalFeatures(kernel, m, action, shared=shared).double()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        features.Z.copy_(torch.randn(features.Z.shape, generator=g, dtype=F64))
        if weights:
            kernel.patch_weights.copy_(0.5 + torch.rand(geometry.n_patches, generator=g, dtype=F64))
        if tick:
            features.locations.copy_(torch.rand(features.locations.shape, generator=g, dtype=F64) * 4)
    return features


def centred_images(n, shape=SHAPE, seed=1):
    return 0.7 * torch.randn(n, *shape, generator=torch.Generator().manual_seed(seed), dtype=F64).reshape(n, -1)


def joint_prior(features, X):
    """Cov([u_0; ..; u_{T-1}; f(X)]) [T m + n, T m + n] as A K_g A^T: u_t = sum_s W[t, s] g(G^s z_t, l_t) and
    f(x) = sum_p (w_p / P) g(x^[p], l_p) are linear in g at the points (every orbit of Z, every patch of X), whose
    covariance K_g is the patch (times location) kernel there."""
    kernel, geometry = features.kernel, features.kernel.geometry
    T = features.blocks or 1
    action = features.action
    S = 1 if action is None else action.order
    W = torch.ones(1, 1, dtype=F64) if action is None else action.weights(F64)
    m = features.Z.shape[-2]
    Z = features.Z.detach().expand(T, m, -1) if features.Z.ndim == 2 else features.Z.detach()
    L = None
    if kernel.tick:
        L = features.locations.detach()
        L = L.expand(T, m, 2) if L.ndim == 2 else L
    points, positions, rows = [], [], []
    for t in range(T):
        for s in range(S):
            for i in range(m):
                points.append(Z[t, i] if action is None else action.apply(Z[t, i:i + 1], s)[0])
                positions.append(L[t, i] if L is not None else torch.zeros(2, dtype=F64))
                rows.append((t * m + i, W[t, s].item()))
    patches = geometry.extract(X)
    w = kernel.patch_weights.detach() / geometry.n_patches
    for a in range(len(X)):
        for p in range(geometry.n_patches):
            points.append(patches[a, p])
            positions.append(geometry.locations[p])
            rows.append((T * m + a, w[p].item()))
    points, positions = torch.stack(points), torch.stack(positions)
    A = torch.zeros(T * m + len(X), len(points), dtype=F64)
    for column, (row, weight) in enumerate(rows):
        A[row, column] = weight
    with torch.no_grad():
        K_g = kernel.patch_kernel(points, points)
        if kernel.tick:
            K_g = K_g * kernel.location_kernel(positions, positions)
    return A @ K_g @ A.T


CASES = [  # action, shared Z, learned weights, TICK
    (None, False, True, False),
    (None, False, False, True),
    ("negation", False, True, True),
    ("negation", True, False, False),
    ("checkerboard", False, False, False),
    ("checkerboard", True, True, True),
]


def make_action(name):
    return {None: lambda: None, "negation": patch_negation, "checkerboard": lambda: checkerboard_negation(3, 2)}[name]()


@pytest.mark.parametrize("action, shared, weights, tick", CASES)
def test_features_are_the_covariances_of_the_inducing_variables_and_f(action, shared, weights, tick):
    features = conv_features(3, make_action(action), shared, weights, tick)
    X = centred_images(4)
    T, m, n = features.blocks or 1, 3, 4
    C = joint_prior(features, X)
    with torch.no_grad():
        Kuu = features.Kuu().reshape(T, m, m)
        Kuf = features.Kuf(X).reshape(T * m, n)
        Kff = features.kernel(X, X)
        Kff_diag = features.Kff_diag(X)
    # independent blocks: the covariance between different t is zero, each block's is its sub-kernel
    torch.testing.assert_close(C[:T * m, :T * m], torch.block_diag(*Kuu), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(C[:T * m, T * m:], Kuf, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(C[T * m:, T * m:], Kff, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(torch.diagonal(C[T * m:, T * m:]), Kff_diag, rtol=1e-10, atol=1e-12)
    assert Kuf.abs().min() > 1e-6 and (C[:T * m, :T * m] - torch.block_diag(*Kuu)).abs().max() < 1e-12


@pytest.mark.parametrize("action", ["negation", "checkerboard"])
def test_harmonic_blocks_sum_to_the_plain_convolutional_features(action):
    harmonic = conv_features(4, make_action(action), shared=True, weights=True, tick=True)
    plain = conv_features(4, weights=True, tick=True)
    with torch.no_grad():  # the same hyperparameters already; the same inducing patches, positions and weights
        plain.Z.copy_(harmonic.Z)
        plain.locations.copy_(harmonic.locations)
        plain.kernel.patch_weights.copy_(harmonic.kernel.patch_weights)
    X = centred_images(5)
    with torch.no_grad():  # sum_t k_t = k, for Kuu and Kuf alike
        torch.testing.assert_close(harmonic.Kuu().sum(0), plain.Kuu(), rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(harmonic.Kuf(X).sum(0), plain.Kuf(X), rtol=1e-12, atol=1e-13)
        eigenvalues = torch.linalg.eigvalsh(harmonic.Kuu())  # each block PSD
    assert eigenvalues.min() > -1e-12


@pytest.mark.parametrize("action", [None, "checkerboard"])
def test_chunks_of_images_change_nothing(action):
    features = conv_features(5, make_action(action), tick=True, weights=True)
    X = centred_images(7)
    with torch.no_grad():
        whole = features.Kuf(X)
        features.images_per_chunk = 2
        torch.testing.assert_close(features.Kuf(X), whole, rtol=0, atol=1e-15)
        features.images_per_chunk = 1
        torch.testing.assert_close(features.Kuf(X), whole, rtol=0, atol=1e-15)


def test_default_chunks_bound_the_largest_intermediate():
    features = conv_features(50, checkerboard_negation(3, 2), shape=(28, 28, 2))  # P = 676, S T m = 800 points
    assert features.images_per_chunk == max(1, 2**22 // (676 * 800))
    assert conv_features(5000, shape=(28, 28, 2)).images_per_chunk == 1  # at least one image


def test_kmeans_inducing_patches_are_seeded_and_shaped():
    geometry = PatchGeometry(SHAPE, 3, 1, "valid")
    X = centred_images(20)
    Z, L = kmeans_patches(X, geometry, 6, seed=3)
    assert Z.shape == (6, geometry.patch_dim) and L.shape == (6, 2)
    Z2, L2 = kmeans_patches(X, geometry, 6, seed=3)
    torch.testing.assert_close(Z, Z2, rtol=0, atol=0)
    torch.testing.assert_close(L, L2, rtol=0, atol=0)
    assert not torch.allclose(Z, kmeans_patches(X, geometry, 6, seed=4)[0])
    assert all((geometry.locations == location).all(-1).any() for location in L)  # positions of real patches
    features = conv_features(6, checkerboard_negation(3, 2), tick=True)
    features.initialise_from_images(X, seed=3)
    torch.testing.assert_close(features.Z, Z.expand(4, 6, -1))  # every block starts at the same patches
    torch.testing.assert_close(features.locations, L.expand(4, 6, 2))


# --- end to end -----------------------------------------------------------------------------------------------
class ConvGP(VariationalGP):
    """The smallest convolutional SVGP on the engine (not registered: a test model)."""

    def __init__(self, kernel, n_inducing, action=None, **kwargs):
        super().__init__(kernel.geometry.n_pixels, kernel=kernel, **kwargs)
        self.features = ConvolutionalFeatures(self.kernel, n_inducing, action)
        self.initialise_q(n_inducing, blocks=self.features.blocks)

    def initialise_from_data(self, X, y, seed=0):
        self.features.initialise_from_images(X, seed)
        self.initialise_q_at_prior()


def square_images(n, seed=0):
    """8 x 8 noisy images [n, 64]; label +1: a bright 3 x 3 square in the top-left corner, -1: none."""
    g = torch.Generator().manual_seed(seed)
    X = 0.1 * torch.randn(n, 8, 8, generator=g, dtype=F64)
    y = torch.where(torch.arange(n) % 2 == 0, 1.0, -1.0).to(F64)
    X[y > 0, :3, :3] += 1.0
    return X.reshape(n, 64), y


@pytest.mark.parametrize("action", [None, "checkerboard"])
def test_a_convolutional_classifier_trains_through_the_variational_engine(action):
    geometry = PatchGeometry((8, 8), 3)
    kernel = ConvKernel(RBF(geometry.patch_dim, ard=False, lengthscale=1.0), geometry, location_weights=True)
    act = None if action is None else checkerboard_negation(3, 1)
    model = ConvGP(kernel, 6, act, likelihood="bernoulli").double()
    X, y = square_images(40)
    result = fit(model, X, y, epochs=15, batch_size=20, lr=0.05, progress=False, seed=0)
    losses = [h["loss"] for h in result.history]
    assert losses[-1] < losses[0]
    mean, var = model.predict(X)
    assert (var > 0).all()
    assert (torch.sign(mean) == y).double().mean() >= 0.9

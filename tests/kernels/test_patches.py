"""Image patches, the convolutional (and TICK) kernel, and the patch groups of harmonic convolutional GPs, against
brute-force loops over pixels and patches with the kernels written out by hand."""
import math

import pytest
import torch
from torch.nn import functional

from gpscale.kernels import RBF, Kernel, inverse_softplus
from gpscale.kernels.harmonic import check_invariant, harmonic_kernels
from gpscale.kernels.patches import (ConvKernel, PatchGeometry, checkerboard_negation, extract_patches,
                                     patch_negation, tick_location_kernel)

pytestmark = pytest.mark.usefixtures("one_thread")

F64 = torch.float64
LENGTHSCALE, OUTPUTSCALE = 1.7, 0.8  # patch RBF
LOC_LENGTHSCALE, LOC_OUTPUTSCALE = 2.5, 1.3  # TICK Matérn-3/2


def images(n, shape, seed=0):
    """Images [n, H, W, C] in [0, 1] (float64, seeded)."""
    return torch.rand(n, *shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def set_exact(kernel, lengthscale, outputscale):
    """Hyperparameters in float64 (the constructors store them through float32)."""
    with torch.no_grad():
        kernel.raw_lengthscale.fill_(inverse_softplus(torch.tensor(lengthscale, dtype=F64)))
        kernel.raw_outputscale.fill_(inverse_softplus(torch.tensor(outputscale, dtype=F64)))
    return kernel


def conv_kernel(shape, filter_size, stride=1, padding="valid", weights=False, tick=False, seed=1):
    geometry = PatchGeometry(shape, filter_size, stride, padding)
    patch_kernel = set_exact(RBF(geometry.patch_dim, ard=False).double(), LENGTHSCALE, OUTPUTSCALE)
    location_kernel = set_exact(tick_location_kernel().double(), LOC_LENGTHSCALE, LOC_OUTPUTSCALE) if tick else None
    kernel = ConvKernel(patch_kernel, geometry, location_weights=weights, location_kernel=location_kernel).double()
    if weights:  # away from 1, so that a wrong pairing of weights and patches shows
        with torch.no_grad():
            kernel.patch_weights.copy_(0.5 + torch.rand(geometry.n_patches, generator=torch.Generator()
                                                        .manual_seed(seed), dtype=F64))
    return kernel


# --- brute force ----------------------------------------------------------------------------------------------
def same_pads(size, f, s):
    """TensorFlow's SAME: ceil(size / s) outputs, the padding's floor half before."""
    out = math.ceil(size / s)
    total = max((out - 1) * s + f - size, 0)
    return out, total // 2


def brute_patches(X, filter_size, stride, padding):
    """Patches [n, P, fh fw C] by a loop over patches and pixels, reading zero outside the image; and the patches'
    top-left pixels [P, 2]."""
    n, H, W, C = X.shape
    (fh, fw), (sh, sw) = filter_size, stride
    if padding == "valid":
        (out_h, top), (out_w, left) = ((H - fh) // sh + 1, 0), ((W - fw) // sw + 1, 0)
    else:
        (out_h, top), (out_w, left) = same_pads(H, fh, sh), same_pads(W, fw, sw)
    patches, corners = [], []
    for r in range(out_h):
        for c in range(out_w):
            corners.append((r * sh - top, c * sw - left))
            values = []
            for i in range(fh):
                for j in range(fw):
                    row, col = r * sh + i - top, c * sw + j - left
                    inside = 0 <= row < H and 0 <= col < W
                    values.append(X[:, row, col, :] if inside else torch.zeros(n, C, dtype=X.dtype))
            patches.append(torch.cat(values, -1))
    return torch.stack(patches, 1), torch.tensor(corners, dtype=F64)


def rbf(a, b):
    return OUTPUTSCALE * math.exp(-float(((a - b) ** 2).sum()) / (2 * LENGTHSCALE**2))


def matern32(a, b):
    z = math.sqrt(3.0) * float(((a - b) ** 2).sum().sqrt()) / LOC_LENGTHSCALE
    return LOC_OUTPUTSCALE * (1 + z) * math.exp(-z)


def brute_Kff(kernel, X1, X2):
    """(1/P^2) sum_{p, p'} w_p w_p' k(x^[p], x'^[p']) [k_loc(l_p, l_p')] by loops."""
    g = kernel.geometry
    P1, corners = brute_patches(X1, g.filter, g.stride, g.padding)
    P2, _ = brute_patches(X2, g.filter, g.stride, g.padding)
    w, P = kernel.patch_weights.detach(), g.n_patches
    K = torch.zeros(len(X1), len(X2), dtype=F64)
    for a in range(len(X1)):
        for b in range(len(X2)):
            for p in range(P):
                for q in range(P):
                    loc = matern32(corners[p], corners[q]) if kernel.tick else 1.0
                    K[a, b] += w[p] * w[q] * rbf(P1[a, p], P2[b, q]) * loc / P**2
    return K


def brute_Kuf(kernel, Z, X, locations=None):
    """(1/P) sum_p w_p k(z, x^[p]) [k_loc(l_z, l_p)] by loops: [m, n]."""
    g = kernel.geometry
    patches, corners = brute_patches(X, g.filter, g.stride, g.padding)
    w, P = kernel.patch_weights.detach(), g.n_patches
    K = torch.zeros(len(Z), len(X), dtype=F64)
    for i in range(len(Z)):
        for a in range(len(X)):
            for p in range(P):
                loc = matern32(locations[i], corners[p]) if locations is not None else 1.0
                K[i, a] += w[p] * rbf(Z[i], patches[a, p]) * loc / P
    return K


# --- patch extraction -----------------------------------------------------------------------------------------
GEOMETRIES = [  # image (H, W, C), filter, stride, padding
    ((6, 6, 1), (3, 3), (1, 1), "valid"),
    ((6, 6, 1), (5, 5), (2, 2), "valid"),
    ((7, 6, 2), (3, 2), (2, 1), "same"),
    ((8, 8, 3), (4, 4), (2, 2), "same"),  # even filter: one more padded row after than before
    ((5, 7, 2), (2, 3), (3, 2), "same"),
]


@pytest.mark.parametrize("shape, filter_size, stride, padding", GEOMETRIES)
def test_patches_are_the_brute_force_loop_over_pixels(shape, filter_size, stride, padding):
    X = images(3, shape)
    geometry = PatchGeometry(shape, filter_size, stride, padding)
    expected, corners = brute_patches(X, filter_size, stride, padding)
    assert geometry.n_patches == expected.shape[1] and geometry.patch_dim == expected.shape[2]
    torch.testing.assert_close(geometry.extract(X.reshape(3, -1)), expected, rtol=0, atol=0)
    torch.testing.assert_close(geometry.locations, corners, rtol=0, atol=0)
    if padding == "same":
        assert geometry.out_shape == tuple(math.ceil(s / st) for s, st in zip(shape[:2], stride))
    # the layouts: torch's [n, C, H, W], and [n, H, W] for one channel
    torch.testing.assert_close(extract_patches(X.permute(0, 3, 1, 2), shape, filter_size, stride, padding), expected)
    if shape[2] == 1:
        torch.testing.assert_close(geometry.extract(X[..., 0]), expected)
    # sampled patches are the patches they say they are
    sample, locations = geometry.sample(X.reshape(3, -1), 20, seed=4)
    for patch, location in zip(sample, locations):
        assert any((expected[:, p] == patch).all(-1).any() and (corners[p] == location).all()
                   for p in range(geometry.n_patches))


def test_same_padding_with_odd_filters_and_unit_stride_is_torch_unfold():
    X = images(2, (6, 5, 2))
    unfolded = functional.unfold(X.permute(0, 3, 1, 2), kernel_size=3, padding=1)  # [n, C 3 3, P], order (c, i, j)
    expected = unfolded.reshape(2, 2, 3, 3, -1).permute(0, 4, 2, 3, 1).reshape(2, 30, 18)  # to (i, j, c)
    torch.testing.assert_close(extract_patches(X.reshape(2, -1), (6, 5, 2), 3, 1, "same"), expected)


def test_images_of_the_wrong_shape_and_bad_geometries_are_refused():
    geometry = PatchGeometry((6, 6, 3), 3)
    with pytest.raises(ValueError, match=r"\[n, 108\]"):
        geometry.extract(torch.zeros(2, 100))
    with pytest.raises(ValueError, match=r"\[n, C, H, W\]"):
        geometry.extract(torch.zeros(2, 6, 6, 3))  # channels last is not a layout of 4-D input
    with pytest.raises(ValueError, match="does not fit"):
        PatchGeometry((4, 4), 5)
    with pytest.raises(ValueError, match="padding"):
        PatchGeometry((4, 4), 3, padding="full")


# --- the convolutional kernel ---------------------------------------------------------------------------------
KERNELS = [  # image, filter, stride, padding, learned weights, TICK
    ((6, 6, 1), 3, 1, "valid", False, False),
    ((6, 6, 1), 3, 1, "valid", True, False),
    ((5, 6, 2), 2, 2, "same", True, False),
    ((6, 6, 1), 3, 1, "valid", False, True),
    ((5, 6, 2), (3, 2), (2, 1), "same", True, True),
]


@pytest.mark.parametrize("shape, filter_size, stride, padding, weights, tick", KERNELS)
def test_conv_kernel_is_the_brute_force_double_sum_over_patches(shape, filter_size, stride, padding, weights, tick):
    kernel = conv_kernel(shape, filter_size, stride, padding, weights, tick)
    X1, X2 = images(3, shape, seed=1), images(2, shape, seed=2)
    expected = brute_Kff(kernel, X1, X2)
    torch.testing.assert_close(kernel(X1.reshape(3, -1), X2.reshape(2, -1)), expected, rtol=1e-12, atol=1e-14)
    diag = torch.diagonal(brute_Kff(kernel, X1, X1))
    torch.testing.assert_close(kernel.diag(X1.reshape(3, -1)), diag, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("shape, filter_size, stride, padding, weights, tick", KERNELS)
def test_lifted_cross_covariance_is_the_brute_force_average_over_patches(shape, filter_size, stride, padding,
                                                                        weights, tick):
    kernel = conv_kernel(shape, filter_size, stride, padding, weights, tick)
    X = images(5, shape, seed=3).reshape(5, -1)
    g = torch.Generator().manual_seed(5)
    Z = torch.rand(4, kernel.geometry.patch_dim, generator=g, dtype=F64)
    L = torch.rand(4, 2, generator=g, dtype=F64) * 4 if tick else None
    expected = brute_Kuf(kernel, Z, X.reshape(5, *kernel.geometry.images(X).shape[1:]), L)
    cross = lambda patches: kernel.patch_kernel(Z, patches)  # noqa: E731
    for chunk in (1, 2, 100):  # chunks of images change nothing
        torch.testing.assert_close(kernel.lift(cross, X, L, chunk), expected, rtol=1e-12, atol=1e-14)


def test_learned_location_weights_get_gradients():
    kernel = conv_kernel((6, 6, 1), 3, weights=True, tick=True)
    X = images(3, (6, 6, 1)).reshape(3, -1)
    kernel.diag(X).sum().backward()
    assert kernel.patch_weights.grad.abs().min() > 0
    fixed = conv_kernel((6, 6, 1), 3)
    assert "patch_weights" not in dict(fixed.named_parameters())


# --- groups on patches ----------------------------------------------------------------------------------------
def test_checkerboard_negation_negates_each_pixels_channels_by_the_parity_of_its_position():
    fh, fw, C = 3, 2, 2
    action = checkerboard_negation((fh, fw), C)
    assert action.periods == (2, 2) and action.order == action.n_subkernels == 4
    z = torch.arange(1.0, fh * fw * C + 1, dtype=F64).unsqueeze(0)
    pixel = torch.arange(fh * fw * C) // C  # coordinate -> pixel i fw + j of the [fh, fw, C] patch
    parity = (pixel // fw + pixel % fw) % 2
    for s, (even, odd) in enumerate([(1, 1), (1, -1), (-1, 1), (-1, -1)]):  # s = 2 s_even + s_odd
        sign = torch.where(parity == 0, float(even), float(odd))
        torch.testing.assert_close(action.apply(z, s), z * sign, rtol=0, atol=0)
    with pytest.raises(ValueError, match="d=12"):
        action.apply(torch.zeros(1, 10, dtype=F64), 1)


class OffsetLinear(Kernel):
    """(1 + sum x)(1 + sum x'): PSD but not invariant to negating some of x's coordinates."""

    def forward(self, X1, X2):
        return (1 + X1.sum(-1, keepdim=True)) * (1 + X2.sum(-1)).unsqueeze(0)


@pytest.mark.parametrize("make_action", [patch_negation, lambda: checkerboard_negation(3, 2)])
def test_patch_kernels_are_invariant_and_their_sub_kernels_sum_to_them(make_action):
    action = make_action()
    kernel = set_exact(RBF(18, ard=True).double(), LENGTHSCALE, OUTPUTSCALE)
    with torch.no_grad():  # ARD stays invariant: the groups negate whole coordinates
        kernel.raw_lengthscale.copy_(inverse_softplus(torch.linspace(0.8, 2.0, 18, dtype=F64)))
    g = torch.Generator().manual_seed(0)
    Z, Xp = torch.randn(6, 18, generator=g, dtype=F64), torch.randn(9, 18, generator=g, dtype=F64)
    check_invariant(kernel, action, torch.cat([Z, Xp]))
    with pytest.raises(ValueError, match="not invariant"):
        check_invariant(OffsetLinear(), action, torch.cat([Z, Xp]))
    K_t = harmonic_kernels(kernel, action, Xp, Z)  # [T, n, m]
    torch.testing.assert_close(K_t.sum(0), kernel(Xp, Z), rtol=0, atol=1e-12)


def test_gradients_through_patches_pass_gradcheck():
    """Extraction is a gather, so gradients reach the images (a deeper layer's outputs) as well as Z and the
    positions."""
    kernel = conv_kernel((5, 5, 1), 2, 1, "same", weights=True, tick=True)
    g = torch.Generator().manual_seed(0)
    X = torch.rand(2, 25, generator=g, dtype=F64, requires_grad=True)
    Z = torch.rand(3, 4, generator=g, dtype=F64, requires_grad=True)
    L = (torch.rand(3, 2, generator=g, dtype=F64) * 4).requires_grad_(True)
    lifted = lambda X, Z, L: kernel.lift(lambda patches: kernel.patch_kernel(Z, patches), X, L)  # noqa: E731
    assert torch.autograd.gradcheck(lifted, (X, Z, L))
    assert torch.autograd.gradcheck(kernel.diag, (X,))

"""What a convolutional model builds from its options, shared by the single-layer models
(:mod:`~gpscale.models.conv.convgp`) and the deep one (:mod:`~gpscale.models.conv.deep_conv`): the images' shape
and the convolutional kernel, with errors that name the option, the value and the remedy."""
from __future__ import annotations

import math
import operator

from ...kernels import Kernel, make_kernel
from ...kernels.patches import ConvKernel, PatchGeometry, tick_location_kernel


def resolve_image_shape(image_shape, n_features: int, key: str) -> tuple[int, int, int]:
    """(H, W, C) from ``image_shape`` (H, W) or (H, W, C), one entry of which may be -1 (inferred from the number of
    columns, as in ``numpy.reshape``), checked against the n_features columns of X; None: square single-channel
    images, ``(sqrt(n_features), sqrt(n_features), 1)``."""
    if image_shape is None:
        side = math.isqrt(n_features)
        if side * side == n_features:
            return side, side, 1
        raise ValueError(f"{key} needs image_shape=(H, W) or (H, W, C): the shape of the images whose pixels the rows "
                         f"of X hold, flattened row-major over [H, W, C] (channels last), e.g. image_shape=(32, 32, 3) "
                         f"for CIFAR-10; got none, and the n_features = {n_features} columns of X are not the "
                         "pixels of a square single-channel image, the shape taken when none is given.")
    try:
        shape = [operator.index(s) for s in image_shape]
    except TypeError:
        raise ValueError(f"{key}: image_shape must be (H, W) or (H, W, C) of integers, got {image_shape!r}.") from None
    shape += [1] * (3 - len(shape)) if len(shape) == 2 else []
    if len(shape) != 3 or shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
        raise ValueError(f"{key}: image_shape must be (H, W) or (H, W, C) of positive sizes (one of them may be -1, "
                         f"inferred from the columns of X), got {image_shape!r}.")
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape and n_features % known == 0:
        shape[shape.index(-1)] = n_features // known
    if math.prod(shape) != n_features:
        raise ValueError(f"{key}: image_shape={tuple(image_shape)!r} does not hold the n_features = {n_features} "
                         f"columns of X ({' x '.join(map(str, shape))} pixels): pass the shape of the images that the "
                         "rows of X flatten, row-major over [H, W, C].")
    return tuple(shape)


def conv_kernel(kernel: str | Kernel, geometry: PatchGeometry, location_weights: bool, tick: bool, key: str,
                **patch_options) -> ConvKernel:
    """The convolutional kernel of the options: a ConvKernel given is checked against them and kept; otherwise the
    patch kernel (built by name on patch vectors, or given) is wrapped."""
    if isinstance(kernel, ConvKernel):
        given = {"geometry": kernel.geometry, "location_weights": kernel.location_weights, "tick": kernel.tick}
        options = {"geometry": geometry, "location_weights": location_weights, "tick": tick}
        differ = [name for name in given if given[name] != options[name]]
        if differ:
            raise ValueError(f"{key}: the ConvKernel given has " + ", ".join(f"{n}={given[n]}" for n in differ) +
                             " but the options give " + ", ".join(f"{n}={options[n]}" for n in differ) +
                             ": pass options that describe the kernel, or the patch kernel alone.")
        return kernel
    if isinstance(kernel, Kernel):
        width = getattr(kernel, "n_features", geometry.patch_dim)
        if width != geometry.patch_dim:
            raise ValueError(f"{key}: the patch kernel acts on {width} inputs, but a {geometry.filter} patch of "
                             f"{geometry.channels} channel(s) has {geometry.patch_dim}: build it for patch vectors.")
        patch = kernel
    else:
        patch = make_kernel(kernel, geometry.patch_dim, **patch_options)
    return ConvKernel(patch, geometry, location_weights, tick_location_kernel() if tick else None)

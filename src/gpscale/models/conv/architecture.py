"""The layers of a deep convolutional model from its options: filter sizes, strides and hidden channels per layer
(the HKD paper's Table 3 where left None), and the patch geometry of each layer's input."""
from __future__ import annotations

import operator

from ...kernels.patches import PADDINGS, PatchGeometry
from .from_options import resolve_image_shape

# The HKD paper's CIFAR-10 architectures (its Table 3) by number of layers: filter sizes and strides of every layer,
# output channels of the hidden layers. Its 4-layer net adds mean pooling, which is not built here.
ARCHITECTURES = {1: ((5,), (1,), ()), 2: ((5, 4), (1, 2), (10,)), 3: ((5, 4, 5), (1, 2, 1), (10, 10))}
HIDDEN_CHANNELS = 10  # the channels of every hidden layer of the 2- and 3-layer nets


def _sequence(value, name: str, length: int, key: str, what: str) -> tuple:
    """``value`` as a tuple of ``length`` entries (one per layer), with an error naming the option."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise ValueError(f"{key}: {name} must be a sequence of {length} {what} (one per layer, the input's first), "
                         f"got {value!r}.")
    value = tuple(value)
    if len(value) != length:
        raise ValueError(f"{key}: {name}={value!r} has {len(value)} entries for n_layers={length} layers: give one "
                         f"per layer (the input's first), or leave it None for the HKD paper's (n_layers 1 to 3).")
    return value


def architecture(n_layers, filter_sizes, strides, hidden_channels, key: str):
    """(filter sizes, strides, hidden channels) per layer, the HKD paper's Table 3 where left None."""
    n = operator.index(n_layers)
    table = ARCHITECTURES.get(n)
    if table is None and (filter_sizes is None or strides is None):
        raise ValueError(f"{key}: the HKD paper's architectures have 1 to 3 layers (without pooling); for "
                         f"n_layers={n} pass filter_sizes and strides, one per layer.")
    filters = table[0] if filter_sizes is None else _sequence(filter_sizes, "filter_sizes", n, key,
                                                              "filter sizes (an int or a (height, width) pair)")
    steps = table[1] if strides is None else _sequence(strides, "strides", n, key,
                                                       "strides (an int or a (height, width) pair)")
    if hidden_channels is None:
        channels = (HIDDEN_CHANNELS,) * (n - 1)
    elif isinstance(hidden_channels, int) and not isinstance(hidden_channels, bool):
        channels = (hidden_channels,) * (n - 1)
    else:
        channels = _sequence(hidden_channels, "hidden_channels", n - 1, key, "channel counts")
    for c in channels:
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            raise ValueError(f"{key}: hidden_channels must be an integer >= 1 or one per hidden layer "
                             f"({n - 1} for n_layers={n}), got {hidden_channels!r}.")
    return filters, steps, channels


def layer_geometries(image_shape, n_features: int, filters, strides, channels, padding: str,
                     key: str) -> list[PatchGeometry]:
    """The patches of each layer's input: the image's, then each hidden layer's feature map's; errors name the
    layer, its input's shape and the remedy."""
    if padding not in PADDINGS:
        raise ValueError(f"{key}: padding must be one of {PADDINGS}, got {padding!r}.")
    shape = resolve_image_shape(image_shape, n_features, key)
    geometries = []
    for layer, (f, s) in enumerate(zip(filters, strides)):
        try:
            geometry = PatchGeometry(shape, f, s, padding)
        except (ValueError, TypeError) as error:
            raise ValueError(f"{key}: layer {layer} (filter_sizes[{layer}]={f!r}, strides[{layer}]={s!r}, "
                             f"padding={padding!r}) does not fit its {shape[0]} x {shape[1]} x {shape[2]} input "
                             f"(images of n_features = {n_features} columns; {error}): pass smaller filter sizes or "
                             "strides, fewer layers, or padding='same'.") from None
        geometries.append(geometry)
        if layer < len(channels):
            shape = (*geometry.out_shape, channels[layer])
    return geometries

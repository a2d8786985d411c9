"""Where a model cannot be trusted: rows asked for at prediction that leave the box of the training inputs."""
from __future__ import annotations

import math
import warnings

import torch
from torch import Tensor

from .._stack import user_stacklevel

__all__ = ["ExtrapolationWarning", "warn_outside_box"]


class ExtrapolationWarning(UserWarning):
    """Rows asked for at prediction lie outside the box of the training inputs, where a deep basis kernel's network
    is unconstrained by data."""


def warn_outside_box(X: Tensor, lower: Tensor, upper: Tensor) -> None:
    """Warn (:class:`ExtrapolationWarning`) when rows of X [n*, d] leave the box [lower, upper] (each [d]): how
    many, and the largest excursion, in units of that feature's training range (a feature that was constant in
    training has none: leaving its value counts as the largest excursion, reported as a distance)."""
    lower, upper = lower.to(X.device), upper.to(X.device)  # X may stay on the host for a model on a GPU
    excess = torch.maximum(lower - X, X - upper).clamp_min(0)  # [n*, d]
    outside = (excess > 0).any(-1)
    if not bool(outside.any()):
        return
    span = upper - lower
    relative = (excess / span).nan_to_num(nan=0.0, posinf=math.inf)  # 0 / 0 inside a constant feature's value
    worst = int(relative.amax(0).argmax())
    if span[worst] > 0:
        how_far = f"at most {float(relative[:, worst].max()):.3g} times feature {worst}'s training range beyond it"
    else:
        how_far = (f"feature {worst} took one value in training, and these rows lie up to "
                   f"{float(excess[:, worst].max()):.3g} away from it")
    warnings.warn(
        f"{int(outside.sum())} of {X.shape[0]} rows lie outside the range of the training inputs ({how_far}). A "
        "deep basis kernel is unconstrained by data there: the predicted mean can be far off while its variance "
        "stays small. Check those predictions, or train on data that covers them.", ExtrapolationWarning,
        stacklevel=user_stacklevel())

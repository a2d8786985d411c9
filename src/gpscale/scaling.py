"""Scaling of inputs and targets with training statistics: the one implementation that the data loaders, the
estimators and the benchmark share.

Every method sees X and y scaled affinely, ``(A - shift) / scale`` per column, with the statistics of the training
rows only (of every process's rows under data parallelism), so that a model's defaults (unit lengthscales, unit
signal and noise variances) suit any data set and test rows are mapped exactly as training rows were:

- ``'standard'``: shift the column mean, scale the (population) standard deviation: z-scores;
- ``'minmax'``: shift the midrange, scale the half-range, so the training rows span [-1, 1] (the protocols of papers
  that scale inputs so: DBK and ODVFF);
- ``'center'``: shift the column mean, scale 1 (inputs on a natural scale whose origin matters: images, whose
  pixels the HKD paper centres so that negating a patch is a symmetry about the average patch);
- ``'none'``: shift 0, scale 1 (inputs already on a natural scale: unit vectors, pixel intensities).

A column without spread keeps scale 1, so it maps to a constant (0 under the first three) rather than NaN.
Regression targets are checked for extreme outliers first (:func:`warn_outlying_targets`), which would dominate
their standard deviation.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

from ._stack import user_stacklevel
from .distributed import LOCAL, Comm, row_offset

__all__ = ["OUTLIER_THRESHOLD", "SCALINGS", "OutlierWarning", "Scaling", "fit_scaling", "warn_outlying_targets"]

SCALINGS = ("standard", "minmax", "center", "none")

# robust standard deviations from the median: a Student-t(3) draw lies this far once in 7e8 draws, while one such
# value among n targets inflates their standard deviation about 1000 / sqrt(n) times
OUTLIER_THRESHOLD = 1000.0
_MAD_TO_SD = 1.4826  # the median absolute deviation of a normal sample times this is its standard deviation


class OutlierWarning(UserWarning):
    """Regression targets hold values so far from the others that they dominate the targets' scaling, and so the
    fit (a model may then predict little more than a constant)."""


@dataclass(frozen=True)
class Scaling:
    """``A -> (A - shift) / scale`` with ``shift`` and ``scale`` of shape [d] (or scalars, for targets);
    ``constant`` marks the columns without spread, whose scale is 1."""

    how: str
    shift: np.ndarray
    scale: np.ndarray
    constant: np.ndarray

    def apply(self, A: np.ndarray) -> np.ndarray:
        """Rows A [n, d] (or [n]) scaled."""
        return (np.asarray(A, dtype=np.float64) - self.shift) / self.scale

    def undo(self, A: np.ndarray) -> np.ndarray:
        """Scaled rows back in the original units."""
        return np.asarray(A, dtype=np.float64) * self.scale + self.shift


def fit_scaling(A, how: str = "standard", comm: Comm = LOCAL) -> Scaling:
    """The scaling ``how`` (one of :data:`SCALINGS`) of the training rows A [n, d] (or targets [n]), from every
    process's rows when ``comm`` joins several."""
    if how not in SCALINGS:
        raise ValueError(f"A scaling must be one of {', '.join(map(repr, SCALINGS))}, got {how!r}.")
    A = np.asarray(A, dtype=np.float64)
    if how == "none":
        return Scaling(how, np.zeros(A.shape[1:]), np.ones(A.shape[1:]), np.zeros(A.shape[1:], dtype=bool))
    if how == "minmax":
        low, high = _global_extreme(A.min(axis=0), comm, np.minimum), _global_extreme(A.max(axis=0), comm, np.maximum)
        shift, spread = (high + low) / 2, (high - low) / 2
    else:
        n = _global_sum(np.asarray(float(A.shape[0])), comm)
        shift = _global_sum(A.sum(axis=0), comm) / n
        spread = np.sqrt(_global_sum(((A - shift) ** 2).sum(axis=0), comm) / n)
    scale = np.ones_like(spread) if how == "center" else np.where(spread > 0, spread, 1.0)
    return Scaling(how, shift, scale, spread == 0)


def warn_outlying_targets(y, comm: Comm = LOCAL) -> None:
    """Warn (:class:`OutlierWarning`) when targets y [n] lie further than :data:`OUTLIER_THRESHOLD` robust standard
    deviations from their median, naming how many, up to five of them by their 0-based row of y with their values,
    and what to do. Under data parallelism each process checks its own rows and names them by their global row
    (:func:`gpscale.distributed.row_offset`)."""
    y = np.asarray(y, dtype=np.float64)
    offset = row_offset(len(y), comm)  # on every process: a collective
    rows = np.flatnonzero(robust_z_scores(y) > OUTLIER_THRESHOLD)
    if rows.size == 0:
        return
    how_many = "1 target lies" if rows.size == 1 else f"{rows.size} targets lie"
    shown = ", ".join(f"y[{offset + i}] = {y[i]:.6g}" for i in rows[:5]) + (", ..." if rows.size > 5 else "")
    warnings.warn(
        f"{how_many} over {OUTLIER_THRESHOLD:g} robust standard deviations from the median of y ({shown}): such "
        "values dominate the scaling of y and the fit, which may then predict little more than a constant. Check "
        "those rows; remove them, or transform y (e.g. its logarithm) if such values are real.", OutlierWarning,
        stacklevel=user_stacklevel())


def robust_z_scores(y: np.ndarray) -> np.ndarray:
    """|y - median(y)| [n] in robust standard deviations: 1.4826 times the median of the absolute deviations that
    are not zero, so that targets most of which share one value (counts, zero-inflated data) keep the spread of the
    others; all zeros when every target is the median."""
    deviation = np.abs(y - np.median(y))
    spread = deviation[deviation > 0]
    if spread.size == 0:
        return np.zeros_like(deviation)
    return deviation / (_MAD_TO_SD * np.median(spread))


def _global_sum(a: np.ndarray, comm: Comm) -> np.ndarray:
    if comm.world_size == 1:
        return a
    return comm.all_reduce_sum(torch.as_tensor(np.asarray(a), dtype=torch.float64)).numpy()


def _global_extreme(a: np.ndarray, comm: Comm, reduce) -> np.ndarray:
    if comm.world_size == 1:
        return a
    return reduce.reduce(comm.all_gather(torch.as_tensor(np.asarray(a), dtype=torch.float64)[None]).numpy(), axis=0)

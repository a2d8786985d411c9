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

__all__ = ["OUTLIER_THRESHOLD", "SCALINGS", "ColumnMoments", "OutlierWarning", "Scaling", "fit_scaling", "outlying",
           "robust_centre_and_spread", "warn_outliers",
           "warn_outlying_targets"]

SCALINGS = ("standard", "minmax", "center", "none")

# robust standard deviations from the median: a Student-t(3) draw lies this far once in 7e8 draws, while one such
# value among n targets inflates their standard deviation about 1000 / sqrt(n) times
OUTLIER_THRESHOLD = 1000.0
_MAD_TO_SD = 1.4826  # the median absolute deviation of a normal sample times this is its standard deviation
# rows taken at a time into the statistics: a block small beside the data, large enough to amortise each merge
BLOCK_ROWS = 65_536


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
        """Rows A [n, d] (or [n]) scaled, in float64."""
        return (np.asarray(A, dtype=np.float64) - self.shift) / self.scale

    def apply_into(self, A: np.ndarray, out: torch.Tensor) -> torch.Tensor:
        """Rows A [n, d] scaled into the tensor ``out`` [n, d] (of any dtype), :data:`BLOCK_ROWS` rows at a time:
        the same values as ``apply`` cast to ``out``'s dtype, without a float64 copy of A."""
        for start in range(0, len(A), BLOCK_ROWS):
            out[start:start + BLOCK_ROWS] = torch.from_numpy(self.apply(A[start:start + BLOCK_ROWS]))
        return out

    def undo(self, A: np.ndarray) -> np.ndarray:
        """Scaled rows back in the original units."""
        return np.asarray(A, dtype=np.float64) * self.scale + self.shift


def fit_scaling(A, how: str = "standard", comm: Comm = LOCAL) -> Scaling:
    """The scaling ``how`` (one of :data:`SCALINGS`) of the training rows A [n, d] (or targets [n]), from every
    process's rows when ``comm`` joins several."""
    A = np.asarray(A)
    return ColumnMoments(A.shape[1:]).add(A).scaling(how, comm)


class ColumnMoments:
    """The statistics a scaling needs, gathered from rows given a block at a time (one streamed pass over data that
    need not fit in memory): per column the count n, the mean, the sum of squared deviations from it M2, the least
    and the greatest value. Two sets of rows combine exactly (Chan, Golub and LeVeque's update):

        n = n_a + n_b,  mean = mean_a + (mean_b - mean_a) n_b / n,
        M2 = M2_a + M2_b + (mean_b - mean_a)^2 n_a n_b / n,

    which, unlike a running sum of squares, loses no digits to a column's offset."""

    def __init__(self, shape: tuple[int, ...] = ()):
        self.n = 0
        self.mean, self.m2 = np.zeros(shape), np.zeros(shape)
        self.low, self.high = np.full(shape, np.inf), np.full(shape, -np.inf)

    def add(self, A: np.ndarray) -> ColumnMoments:
        """Take in the rows A [b, d] (or [b]), in float64 blocks of at most :data:`BLOCK_ROWS` rows (a float32 A is
        never copied whole); returns self."""
        A = np.asarray(A)
        for start in range(0, len(A), BLOCK_ROWS):
            block = np.asarray(A[start:start + BLOCK_ROWS], dtype=np.float64)
            mean = block.mean(axis=0)
            self._combine(len(block), mean, ((block - mean) ** 2).sum(axis=0), block.min(axis=0), block.max(axis=0))
        return self

    def _combine(self, n, mean, m2, low, high) -> None:
        total = self.n + n
        delta = mean - self.mean
        self.mean = self.mean + delta * (n / total)
        self.m2 = self.m2 + m2 + delta ** 2 * (self.n * n / total)
        self.n = total
        self.low, self.high = np.minimum(self.low, low), np.maximum(self.high, high)

    def over_processes(self, comm: Comm) -> ColumnMoments:
        """The statistics of every process's rows (the same on every process: combined in rank order)."""
        if comm.world_size == 1:
            return self
        mine = np.concatenate([[float(self.n)], *(np.ravel(a) for a in (self.mean, self.m2, self.low, self.high))])
        gathered = comm.all_gather(torch.as_tensor(mine, dtype=torch.float64)[None]).numpy()
        total = ColumnMoments(self.mean.shape)
        for row in gathered:
            n, rest = int(row[0]), row[1:].reshape(4, *self.mean.shape) if self.mean.shape else row[1:]
            if n:
                total._combine(n, *rest)
        return total

    def scaling(self, how: str, comm: Comm = LOCAL) -> Scaling:
        """The scaling ``how`` (one of :data:`SCALINGS`) of the rows taken in, by every process."""
        if how not in SCALINGS:
            raise ValueError(f"A scaling must be one of {', '.join(map(repr, SCALINGS))}, got {how!r}.")
        shape = self.mean.shape
        if how == "none":
            return Scaling(how, np.zeros(shape), np.ones(shape), np.zeros(shape, dtype=bool))
        stats = self.over_processes(comm)
        if how == "minmax":
            shift, spread = (stats.high + stats.low) / 2, (stats.high - stats.low) / 2
        else:
            shift, spread = stats.mean, np.sqrt(stats.m2 / stats.n)
        scale = np.ones_like(spread) if how == "center" else np.where(spread > 0, spread, 1.0)
        return Scaling(how, shift, scale, spread == 0)


def warn_outlying_targets(y, comm: Comm = LOCAL) -> None:
    """Warn (:class:`OutlierWarning`) when targets y [n] lie further than :data:`OUTLIER_THRESHOLD` robust standard
    deviations from their median, naming how many, up to five of them by their 0-based row of y with their values,
    and what to do. Under data parallelism each process checks its own rows and names them by their global row
    (:func:`gpscale.distributed.row_offset`)."""
    y = np.asarray(y, dtype=np.float64)
    offset = row_offset(len(y), comm)  # on every process: a collective
    rows = outlying(y, *robust_centre_and_spread(y))
    warn_outliers(rows.size, [(offset + i, y[i]) for i in rows[:5]])


def warn_outliers(count: int, shown: list[tuple[int, float]]) -> None:
    """The :class:`OutlierWarning` of ``count`` outlying targets, ``shown`` the first few as (row, value); nothing
    when ``count`` is 0."""
    if count == 0:
        return
    how_many = "1 target lies" if count == 1 else f"{count} targets lie"
    listed = ", ".join(f"y[{row}] = {value:.6g}" for row, value in shown[:5]) + (", ..." if count > 5 else "")
    warnings.warn(
        f"{how_many} over {OUTLIER_THRESHOLD:g} robust standard deviations from the median of y ({listed}): such "
        "values dominate the scaling of y and the fit, which may then predict little more than a constant. Check "
        "those rows; remove them, or transform y (e.g. its logarithm) if such values are real.", OutlierWarning,
        stacklevel=user_stacklevel())


def robust_centre_and_spread(y: np.ndarray) -> tuple[float, float]:
    """The median of y and its robust standard deviation: 1.4826 times the median of the absolute deviations that
    are not zero, so that targets most of which share one value (counts, zero-inflated data) keep the spread of the
    others; 0 when every target is the median."""
    centre = float(np.median(y)) if len(y) else 0.0
    deviation = np.abs(y - centre)
    spread = deviation[deviation > 0]
    return centre, float(_MAD_TO_SD * np.median(spread)) if spread.size else 0.0


def outlying(y: np.ndarray, centre: float, spread: float) -> np.ndarray:
    """The positions of the targets y [n] further than :data:`OUTLIER_THRESHOLD` robust standard deviations
    (``spread``) from ``centre``; none when ``spread`` is 0 (every target is the median)."""
    if spread == 0:
        return np.empty(0, dtype=int)
    return np.flatnonzero(np.abs(np.asarray(y, dtype=np.float64) - centre) > OUTLIER_THRESHOLD * spread)

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
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .distributed import LOCAL, Comm

__all__ = ["SCALINGS", "Scaling", "fit_scaling"]

SCALINGS = ("standard", "minmax", "center", "none")


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


def _global_sum(a: np.ndarray, comm: Comm) -> np.ndarray:
    if comm.world_size == 1:
        return a
    return comm.all_reduce_sum(torch.as_tensor(np.asarray(a), dtype=torch.float64)).numpy()


def _global_extreme(a: np.ndarray, comm: Comm, reduce) -> np.ndarray:
    if comm.world_size == 1:
        return a
    return reduce.reduce(comm.all_gather(torch.as_tensor(np.asarray(a), dtype=torch.float64)[None]).numpy(), axis=0)

"""Checks of the rows given to ``fit`` and ``predict``, in one process or over data-parallel ones."""
from __future__ import annotations

import contextlib
import warnings

import torch

from ..distributed import Comm

__all__ = ["min_rows", "check_global_rows", "as_numpy", "named_blocks"]


def min_rows(comm: Comm) -> int:
    """The rows each process's part of X must have: 2 in one process; 1 under data parallelism, where
    :func:`check_global_rows` counts them all."""
    return 2 if comm.world_size == 1 else 1


def check_global_rows(rows, comm: Comm) -> None:
    """Under data parallelism: at least 2 rows over the processes' parts (this one's: ``rows``, an array or their
    number), and at least 1 in each (the same error on every process)."""
    if comm.world_size == 1:
        return
    counts = comm.all_gather(torch.tensor([rows if isinstance(rows, int) else len(rows)])).tolist()
    if sum(counts) < 2 or min(counts) < 1:
        rows = f"{sum(counts):,} row{'s' if sum(counts) != 1 else ''}"
        raise ValueError(f"The data have {rows}, parted {counts} over {comm.world_size} processes: "
                         "a data-parallel fit needs at least 2 rows in all and 1 on each process. Fit in one "
                         "process, or with fewer processes.")


def as_numpy(a):
    """Torch tensors (on any device, with or without grad) become numpy; everything else passes through."""
    if isinstance(a, torch.Tensor):
        return a.detach().cpu().numpy()
    return a


@contextlib.contextmanager
def named_blocks():
    """Where the rows given to ``predict`` are blocks of a table's columns matched to the fitted features by name
    (arrays, which scikit-learn would warn carry no names)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="X does not have valid feature names")
        yield

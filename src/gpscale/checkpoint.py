"""Training checkpoints that know what they were trained on.

A checkpoint is ``torch.save`` of a dict, written atomically (:func:`gpscale.io.write_atomically`) and read back with
``weights_only=True``. Beside the training state it holds a marker, a format number and a fingerprint:

- of the data: n, d, each column's mean and standard deviation (of X and of y, over every process's rows) and
  ``SAMPLE_ROWS`` rows drawn by global index, the same rows whatever the number of processes;
- of the settings that shape the state: the method, the dtype, the batch size, the learning rate, the seed, the
  validation settings, a fit to convergence's cap of steps (whose last part is cooled down) and whatever the caller
  adds (the estimator: the model's options and the scaling).

Resuming compares the fingerprint saved with the present one and refuses, saying what differs, where they disagree
beyond round-off: a state trained on other rows or with other options would continue silently from the wrong place.
"""
from __future__ import annotations

import math
import os

import torch
from torch import Tensor

from .distributed import Comm, gather_rows, global_count, row_offset
from .io import write_atomically

__all__ = ["CheckpointError", "check_resumable", "data_fingerprint", "read_checkpoint", "write_checkpoint"]

MARKER = "gpscale training checkpoint"
FORMAT = 1
SAMPLE_ROWS = 16
# two fingerprints of the same data agree to this relative tolerance: the statistics are sums in another order on
# another number of processes, and the rows as scaled by statistics that differ in their last bits
RTOL = 1e-5


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed: not a gpscale checkpoint, or written on other data or options."""


def data_fingerprint(X: Tensor, y: Tensor, comm: Comm) -> dict:
    """The fingerprint of the rows X [n_r, d], y [n_r] that every process holds (a collective): ``n``, ``d``, the
    float64 ``mean`` and ``std`` [d + 1] of the columns of [X, y], and ``sample`` [SAMPLE_ROWS, d + 1], the rows of
    global index ``rows``."""
    n = global_count(X.shape[0], comm)
    table = torch.cat([X, y.unsqueeze(-1)], dim=1).double()
    sums = comm.all_reduce_sum(torch.stack([table.sum(0), table.square().sum(0)]))
    mean = sums[0] / max(n, 1)
    std = (sums[1] / max(n, 1) - mean.square()).clamp_min(0.0).sqrt()
    rows = torch.randperm(n, generator=torch.Generator().manual_seed(0))[:SAMPLE_ROWS].sort().values
    X_rows, y_rows = gather_rows(X, y, rows, row_offset(X.shape[0], comm), comm)
    sample = torch.cat([X_rows, y_rows.unsqueeze(-1)], dim=1).double().cpu()
    return {"n": n, "d": X.shape[1], "mean": mean.cpu(), "std": std.cpu(), "rows": rows, "sample": sample}


def write_checkpoint(path: str | os.PathLike, state: dict, data: dict, settings: dict) -> None:
    """Write the training ``state`` with the fingerprints ``data`` (:func:`data_fingerprint`) and ``settings`` (names
    to strings)."""
    checkpoint = {"marker": MARKER, "format": FORMAT, "data": data, "settings": settings, **state}
    write_atomically(path, lambda f: torch.save(checkpoint, f))


def read_checkpoint(path: str | os.PathLike) -> dict:
    """The checkpoint at ``path``; :class:`CheckpointError` (one sentence) when it is not one gpscale can resume."""
    advice = "Give --checkpoint (checkpoint=) a new file, or delete this one to start afresh."
    try:
        checkpoint = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as err:  # noqa: BLE001 - whatever the bytes hold, they are not a checkpoint this can resume
        raise CheckpointError(f"{path} is not a gpscale checkpoint (torch cannot read it: "
                              f"{type(err).__name__}). {advice}") from None
    if isinstance(checkpoint, dict) and {"model", "optimiser", "generator"} <= set(checkpoint) and \
            "marker" not in checkpoint:
        raise CheckpointError(f"{path} was written by an earlier gpscale, without the fingerprint of its data that "
                              f"this one checks before resuming. {advice}")
    if not isinstance(checkpoint, dict) or checkpoint.get("marker") != MARKER:
        raise CheckpointError(f"{path} is not a gpscale checkpoint (a torch file without gpscale's training state). "
                              f"{advice}")
    if checkpoint.get("format", math.inf) > FORMAT:
        raise CheckpointError(f"{path} was written by a newer gpscale (checkpoint format {checkpoint['format']}); "
                              f"upgrade gpscale to resume it. {advice}")
    return checkpoint


def check_resumable(path: str | os.PathLike, checkpoint: dict, data: dict, settings: dict) -> None:
    """Raise :class:`CheckpointError` naming what differs when ``checkpoint`` was written on other data or with
    other settings than ``data`` and ``settings`` (this fit's fingerprints)."""
    differences = _data_differences(checkpoint["data"], data) + _setting_differences(checkpoint["settings"], settings)
    if differences:
        more = f"; and {len(differences) - 3} more differences" if len(differences) > 3 else ""
        raise CheckpointError(f"Cannot resume from {path}: it was written {'; '.join(differences[:3])}{more}. "
                              "Resume with the "
                              "data and options it was written with, or delete it (or give --checkpoint a new file) "
                              "to start afresh.")


def _setting_differences(saved: dict, now: dict) -> list[str]:
    return [f"with {name}={saved.get(name, '(unset)')}, this fit has {name}={now.get(name, '(unset)')}"
            for name in sorted(set(saved) | set(now)) if saved.get(name) != now.get(name)]


def _data_differences(saved: dict, now: dict) -> list[str]:
    if (saved["n"], saved["d"]) != (now["n"], now["d"]):
        return [f"on {saved['n']:,} rows x {saved['d']} features, this fit has {now['n']:,} x {now['d']}"]
    # each column's scale: its spread, or its size where it has none (a constant column's std is round-off)
    scale = torch.stack([saved["std"], now["std"], saved["mean"].abs(), now["mean"].abs()]).amax(0).clamp_min(1e-12)
    for key in ("mean", "std"):
        if not torch.allclose(saved[key] / scale, now[key] / scale, rtol=RTOL, atol=RTOL):
            return [f"on other rows of the same size (the columns' {key}s differ)"]
    if not torch.equal(saved["rows"], now["rows"]) or \
            not torch.allclose(saved["sample"] / scale, now["sample"] / scale, rtol=RTOL, atol=RTOL):
        return ["on other rows of the same size (sampled rows differ)"]
    return []

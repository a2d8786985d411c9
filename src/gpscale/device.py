"""What a pass over data does about the device the model sits on: it moves host rows there without stalling, and
it lets a training step check its numbers without waiting for the device.

Moving rows. A chunked pass (prediction, the linear engine's streamed statistics) may take its rows from host
memory while the model sits on a GPU. :func:`chunks_on` pins the host rows once (an asynchronous copy needs
page-locked memory) and copies each chunk with ``non_blocking=True``, so the host goes on queueing work instead of
waiting for every copy. On the CPU, or for rows already on the model's device, it only splits them.

Deferred checks. A check of a number computed on the device (did a Cholesky factorisation succeed? is the loss
finite?) reads it on the host: the host waits until the device has computed it, and the device then idles until
the host has queued its next work. Inside :func:`deferred_checks`, :func:`check_failed` records the check's failure
flag on the device instead and answers "passed", so the work goes on without waiting. Whoever opened the block
reads all the flags at once at its end (one wait instead of one per check) and, if any check failed, redoes the
work with eager checks, which repair (a Cholesky's jitter) or raise exactly as they would have: the training loop
speculates so over each epoch (:func:`gpscale.train.fit`). :func:`none_set` reads only where reading is free.

Constants. A tensor made on the host and used on the device in every step (a group's matrices) is copied from
pageable memory, which waits for the device as a read does: :class:`HostConstants` copies it to each device once.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator

import torch
from torch import Tensor

__all__ = ["DeferredChecks", "deferred_checks", "check_failed", "none_set", "HostConstants", "chunks_on", "pinned_for",
           "to_device"]


class DeferredChecks:
    """The failure flags of the checks deferred in one :func:`deferred_checks` block, or-ed into one flag on the
    device of the first."""

    def __init__(self) -> None:
        self.flag: Tensor | None = None

    def record(self, failed: Tensor) -> None:
        failed = failed.detach().any()
        # blocks placed on several devices (HVGP) check there: the flag joins the first one's device
        self.flag = failed if self.flag is None else self.flag | failed.to(self.flag.device, non_blocking=True)

    def any_failed(self, like: Tensor) -> Tensor:
        """Whether any check failed, as a 0-dim tensor of ``like``'s dtype and device (0 or 1), not read."""
        return torch.zeros((), dtype=like.dtype, device=like.device) if self.flag is None else self.flag.to(like)


_ACTIVE: ContextVar[DeferredChecks | None] = ContextVar("gpscale_deferred_checks", default=None)


@contextmanager
def deferred_checks() -> Iterator[DeferredChecks]:
    """Within the block, :func:`check_failed` records instead of reading (see the module docstring)."""
    checks = DeferredChecks()
    token = _ACTIVE.set(checks)
    try:
        yield checks
    finally:
        _ACTIVE.reset(token)


def check_failed(failed: Tensor) -> bool:
    """Whether a check failed, given its failure flag ``failed`` (a boolean tensor, True where it failed): read on
    the host now, or, inside :func:`deferred_checks`, recorded for the block's one read and taken as False."""
    checks = _ACTIVE.get()
    if checks is None:
        return bool(failed.any())
    checks.record(failed)
    return False


def none_set(flag: Tensor) -> bool:
    """Whether ``flag`` (a boolean tensor) is known to be all False, for a shortcut past work that no entry needs: read
    on the CPU, where a read costs no wait; elsewhere False without a read, so that the work is done (on a GPU a few
    element-wise kernels cost less than stopping the host until the device has caught up)."""
    return flag.device.type == "cpu" and not bool(flag.any())


class HostConstants:
    """Tensors made once on the host (a group's matrices, weights, index lists), each copied once to every dtype and
    device it is used on: a training step then copies nothing from the host, where each copy from pageable memory
    makes a GPU's host wait for the device."""

    def __init__(self) -> None:
        self._made: dict = {}
        self._copies: dict = {}

    def get(self, key, make: Callable[[], Tensor], dtype: torch.dtype, device: torch.device | None) -> Tensor:
        """The constant ``key`` (made by ``make()`` on first use) in ``dtype`` on ``device``."""
        copy = self._copies.get((key, dtype, device))
        if copy is None:
            if key not in self._made:
                self._made[key] = make()
            copy = self._copies[key, dtype, device] = self._made[key].to(dtype=dtype, device=device)
        return copy


def pinned_for(device: torch.device, rows: Tensor) -> Tensor:
    """``rows`` ready to be copied to ``device``: pinned (one copy, once per pass) when they are to go from host
    memory to a CUDA device; otherwise as they are."""
    if device.type == "cuda" and rows.device.type == "cpu" and not rows.is_pinned():
        return rows.pin_memory()
    return rows


def to_device(rows: Tensor, device: torch.device) -> Tensor:
    """``rows`` on ``device``: copied asynchronously from pinned host memory (:func:`pinned_for`), else as
    ``Tensor.to`` copies; the rows themselves where they are there already."""
    if rows.device == device:
        return rows
    return rows.to(device, non_blocking=rows.is_pinned())


def chunks_on(device: torch.device, chunk_size: int, *tensors: Tensor) -> Iterator[tuple[Tensor, ...]]:
    """The rows of ``tensors`` (which share their first dimension) in chunks of ``chunk_size`` rows, each tuple of
    chunks on ``device``: host rows are pinned once and copied asynchronously (see the module docstring)."""
    staged = [pinned_for(device, t) for t in tensors]
    for chunk in zip(*(t.split(chunk_size) for t in staged)):
        yield tuple(to_device(part, device) for part in chunk)

"""How much memory a device can still give, and a check before an allocation that might not fit.

A matrix of n x n float64 numbers is 8 n^2 bytes: 10 GB at 36,000 rows. Asked for more than the machine has, torch
fails with its allocator's message (or the operating system ends the process), after the work before it was done.
:func:`check_fits` compares the bytes a step is about to allocate with :func:`available_bytes` first and raises
:class:`InsufficientMemoryError` saying what the step needs, what is free and what to do instead.

On the CPU the free memory is the kernel's estimate of what can be allocated without swapping (``MemAvailable`` in
``/proc/meminfo``), less what a control group's limit leaves (``memory.max`` less ``memory.current`` under cgroup v2,
``memory.limit_in_bytes`` less ``memory.usage_in_bytes`` under v1), so a job under a container's or a scheduler's
limit sees its own limit, not the machine's. On a CUDA device it is what the driver reports free plus what torch's
caching allocator holds unused.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import torch

__all__ = ["InsufficientMemoryError", "available_bytes", "check_fits", "check_tensors_fit", "check_tensors_fit_once",
           "gib", "per_process_bytes"]

_CGROUP_V2 = Path("/sys/fs/cgroup")
_CGROUP_V1 = Path("/sys/fs/cgroup/memory")


class InsufficientMemoryError(MemoryError):
    """A step would allocate more memory than its device has free; raised before it allocates anything."""


def gib(n_bytes: float) -> str:
    """``n_bytes`` for messages: GiB with one decimal, or MiB below 1 GiB."""
    if n_bytes < 2**30:
        return f"{n_bytes / 2**20:.1f} MiB"
    return f"{n_bytes / 2**30:.1f} GiB"


def available_bytes(device: torch.device | str = "cpu") -> int:
    """The bytes an allocation on ``device`` can take now (see the module docstring); a very large number where
    the platform reports nothing (not Linux, say), so that the check then lets torch decide."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    if device.type != "cpu":
        return 2**62
    candidates = [_meminfo_available(), _cgroup_room()]
    known = [c for c in candidates if c is not None]
    return min(known) if known else 2**62


def per_process_bytes(device: torch.device | str, comm) -> float:
    """What each process of ``comm`` (a :class:`gpscale.distributed.Comm`) may allocate on its ``device``, the same
    number on every process (a collective): the least free memory over the processes, shared among them on the CPU,
    whose processes are taken to share one machine's memory (each CUDA process has a device of its own)."""
    free = float(available_bytes(device))
    if comm.world_size == 1:
        return free
    least = -float(comm.all_reduce_max(torch.tensor(-free, dtype=torch.float64)))
    return least / comm.world_size if torch.device(device).type == "cpu" else least


def check_fits(n_bytes: float, *, what: str, device: torch.device | str = "cpu", advice: str,
               fraction: float = 0.9) -> None:
    """Raise :class:`InsufficientMemoryError` if ``n_bytes`` exceed ``fraction`` of :func:`available_bytes` on
    ``device``; the message names ``what`` is being allocated, both sizes, and ``advice`` (what to do instead).
    ``fraction`` leaves room for the step's smaller allocations and the rest of the process."""
    free = available_bytes(device)
    if n_bytes > fraction * free:
        raise InsufficientMemoryError(
            f"{what} needs {gib(n_bytes)}, but {torch.device(device).type} memory has {gib(free)} free "
            f"(at most {fraction:.0%} of it is used for one allocation). {advice}")


def check_tensors_fit(shape: tuple[int, ...], dtype: torch.dtype, *, what: str, advice: str,
                      device: torch.device | str = "cpu", copies: int = 1) -> None:
    """:func:`check_fits` for ``copies`` tensors of ``shape`` and ``dtype`` held at once (a matrix, and the copies and
    gradients of its size that the step holds beside it), before any of them is allocated; the message gives
    ``what`` with the shape and the dtype."""
    n_bytes = copies * math.prod(int(s) for s in shape) * dtype.itemsize
    held = " x ".join(f"{int(s):,}" for s in shape) + f" {str(dtype).removeprefix('torch.')}"
    count = f"{copies} matrices of " if copies > 1 else ""
    check_fits(n_bytes, what=f"{what} ({count}{held})", device=device, advice=advice)


def check_tensors_fit_once(checked: set, shape: tuple[int, ...], dtype: torch.dtype, *, what: str, advice: str,
                           device: torch.device | str = "cpu", copies: int = 1) -> None:
    """:func:`check_tensors_fit`, skipped for a (shape, dtype, copies) already in ``checked``, to which a check that
    passes adds it: for the matrices of a training step or a prediction chunk, whose few shapes recur at every step,
    where reading the free memory each time would cost more than a small step."""
    key = (tuple(int(s) for s in shape), dtype, copies)
    if key not in checked:
        check_tensors_fit(shape, dtype, what=what, advice=advice, device=device, copies=copies)
        checked.add(key)


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_room() -> int | None:
    """What this process's memory control group still allows (its limit less its usage); None without a limit."""
    for limit_file, usage_file in ((_cgroup_file("memory.max"), _cgroup_file("memory.current")),
                                   (_CGROUP_V1 / "memory.limit_in_bytes", _CGROUP_V1 / "memory.usage_in_bytes")):
        try:
            limit, usage = limit_file.read_text().strip(), usage_file.read_text().strip()
        except OSError:
            continue
        if limit == "max" or not limit.isdigit() or int(limit) >= 2**60:
            return None
        return max(int(limit) - int(usage), 0)
    return None


def _cgroup_file(name: str) -> Path:
    """``name`` in this process's own cgroup v2 folder (``/proc/self/cgroup`` names it), else in the root."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return _CGROUP_V2 / line[3:].lstrip("/") / name
    except OSError:
        pass
    return _CGROUP_V2 / name if os.path.isdir(_CGROUP_V2) else Path("/nonexistent") / name

"""Keeping a training step's temporaries on glibc's heap, so that their pages are not faulted in afresh every step.

A training step makes and frees the same temporaries every time: kernel matrices and their element-wise passes,
megabytes each (ODVGP's additive kernel, [17, 400, 300] float32, is 8 MB a pass). glibc's malloc serves a request
above its mmap threshold with a fresh mapping and unmaps it on free, and returns free memory at the top of its heap
to the system beyond its trim threshold; either way the next step's tensor of that size touches new pages, and
the kernel faults in and zeroes each 4 KiB of it. glibc raises both thresholds by itself as mapped blocks are freed,
but only to the size of the largest block freed so far, and a step whose temporaries are all about one size keeps
missing: a loop of same-sized tensors faults in fresh pages every pass with glibc's own thresholds, and none with
the ones below.

:func:`keep_temporaries_on_heap` fixes the thresholds at the ceiling glibc's own rule reaches on a 64-bit machine:
requests up to 32 MiB come from the heap, and up to 64 MiB of free heap is kept. Larger tensors are mapped as
before, so that a loop of large temporaries cannot pile up freed blocks on the heap (PyTorch allocates with
``posix_memalign``, whose request does not fit the block a freed tensor of the same size leaves behind).

It acts once per process, on Linux with glibc only, when :func:`gpscale.train.fit` first runs; it is a no-op where
the environment already sets malloc's thresholds (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``,
``MALLOC_TOP_PAD_``) or sets ``GPSCALE_MALLOC=default``. The setting stays for the rest of the process: glibc has
no way back to its dynamic rule.

A training step's temporaries together can outgrow the trim threshold: a step that frees more than that at the top
of the heap has glibc hand it back at the step's end, and the next step faults it in again (thousands of pages a
step at the FLOP floor's paper sizes; the Performance page has the counts). :func:`hold_freed_heap` raises the trim
threshold to :data:`HELD_TRIM_THRESHOLD` while a fit runs, and on leaving sets it back and hands the freed heap to
the system (``malloc_trim``): the fit's memory peak is the same (the step reaches it either way), and the process
does not keep it afterwards.
"""
from __future__ import annotations

import ctypes
import functools
import os
import platform
import sys
import threading
from contextlib import contextmanager

__all__ = ["keep_temporaries_on_heap", "hold_freed_heap", "release_free_heap", "MMAP_THRESHOLD", "TRIM_THRESHOLD",
           "HELD_TRIM_THRESHOLD"]

# mallopt's parameter numbers (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit machines: its own rule's ceiling
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # where glibc's dynamic rule puts the trim threshold beside it
HELD_TRIM_THRESHOLD = 1 << 30  # while a fit runs: above any step's temporaries short of a GiB (mallopt takes an int)

_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
_applied: bool | None = None
_holders = 0  # fits running now (nested ones included): the threshold goes back when the last one leaves
_holders_lock = threading.Lock()


@functools.cache
def _libc():
    """glibc, or None off glibc (looked up once)."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def _mallopt():
    """glibc's ``mallopt``, or None off glibc."""
    return getattr(_libc(), "mallopt", None)


def _malloc_trim():
    """glibc's ``malloc_trim``, or None off glibc."""
    return getattr(_libc(), "malloc_trim", None)


def release_free_heap() -> None:
    """Hand the heap's free memory back to the system (glibc's ``malloc_trim``); nothing off glibc."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def keep_temporaries_on_heap() -> bool:
    """Set glibc's mmap and trim thresholds to :data:`MMAP_THRESHOLD` and :data:`TRIM_THRESHOLD`, once per process
    (see the module docstring). Returns whether this process's thresholds are gpscale's."""
    global _applied
    if _applied is None:
        wanted = os.environ.get("GPSCALE_MALLOC", "tuned")
        if wanted not in ("tuned", "default"):
            raise ValueError(f"GPSCALE_MALLOC must be 'tuned' or 'default', got {wanted!r}: unset it for gpscale's "
                             "malloc thresholds, or set it to 'default' to leave glibc's own.")
        _applied = False
        mallopt = _mallopt() if wanted == "tuned" and not any(v in os.environ for v in _USER_SETTINGS) else None
        if mallopt is not None:
            _applied = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD,
                                                                                          TRIM_THRESHOLD))
    return _applied


@contextmanager
def hold_freed_heap():
    """``with hold_freed_heap(): ...``: freed memory at the top of the heap is kept up to
    :data:`HELD_TRIM_THRESHOLD` within the block, so that each training step reuses the pages of the step before
    it; when the outermost such block ends, the trim threshold is :data:`TRIM_THRESHOLD` again and the heap's free
    memory goes back to the system. Sets :func:`keep_temporaries_on_heap`'s thresholds first; does nothing where
    those are not gpscale's (off glibc, or the user's own settings). The threshold is the process's: memory other
    threads free meanwhile is held too, and a process forked inside the block starts with it raised."""
    global _holders
    held = keep_temporaries_on_heap()
    if held:
        with _holders_lock:
            _holders += 1
            if _holders == 1:
                _mallopt()(_M_TRIM_THRESHOLD, HELD_TRIM_THRESHOLD)
    try:
        yield
    finally:
        if held:
            with _holders_lock:
                _holders -= 1
                if _holders == 0:
                    _mallopt()(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
                    release_free_heap()

"""Peak memory of a block of code: resident memory on the CPU, allocated memory on a CUDA device."""
from __future__ import annotations

import threading
from pathlib import Path

import torch

from ..heap import release_free_heap

__all__ = ["PeakMemory"]

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kb(field: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


class PeakMemory:
    """``with PeakMemory(device) as peak: ...`` then ``peak.mb`` is the peak memory the block added, in MiB.

    On Linux the kernel's resident high-water mark (VmHWM) is reset on entry (``/proc/self/clear_refs``), so the
    peak is exact and costs nothing; elsewhere a thread samples the resident size every 5 ms. On CUDA the
    allocator's peak statistics are used. The number excludes memory held before the block (data already loaded).
    """

    def __init__(self, device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        self.mb: float | None = None

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            return self
        release_free_heap()  # what earlier runs freed, which would hide this run's peak in resident memory
        self._base = _status_kb("VmRSS")
        self._sampler = None
        try:
            _CLEAR_REFS.write_text("5")
        except OSError:
            self._start_sampler()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.mb = (torch.cuda.max_memory_allocated(self.device) - self._base) / 2**20
            return
        if self._sampler is not None:
            self._stop.set()
            self._sampler.join()
            peak = self._peak
        else:
            peak = _status_kb("VmHWM")
        if peak is not None and self._base is not None:
            self.mb = max(0, peak - self._base) / 1024

    def _start_sampler(self) -> None:
        self._peak = self._base or 0
        self._stop = threading.Event()

        def sample():
            while not self._stop.wait(0.005):
                self._peak = max(self._peak, _status_kb("VmRSS") or 0)

        self._sampler = threading.Thread(target=sample, daemon=True)
        self._sampler.start()

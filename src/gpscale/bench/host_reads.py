"""Where a computation reads device numbers on the host: the places where, on a GPU, the host would wait for the
device (a synchronisation) and the device then idle until the host has queued its next work.

:func:`host_reads` runs a function under a dispatch mode and a function mode that record each such read, with the
gpscale line that made it: a value read into Python (``.item()``, ``float(t)``, ``if t:``, ``.tolist()``,
``.numpy()``, ``.cpu()``), an output whose size depends on values (``nonzero``, ``unique``, ``masked_select``) and a
linear-algebra call that raises on its own status (``torch.linalg.solve``, ``eigh``). On the CPU these reads cost
nothing, but they are where a GPU run would wait, so a test on a machine without one can count them: what
``tests/test_device.py`` does for one training step of every method. Reads inside ``torch.optim`` are left out:
Adam keeps its step counters on the host, so reading them waits for nothing.
"""
from __future__ import annotations

import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["HostRead", "host_reads", "READING_OPERATORS", "READING_METHODS"]

aten = torch.ops.aten

#: Operators that read their input's values on the host (through the dispatcher, on any device).
READING_OPERATORS = frozenset({
    aten._local_scalar_dense, aten.nonzero, aten.masked_select, aten._unique2, aten.unique_dim,
    aten.unique_consecutive, aten._linalg_check_errors, aten._linalg_eigh, aten.cholesky_inverse, aten.equal,
    aten.is_nonzero,
})
#: Tensor methods that copy values to the host without an operator the dispatch mode sees on the CPU.
READING_METHODS = frozenset({torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.cpu})

_PACKAGE = Path(__file__).resolve().parents[1]
_TORCH = str(Path(torch.__file__).parent)
_TORCH_OPTIM = str(Path(torch.optim.__file__).parent)


@dataclass(frozen=True)
class HostRead:
    """One read: the operator or method, and the innermost frame outside torch that made it (its file relative to
    the package when it is gpscale's)."""

    operation: str
    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.operation} in {self.function} ({self.file}:{self.line})"


def _caller(operation: str) -> HostRead | None:
    """The read ``operation`` with the frame that made it; None for a read inside torch.optim."""
    stack = traceback.extract_stack()
    if any(frame.filename.startswith(_TORCH_OPTIM) for frame in stack):
        return None
    frame = next(frame for frame in reversed(stack)
                 if not frame.filename.startswith(_TORCH) and frame.filename != __file__)
    path = Path(frame.filename)
    file = str(path.relative_to(_PACKAGE)) if path.is_relative_to(_PACKAGE) else path.name
    return HostRead(operation, file, frame.lineno, frame.name)


class _ReadingOperators(TorchDispatchMode):
    def __init__(self, reads: list[HostRead]):
        super().__init__()
        self.reads = reads

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        boolean_index = func is aten.index.Tensor and any(
            index is not None and index.dtype == torch.bool for index in args[1])
        if func._overloadpacket in READING_OPERATORS or boolean_index:
            read = _caller(str(func._overloadpacket))
            if read is not None:
                self.reads.append(read)
        return func(*args, **(kwargs or {}))


class _ReadingMethods(TorchFunctionMode):
    def __init__(self, reads: list[HostRead]):
        super().__init__()
        self.reads = reads

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in READING_METHODS:
            read = _caller(f"Tensor.{func.__name__}")
            if read is not None:
                self.reads.append(read)
        return func(*args, **(kwargs or {}))


def host_reads(fn) -> list[HostRead]:
    """The host reads of calling ``fn()`` once, in order (see the module docstring)."""
    reads: list[HostRead] = []
    with _ReadingMethods(reads), _ReadingOperators(reads):
        fn()
    return reads

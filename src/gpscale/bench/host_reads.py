"""Where a computation reads device numbers on the host: the places where, on a GPU, the host would wait for the
device (a synchronisation) and the device then idle until the host has queued its next work.

:func:`host_reads` runs a function under a dispatch mode and a function mode that record each such read, with the
gpscale line that made it: a value read into Python (``.item()``, ``float(t)``, ``if t:``, ``.tolist()``,
``.numpy()``, ``.cpu()``), an output whose size depends on values (``nonzero``, ``unique``, ``masked_select``) and a
linear-algebra call that raises on its own status (``torch.linalg.solve``, ``eigh``). On the CPU these reads cost
nothing, but they are where a GPU run would wait, so a test on a machine without one can count them: what
``tests/test_device.py`` does for one training step of every method. Reads inside ``torch.optim`` are left out:
Adam keeps its step counters on the host, so reading them waits for nothing.

It records copies between the host and a device too: to the host (a read), and from pageable host memory to the
device (``.to(device)`` of a CPU tensor, ``torch.tensor(data, device=...)``), which torch makes wait for the device
(only a copy from pinned memory with ``non_blocking=True`` does not), those that indexing makes among them (an
index given as a list or a host tensor, a number assigned to one element: ``c[0] = 1.0``). Those show only where
the model is on a device other than the CPU: the meta device serves on a machine without a GPU.
"""
from __future__ import annotations

import numbers
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
        kwargs = kwargs or {}
        boolean_index = func is aten.index.Tensor and any(
            index is not None and index.dtype == torch.bool for index in args[1])
        if func._overloadpacket in READING_OPERATORS or boolean_index:
            self._record(str(func._overloadpacket))
        elif func is aten._to_copy.default and kwargs.get("device") is not None:
            self._record_copy(args[0], torch.device(kwargs["device"]), kwargs.get("non_blocking", False))
        elif func._overloadpacket is aten.copy_:
            self._record_copy(args[1], args[0].device, kwargs.get("non_blocking", args[2] if len(args) > 2 else False))
        return func(*args, **kwargs)

    def _record(self, operation: str) -> None:
        read = _caller(operation)
        if read is not None:
            self.reads.append(read)

    def _record_copy(self, source, destination: torch.device, non_blocking: bool) -> None:
        """A copy that waits: to the host, or to a device from pageable host memory."""
        if source.device.type != "cpu" and destination.type == "cpu":
            self._record(f"copy from {source.device.type} to the host")
        elif source.device.type == "cpu" and destination.type != "cpu" and not (non_blocking and source.is_pinned()):
            self._record(f"copy from the host to {destination.type}")


class _ReadingMethods(TorchFunctionMode):
    def __init__(self, reads: list[HostRead]):
        super().__init__()
        self.reads = reads

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in READING_METHODS:
            operation = f"Tensor.{func.__name__}"
        elif func in (torch.tensor, torch.as_tensor) and not torch.is_tensor(args[0]) and \
                torch.device(kwargs.get("device") or "cpu").type != "cpu":  # made on the host, then copied
            operation = f"torch.{func.__name__} onto {torch.device(kwargs['device']).type}"
        elif func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and _from_the_host(func, *args):
            operation = f"Tensor.{func.__name__} {_from_the_host(func, *args)} from the host"
        else:
            return func(*args, **kwargs)
        read = _caller(operation)
        if read is not None:
            self.reads.append(read)
        return func(*args, **kwargs)


def _from_the_host(func, tensor, index, value=None) -> str | None:
    """What an indexing of a tensor off the host copies from the host, which torch then makes wait for the device:
    an index given as a sequence (a list, a range) or as a host tensor of indices, or a Python number assigned to a
    single element (``c[0] = 1.0``: torch copies the number from pageable memory into the element; assigned to
    several elements, ``c[1:] = 1.0``, it fills them, no copy; an assigned host tensor is the copy operator's,
    recorded there). None when it copies nothing: numbers, slices and 0-dim host tensors as indices (torch reads
    the last on the host), device tensors."""
    if tensor.device.type == "cpu":
        return None
    parts = index if isinstance(index, tuple) else (index,)
    if any(isinstance(part, (list, range)) or (torch.is_tensor(part) and part.device.type == "cpu" and part.ndim)
           for part in parts):
        return "with an index"
    one_element = all(isinstance(part, int) for part in parts) and len(parts) == tensor.ndim
    if func is torch.Tensor.__setitem__ and isinstance(value, numbers.Number) and one_element:
        return "of a number"
    return None


def host_reads(fn) -> list[HostRead]:
    """The host reads of calling ``fn()`` once, in order (see the module docstring)."""
    reads: list[HostRead] = []
    with _ReadingMethods(reads), _ReadingOperators(reads):
        fn()
    return reads

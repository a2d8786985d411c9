"""Communication between data-parallel processes.

Every full-data reduction in gpscale goes through a ``Comm``, so the same model code runs in one process
(:class:`LocalComm`, where each reduction is the identity) and under torchrun (:class:`TorchComm`: gloo on CPU,
nccl on GPU). Each process holds a shard of the rows; ``rank`` and ``world_size`` say which.

Under torchrun::

    comm = TorchComm.from_env()          # reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    fit(model, X_shard, y_shard, comm=comm)
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TypeVar

import torch
from torch import Tensor, nn

__all__ = ["Comm", "LocalComm", "TorchComm", "LOCAL", "agree", "global_count", "row_offset", "gather_rows",
           "broadcast_state", "leave_job"]

T = TypeVar("T")
_STARTED_HERE = False  # whether TorchComm.from_env created the process group, which leave_job then destroys


class Comm:
    """The collective operations gpscale needs. ``rank`` and ``world_size`` describe this process."""

    rank: int = 0
    world_size: int = 1

    def all_reduce_sum(self, tensor: Tensor) -> Tensor:  # pragma: no cover - interface
        """The sum of ``tensor`` over all processes, as a new tensor (differentiable: the gradient with respect to
        each process's input is the sum of the gradients with respect to the output over processes)."""
        raise NotImplementedError

    def all_reduce_max(self, tensor: Tensor) -> Tensor:  # pragma: no cover - interface
        """The maximum of a scalar ``tensor`` over all processes, as a new tensor; differentiable as ``torch.max``
        is: the gradient (summed over processes) goes to the lowest rank holding the maximum."""
        raise NotImplementedError

    def broadcast(self, tensor: Tensor, src: int = 0) -> Tensor:  # pragma: no cover - interface
        """``tensor`` overwritten in place with process ``src``'s values; returned."""
        raise NotImplementedError

    def all_gather(self, tensor: Tensor) -> Tensor:  # pragma: no cover - interface
        """Every process's ``tensor`` [n_r, ...] concatenated along dim 0 in rank order (n_r may differ);
        differentiable."""
        raise NotImplementedError

    def barrier(self) -> None:  # pragma: no cover - interface
        """Wait until every process gets here."""
        raise NotImplementedError


class LocalComm(Comm):
    """A single process: every reduction returns its input."""

    def all_reduce_sum(self, tensor: Tensor) -> Tensor:
        return tensor

    def all_reduce_max(self, tensor: Tensor) -> Tensor:
        return tensor

    def broadcast(self, tensor: Tensor, src: int = 0) -> Tensor:
        return tensor

    def all_gather(self, tensor: Tensor) -> Tensor:
        return tensor

    def barrier(self) -> None:
        pass


LOCAL = LocalComm()


def global_count(n: int, comm: Comm) -> int:
    """The sum over processes of a count ``n`` (rows, say): in one process n itself, with no tensor to read back
    (a read that, in a training step on a GPU, would wait for the device); under data parallelism an all-reduce."""
    if comm.world_size == 1:
        return n
    return int(comm.all_reduce_sum(torch.tensor(float(n), dtype=torch.float64)).item())


def row_offset(n: int, comm: Comm) -> int:
    """The global index of this process's first row, when the processes hold n_0, n_1, ... rows in rank order."""
    if comm.world_size == 1:
        return 0
    return int(sum(comm.all_gather(torch.tensor([n])).tolist()[: comm.rank]))


def gather_rows(X: Tensor, y: Tensor, rows: Tensor, offset: int, comm: Comm) -> tuple[Tensor, Tensor]:
    """The global rows ``rows`` [B] of every process's (X [n_r, d], y [n_r]), in the order of ``rows``, on every
    process: each fills in the rows it holds (its first at global index ``offset``) and a sum over the processes
    completes them (B (d + 1) numbers)."""
    here = ((rows >= offset) & (rows < offset + X.shape[0])).to(X.device)
    batch = torch.zeros(rows.shape[0], X.shape[1] + 1, dtype=X.dtype, device=X.device)
    local = rows.to(X.device)[here] - offset
    batch[here] = torch.cat([X[local], y[local].unsqueeze(-1)], dim=1)
    batch = comm.all_reduce_sum(batch)
    return batch[:, :-1], batch[:, -1]


def agree(comm: Comm, check: Callable[[], T]) -> T:
    """``check()`` on every process (a collective): its result where it succeeds on every process; where it raises
    on any (a check of this process's rows, say), every process raises: the failing ones their own error, the others
    a ValueError naming the first failing process and its error. So that a data-parallel job whose data fail a
    check on one shard ends on every process with the reason, instead of the others waiting in their next
    collective."""
    if comm.world_size == 1:
        return check()
    try:
        result, error = check(), None
    except Exception as err:  # noqa: BLE001 - whatever the check raises, every process must learn of it
        result, error = None, err
    text = "" if error is None else f"{type(error).__name__}: {error}"  # never empty for an error
    message = torch.tensor(list(text.encode("utf-8")), dtype=torch.uint8)
    sizes = comm.all_gather(torch.tensor([message.numel()])).tolist()
    texts = comm.all_gather(message).tolist()
    if error is not None:
        raise error
    failed = next((rank for rank, size in enumerate(sizes) if size), None)
    if failed is not None:
        start = sum(sizes[:failed])
        raise ValueError(f"process {failed}: {bytes(texts[start:start + sizes[failed]]).decode('utf-8')}")
    return result


def process_device(device: str) -> str:
    """This process's device: "cuda" becomes the GPU of torchrun's LOCAL_RANK (one GPU per process); anything
    else (cpu, cuda:1) is kept."""
    return f"cuda:{os.environ.get('LOCAL_RANK', 0)}" if device == "cuda" else device


class TorchComm(Comm):
    """The processes of a ``torch.distributed`` group (the default group unless ``group`` is given).

    Float64 reductions are exact in the sense that every process gets bitwise the same result; the sum's rounding
    differs from a one-process sum by float64 round-off only.
    """

    def __init__(self, group=None):
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised: launch with torchrun and create the comm with "
                               "TorchComm.from_env(), or call torch.distributed.init_process_group first.")
        self._dist = dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        # nccl reduces CUDA tensors only; a CPU tensor (a row count, say) travels through this process's GPU
        nccl = dist.get_backend(group) == "nccl"
        self.device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")

    @classmethod
    def from_env(cls, device: str = "cpu") -> TorchComm:
        """Join the job: the process group this process already initialised, else the one torchrun describes in
        the environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), started with the backend that suits
        ``device``: nccl for CUDA, gloo for the CPU (also on a machine that has GPUs)."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():  # the caller already started the job: join it
            return cls()
        missing = [name for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
        if missing:
            raise RuntimeError(f"The environment lacks {', '.join(missing)}: start the job with torchrun, e.g. "
                               "`torchrun --nproc-per-node 2 -m gpscale fit ... --distributed`.")
        global _STARTED_HERE
        cuda = torch.device(device).type == "cuda"
        if cuda:
            torch.cuda.set_device(process_device(device))
        dist.init_process_group("nccl" if cuda else "gloo")
        _STARTED_HERE = True
        return cls()

    def all_reduce_sum(self, tensor: Tensor) -> Tensor:
        return _AllReduceSum.apply(tensor, self)

    def all_reduce_max(self, tensor: Tensor) -> Tensor:
        values = self.all_gather(tensor.detach().reshape(1))
        return _Select.apply(tensor, self, int(values.argmax()), values.max())

    def broadcast(self, tensor: Tensor, src: int = 0) -> Tensor:
        staged = self._staged(tensor)
        self._dist.broadcast(staged, src, group=self.group)
        if staged is not tensor:
            tensor.copy_(staged)
        return tensor

    def all_gather(self, tensor: Tensor) -> Tensor:
        sizes = torch.zeros(self.world_size, dtype=torch.long, device=tensor.device)
        sizes[self.rank] = tensor.shape[0]
        return _AllGather.apply(tensor, self, self.all_reduce_sum(sizes).tolist())

    def _gather(self, tensor: Tensor, sizes: list[int]) -> Tensor:
        # the collective needs equal shapes: pad every part to the longest, then cut each back
        padded = tensor.new_zeros((max(sizes), *tensor.shape[1:]))
        padded[: tensor.shape[0]] = tensor
        padded = self._staged(padded)
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        self._dist.all_gather(parts, padded, group=self.group)
        return torch.cat([part[:size] for part, size in zip(parts, sizes)]).to(tensor.device)

    def _sum(self, tensor: Tensor) -> Tensor:
        out = self._staged(tensor.detach().clone().contiguous())
        self._dist.all_reduce(out, group=self.group)
        return out.to(tensor.device)

    def _staged(self, tensor: Tensor) -> Tensor:
        """``tensor`` on the device the backend reduces on (itself where it is there already)."""
        return tensor if tensor.device == self.device else tensor.to(self.device)

    def barrier(self) -> None:
        self._dist.barrier(group=self.group)


class _AllReduceSum(torch.autograd.Function):
    """y = sum_r x_r on every process. Each process's loss depends on y, so d(sum of losses)/d x_r is the sum over
    processes of dL_p/dy: the backward pass is an all-reduce too."""

    @staticmethod
    def forward(ctx, tensor: Tensor, comm: TorchComm) -> Tensor:
        ctx.comm = comm
        return comm._sum(tensor)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return ctx.comm._sum(grad), None


class _AllGather(torch.autograd.Function):
    """y = [x_0; x_1; ...] on every process; the gradient for x_r is its rows of the summed upstream gradients."""

    @staticmethod
    def forward(ctx, tensor: Tensor, comm: TorchComm, sizes: list[int]) -> Tensor:
        ctx.comm, ctx.sizes = comm, sizes
        return comm._gather(tensor.detach().contiguous(), sizes)

    @staticmethod
    def backward(ctx, grad: Tensor):
        first = sum(ctx.sizes[: ctx.comm.rank])
        return ctx.comm._sum(grad)[first:first + ctx.sizes[ctx.comm.rank]], None, None


class _Select(torch.autograd.Function):
    """y = x_{r*} on every process (the all-gathered value of rank r*); the gradient for x_{r*} is the summed
    upstream gradients, and every other rank's is 0."""

    @staticmethod
    def forward(ctx, tensor: Tensor, comm: TorchComm, owner: int, value: Tensor) -> Tensor:
        ctx.comm, ctx.owner = comm, owner
        return value.reshape(tensor.shape).clone()

    @staticmethod
    def backward(ctx, grad: Tensor):
        total = ctx.comm._sum(grad)
        return (total if ctx.comm.rank == ctx.owner else torch.zeros_like(total)), None, None, None


def broadcast_state(module: nn.Module, comm: Comm, src: int = 0) -> None:
    """Give every process ``src``'s parameters and buffers (after a data-dependent initialisation on ``src``),
    through ``load_state_dict``, so that modules which derive state from their buffers rebuild it."""
    if comm.world_size == 1:
        return
    state = {name: comm.broadcast(value.detach().clone(), src) if torch.is_tensor(value) else value
             for name, value in module.state_dict().items()}
    module.load_state_dict(state)


def leave_job(code: int) -> int:
    """End this process's part of the data-parallel job that :meth:`TorchComm.from_env` joined, if it did: after
    success wait for every process and destroy the process group; then, whatever ``code``, exit with it at once,
    without the interpreter's finalisation. Otherwise return ``code``.

    Why at once: a gloo worker thread releases each finished collective's tensors after the collective returns,
    and releasing a tensor that Python created takes the interpreter's lock. If the interpreter is already shutting
    down, that thread is cancelled inside a C++ destructor and the C++ runtime aborts the process ("terminate called
    without an active exception", SIGABRT) after its work is done, which torchrun reports as a failed job: about
    one two-process run of ``gpscale fit`` in 20-50 with torch 2.13, with or without the group destroyed first.
    Standard output and error are flushed first; the command has closed every file it wrote."""
    global _STARTED_HERE
    import torch.distributed as dist

    if not (_STARTED_HERE and dist.is_initialized()):
        return code
    if code == 0:  # after a failure another process may never reach the barrier: leave without it
        dist.barrier()
        dist.destroy_process_group()
    _STARTED_HERE = False
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


"""One epoch of Adam (with the model's natural-gradient steps): its optimiser steps over the epoch's batches,
speculated without waiting for the device, and undone and run again where a deferred check failed."""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch
from torch import Tensor, nn

from ..device import check_failed, deferred_checks
from ..distributed import Comm, gather_rows
from ..models.base import GPModel
from ..preemption import StopRequest
from ..sources import MappedRows
from .batches import Batch, Shard, epoch_batches
from .checkpointing import snapshot
from .result import TrainingError

__all__ = ["Objective", "EpochRun", "run_epoch"]


class Objective(nn.Module):
    """The model's minibatch loss, weighted by this process's share of the global batch, as a module's forward
    (what DistributedDataParallel wraps)."""

    def __init__(self, model: GPModel):
        super().__init__()
        self.model = model

    def forward(self, X: Tensor, y: Tensor, num_data: int, weight: float, comm: Comm,
                share: float | None = None) -> Tensor:
        """``weight`` times the model's loss on (X [b, d], y [b]); ``share`` is this process's share of the global
        batch (default ``weight / world_size``), which a variational model's natural-gradient step scales by."""
        share = weight / comm.world_size if share is None else share
        # every rank evaluates its part, rows or not, so that it joins the collectives the loss takes
        loss = weight * self.model.training_loss(X, y, num_data=num_data, comm=comm, share=share)
        return loss + self._zero() if X.shape[0] == 0 else loss

    def _zero(self) -> Tensor:
        """For a rank without rows of the batch: a zero that still reaches every parameter, with a separate zero
        gradient tensor each (sum(p.sum()) * 0 would hand 0-dim parameters views of one tensor, which
        DistributedDataParallel's bucket copies then mix up)."""
        return sum((p * 0.0).sum() for p in self.model.parameters() if p.requires_grad)


def _step(objective, X, y, batch: Batch, optimiser, shard: Shard, comm: Comm,
          mapped: MappedRows | None = None) -> Tensor:
    """One optimiser step on ``batch``, after the model's own steps (GPModel.training_loss); returns the
    global batch's loss, not read on the host. Rows of a ``mapped`` X are read with its ``take`` (or, gathered,
    given back after)."""
    if batch.rows is None:
        xb, yb = X, y
    elif batch.gathered:
        xb, yb = gather_rows(X, y, batch.rows, shard.offset, comm)
        if mapped is not None:
            mapped.release()
    elif mapped is not None:
        xb, yb = mapped.take(batch.rows)
    else:
        xb, yb = X[batch.rows], y[batch.rows]
    optimiser.zero_grad(set_to_none=True)
    # the ranks' weighted losses sum to the loss of the global batch; DDP averages gradients, so scale by W
    loss = objective(xb, yb, shard.n_global, batch.share * comm.world_size, comm, batch.share)
    global_loss = comm.all_reduce_sum(loss.detach() / comm.world_size)
    if check_failed(~torch.isfinite(global_loss)):
        raise TrainingError(f"the loss became {global_loss.item()}.")
    loss.backward()
    optimiser.step()
    return global_loss


class EpochRun(NamedTuple):
    """What :func:`run_epoch` did: the sum of its steps' losses, the steps taken (all ``n_steps`` of the epoch
    unless asked to stop), and whether it speculated in vain and ran again."""

    total: float
    steps: int
    n_steps: int
    redone: bool


def run_epoch(model, objective, X, y, optimiser, generator, batch_size, shard: Shard, comm: Comm,
              speculate: bool = True, first_step: int = 0, stop: StopRequest | None = None,
              mapped: MappedRows | None = None, sample: int | None = None,
              rate: Callable[[int], None] | None = None) -> EpochRun:
    """One pass, from its step ``first_step`` (a resumed epoch), ending before any step when ``stop`` asks (a
    collective under data parallelism: every process ends at the same step), reading rows from ``mapped`` as
    :func:`~gpscale.train.fit` says; over the first ``sample`` rows of its permutation only, where given (a round);
    ``rate(step)`` sets the learning rate before each step (its index in the epoch), where given. The losses are
    the global batch's.

    Speculating, the steps never wait for the device: every check inside them (that a Cholesky factorisation
    succeeded, that the loss is finite) is deferred (:func:`gpscale.device.deferred_checks`) and the losses are
    summed on the device, so the epoch reads the host once, after its last step. If a check failed, the epoch is
    undone (the model, the optimiser and the random state put back as they were at its start) and run again with
    every check read where it is made, which adds jitter, halves a natural-gradient step or raises at the step
    where it would have without speculation: the result is the same either way."""
    batches = epoch_batches(model, X, generator, batch_size, shard, comm, sample)

    def run() -> tuple[Tensor, int]:
        total = torch.zeros((), dtype=torch.float64, device=X.device)
        for step in range(first_step, len(batches)):
            if stop is not None and stop.pending(comm):
                return total, step
            if rate is not None:
                rate(step)
            total = total + _step(objective, X, y, batches[step], optimiser, shard, comm, mapped)
        return total, len(batches)

    if speculate:
        undo = _undoer(model, optimiser, X.device)
        total, steps, failed = _speculate(run, comm)
        if not failed:
            return EpochRun(total, steps, len(batches), False)
        undo()
    total, steps = run()
    return EpochRun(total.item(), steps, len(batches), speculate)


def _speculate(run: Callable[[], tuple[Tensor, int]], comm: Comm) -> tuple[float, int, bool]:
    """``run()`` with its checks deferred: its total and steps, and whether a check failed (on any rank), read
    together. An error raised after a check failed is taken for a consequence of it: the steps went on with what
    the check would have stopped."""
    try:
        with deferred_checks() as checks:
            total, steps = run()
    except Exception:
        if checks.flag is None or not bool(checks.flag):
            raise
        return math.nan, 0, True
    total, failed = torch.stack([total, comm.all_reduce_sum(checks.any_failed(total))]).tolist()
    return total, steps, failed > 0


def _undoer(model: GPModel, optimiser, device: torch.device) -> Callable[[], None]:
    """A function that puts back, as they are now, what an epoch changes: the model's parameters and buffers, the
    optimiser's state, and the random state that losses draw from (SoftKI's probes, the softmax likelihood's Monte
    Carlo). A cache keyed on a parameter's version (q's precision) sees the restored parameter as new
    and is recomputed."""
    model_state, optimiser_state = snapshot(model.state_dict()), snapshot(optimiser.state_dict())
    cpu_random = torch.get_rng_state()
    cuda_random = torch.cuda.get_rng_state(device) if device.type == "cuda" else None

    def undo() -> None:
        model.load_state_dict(model_state)
        optimiser.load_state_dict(optimiser_state)
        torch.set_rng_state(cpu_random)
        if cuda_random is not None:
            torch.cuda.set_rng_state(cuda_random, device)

    return undo

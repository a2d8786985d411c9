"""Which rows each process takes, under data parallelism or not: its :class:`Shard` of the global rows, the
minibatches of an epoch (or of a round) cut from one permutation of the global rows, and the rows a model is
initialised on."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch
from torch import Tensor

from ..device import pinned_for, to_device
from ..distributed import LOCAL, Comm, gather_rows

__all__ = ["Shard", "Batch", "epoch_batches", "initialisation_rows", "INIT_ROWS", "GATHERED_ROWS"]


@dataclass(frozen=True)
class Shard:
    """This process's rows of the global data: rows ``offset .. offset + n - 1`` of ``n_global``."""

    offset: int
    n: int
    n_global: int

    @staticmethod
    def of(n: int, comm: Comm) -> Shard:
        sizes = comm.all_gather(torch.tensor([n])).tolist()
        return Shard(offset=sum(sizes[: comm.rank]), n=n, n_global=sum(sizes))


class Batch(NamedTuple):
    """One step's rows: ``rows`` None for the full batch; else global row indices that every rank gathers
    (``gathered``: a batch-coupled loss under data parallelism), or the indices of this process's rows in X, on X's
    device; ``share`` is this process's share of the global batch."""

    rows: Tensor | None
    share: float
    gathered: bool = False


def epoch_batches(model, X: Tensor, generator, batch_size: int, shard: Shard, comm: Comm,
                  sample: int | None = None) -> list[Batch]:
    """The steps of one epoch: batches of a permutation of the global rows, or of its first ``sample`` rows (a
    round, :class:`~gpscale.defaults.Convergence`). The permutation is drawn on the host by the training generator,
    whose state a checkpoint keeps (so a resumed fit reshuffles as the uninterrupted one); the indices of this
    process's rows go to an accelerator holding X once for the epoch, asynchronously from pinned memory, not once per
    step."""
    if model.full_batch:  # every rank holds its rows of one loss, whose statistics the model all-reduces
        return [Batch(None, 1.0 / comm.world_size)]
    batches = torch.randperm(shard.n_global, generator=generator)[:sample].split(batch_size)
    if model.batch_coupled and comm.world_size > 1:  # the whole batch, in order, on every rank
        return [Batch(rows, 1.0 / comm.world_size, gathered=True) for rows in batches]
    mine = batches if shard.n == shard.n_global else \
        [rows[(rows >= shard.offset) & (rows < shard.offset + shard.n)] - shard.offset for rows in batches]
    on_device = mine if X.device.type == "cpu" else \
        to_device(pinned_for(X.device, torch.cat(mine)), X.device).split([len(m) for m in mine])
    return [Batch(rows, len(m) / len(b)) for rows, m, b in zip(on_device, mine, batches)]


INIT_ROWS = 200_000  # the most rows a model's initialisation (k-means, PCA, a data box) sees
GATHERED_ROWS = 16_384  # rows of the initialisation's sample gathered at a time


def initialisation_rows(X: Tensor, y: Tensor, seed: int, comm: Comm = LOCAL,
                        release: Callable[[], None] = lambda: None) -> tuple[Tensor, Tensor]:
    """The rows a model is initialised on, gathered from every process's shard (X [n_r, d], y [n_r]), the same
    for any number of processes, so that 1 and N processes start from the same model: every row, in global order,
    up to :data:`INIT_ROWS`; beyond, a sample of that many drawn by global row index (seeded), in order, gathered
    :data:`GATHERED_ROWS` at a time with ``release`` (a mapped X's, see :func:`~gpscale.train.fit`) after each."""
    shard = Shard.of(X.shape[0], comm)
    if shard.n_global <= INIT_ROWS:
        if comm.world_size == 1:
            return X, y
        rows = torch.arange(shard.n_global)
    else:
        draw = torch.randperm(shard.n_global, generator=torch.Generator().manual_seed(seed))
        rows = draw[:INIT_ROWS].sort().values
    parts = []
    for part in rows.split(GATHERED_ROWS):
        parts.append(gather_rows(X, y, part, shard.offset, comm))
        release()
    return torch.cat([X for X, _ in parts]), torch.cat([y for _, y in parts])

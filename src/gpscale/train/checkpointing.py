"""The training state of one fit: copies of it (a restart's starting point, validation's best epoch, an epoch's
undo) and its checkpoint, written after every epoch and where a stop was asked for (:mod:`gpscale.checkpoint`
writes and checks the file)."""
from __future__ import annotations

import copy
from typing import NamedTuple

import torch
from torch import Tensor

from ..checkpoint import CheckpointError, check_resumable, read_checkpoint, write_checkpoint
from ..distributed import Comm
from ..models.base import GPModel

__all__ = ["snapshot", "Partial", "Checkpointer"]


def snapshot(state):
    """A copy of a (nested) state dict, every tensor cloned and the containers rebuilt; ``copy.deepcopy`` would take
    its slower pickling path per tensor (every epoch takes a copy, and a full-batch model's epoch is one step)."""
    if isinstance(state, Tensor):
        return state.clone()
    if isinstance(state, dict):
        copied = type(state)((key, snapshot(value)) for key, value in state.items())
        if hasattr(state, "_metadata"):  # a module's state dict: its modules' versions, which loading reads
            copied._metadata = copy.deepcopy(state._metadata)
        return copied
    if isinstance(state, (list, tuple)):
        return type(state)(snapshot(value) for value in state)
    return copy.copy(state)


class Partial(NamedTuple):
    """The steps of an epoch taken before a stop, and the sum of their losses."""

    steps: int
    total: float


class Checkpointer:
    """Writes (rank 0) and reads (every rank) one fit's checkpoint at ``path``, with the fingerprints of its data
    and settings (:mod:`gpscale.checkpoint`)."""

    def __init__(self, path, data: dict, settings: dict, comm: Comm):
        self.path, self.data, self.settings, self.comm = path, data, settings, comm

    def save(self, model, optimiser, scheduler, generator_state: Tensor, history: list[dict], best: dict,
             plateau: dict, partial: Partial, finished: tuple[bool, bool] | None = None) -> None:
        """The training state after the epochs in ``history`` and ``partial.steps`` steps of the next, whose
        permutation ``generator_state`` draws; ``finished``: (converged, stopped early) where the plateau rule or
        early stopping ended training there, so that a resume trains no further."""
        if self.comm.rank != 0:
            return
        state = {"model": model.state_dict(), "optimiser": optimiser.state_dict(),
                 "scheduler": scheduler.state_dict() if scheduler is not None else None,
                 "generator": generator_state, "random": torch.get_rng_state(), "history": history, "best": best,
                 "plateau": plateau, "partial": tuple(partial),
                 "step_state": model.step_state() if partial.steps else {}, "finished": finished}
        write_checkpoint(self.path, state, self.data, self.settings)

    def read(self) -> dict:
        checkpoint = read_checkpoint(self.path)
        check_resumable(self.path, checkpoint, self.data, self.settings)
        return checkpoint

    def load_model(self, model: GPModel, checkpoint: dict) -> None:
        try:
            model.load_state_dict(checkpoint["model"])
        except (RuntimeError, KeyError) as err:
            first = str(err).strip().splitlines()[-1].strip() if str(err).strip() else type(err).__name__
            raise CheckpointError(f"Cannot resume from {self.path}: its model state does not fit this model "
                                  f"({first}). Delete it (or give checkpoint= a new file) to start afresh.") from None

"""Communication between data-parallel processes.

Every full-data reduction in gpscale goes through a ``Comm``, so the same model code runs in one process
(:class:`LocalComm`, where each reduction is the identity) and, later, under torchrun.
"""
from __future__ import annotations

from torch import Tensor

__all__ = ["Comm", "LocalComm", "LOCAL"]


class Comm:
    """The collective operations gpscale needs. ``rank`` and ``world_size`` describe this process."""

    rank: int = 0
    world_size: int = 1

    def all_reduce_sum(self, tensor: Tensor) -> Tensor:  # pragma: no cover - interface
        """The sum of ``tensor`` over all processes (differentiable)."""
        raise NotImplementedError


class LocalComm(Comm):
    """A single process: every reduction returns its input."""

    def all_reduce_sum(self, tensor: Tensor) -> Tensor:
        return tensor


LOCAL = LocalComm()

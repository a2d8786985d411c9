"""The kernel matrix as the iterative solvers see it: a symmetric PSD K [n, n] known through products, its rows
partitioned over the processes, and the few operations on row-partitioned vectors that the solvers share."""
from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from ..distributed import Comm
from ..linalg import CORE

__all__ = ["RowPartitioned", "as_noise", "khat_matmul", "dots", "default_tol", "global_normal"]


class RowPartitioned(Protocol):
    """A symmetric PSD K [n, n] known through products, each process holding rows ``[offset, offset + n_local)``.

    ``matmul``, ``columns`` and the communicator's reductions are collective: every rank calls them together."""

    comm: Comm
    offset: int
    n_local: int
    n_global: int
    dtype: torch.dtype
    device: torch.device

    def matmul(self, V: Tensor) -> Tensor:
        """This rank's rows of ``K V`` [n_r, t], for V [n_r, t] this rank's rows of a global [n, t]."""

    def diagonal(self) -> Tensor:
        """This rank's rows of ``diag(K)`` [n_r]."""

    def columns(self, index: Tensor) -> Tensor:
        """``K[this rank's rows, index]`` [n_r, k] for ``index`` [k] of global row indices."""


def as_noise(noise: float | Tensor, dtype: torch.dtype, device: torch.device) -> Tensor:
    """sigma^2 as a detached 0-dim tensor of ``dtype`` (a python float converted once, straight to ``dtype``)."""
    return torch.as_tensor(noise, dtype=dtype, device=device).detach()


def khat_matmul(op: RowPartitioned, noise: Tensor, V: Tensor) -> Tensor:
    """This rank's rows of ``(K + sigma^2 I) V`` [n_r, t]."""
    return op.matmul(V) + noise * V


def dots(comm: Comm, *pairs: tuple[Tensor, Tensor]) -> Tensor:
    """``[a_c^T b_c]`` [len(pairs), t] float64 for each pair of row-partitioned (A, B) [n_r, t], summed over ranks
    in one reduction. The products are accumulated in float64 whatever the vectors' dtype."""
    local = torch.stack([(A * B).sum(0, dtype=CORE) for A, B in pairs])
    return comm.all_reduce_sum(local)


def default_tol(dtype: torch.dtype) -> float:
    """A relative tolerance a little above the round-off of ``dtype`` (2e-13 in float64, 1e-4 in float32)."""
    return 1e3 * torch.finfo(dtype).eps


def global_normal(op: RowPartitioned, rows: int, t: int, generator: torch.Generator) -> Tensor:
    """This rank's rows of a global [rows, t] standard normal matrix drawn from ``generator`` in ``op.dtype``: every
    rank draws all of it and keeps its own rows, so the draws do not depend on the number of processes."""
    draws = torch.randn(rows, t, generator=generator, dtype=op.dtype, device=generator.device)
    return draws[op.offset:op.offset + op.n_local].to(op.device)

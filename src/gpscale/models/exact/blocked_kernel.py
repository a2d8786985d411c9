"""The kernel matrix of the training rows, used a block of rows at a time: never n x n unless asked to fill one.

Each data-parallel process holds its rows X_r [n_r, d] of the n training rows (one process holds them all). The
matrix K = k(X, X) [n, n] is partitioned the same way: a process owns rows ``offset .. offset + n_r - 1`` of K, and
computes them ``rows_per_block`` at a time against every training row (Wang et al., 2019, "Exact Gaussian
processes on a million data points"), so its memory is O(rows_per_block x n) whatever n is. What it offers is what
the exact GP's two solvers need:

- the iterative solver (:mod:`gpscale.iterative`): ``matmul`` (K V for a row-partitioned V), ``diagonal`` and
  ``columns`` (for a pivoted-Cholesky preconditioner), and ``bilinear`` (``sum_i l_i^T K r_i`` with its gradient
  with respect to the kernel's hyperparameters, for the evidence's gradient);
- the direct solver: ``fill_lower``, the lower triangle of K + s I written into an n x n matrix in place.
"""
from __future__ import annotations

import copy

import torch
from torch import Tensor

from ...distributed import LOCAL, Comm
from ...kernels import Kernel

__all__ = ["BlockedKernel", "BLOCK_ELEMENTS"]

# The entries of one block of kernel rows: 2^25 float64 numbers are 256 MiB, and rows of 10^4 to 10^6 columns make
# blocks of 3,355 to 33 rows, each a matrix product large enough to run at the machine's rate.
BLOCK_ELEMENTS = 2**25


class BlockedKernel:
    """K = k(X, X) [n, n] over rows partitioned among the processes of ``comm``, computed ``rows_per_block`` rows at
    a time (see the module docstring). Vectors are row-partitioned as K is: [n_r, t] on each process.

    Args:
        kernel: the covariance function; its hyperparameters are the ones ``bilinear`` differentiates.
        X: this process's rows [n_r, d] (all n in one process).
        comm: the processes; every method that reads other processes' rows is a collective (every process calls
            it, rows or not).
        block_elements: the entries of one block of kernel rows.
    """

    def __init__(self, kernel: Kernel, X: Tensor, comm: Comm = LOCAL, block_elements: int = BLOCK_ELEMENTS):
        self.kernel, self.X, self.comm = kernel, X.detach(), comm
        self.X_all = comm.all_gather(self.X) if comm.world_size > 1 else self.X
        sizes = comm.all_gather(torch.tensor([X.shape[0]])).tolist() if comm.world_size > 1 else [X.shape[0]]
        self.offset, self.n_local, self.n_global = sum(sizes[: comm.rank]), X.shape[0], sum(sizes)
        self.rows_per_block = max(1, block_elements // max(self.n_global, 1))
        self.dtype, self.device = X.dtype, X.device

    def _blocks(self, n: int) -> list[tuple[int, int]]:
        return [(i, min(i + self.rows_per_block, n)) for i in range(0, n, self.rows_per_block)]

    @torch.no_grad()
    def matmul(self, V: Tensor) -> Tensor:
        """This process's rows of K V [n_r, t] for V's rows [n_r, t] (collective: V's rows are gathered)."""
        V_all = self.comm.all_gather(V) if self.comm.world_size > 1 else V
        out = torch.empty(self.n_local, V.shape[1], dtype=V.dtype, device=V.device)
        for a, b in self._blocks(self.n_local):
            torch.matmul(self.kernel(self.X[a:b], self.X_all).to(V.dtype), V_all, out=out[a:b])
        return out

    @torch.no_grad()
    def diagonal(self) -> Tensor:
        """This process's rows of diag(K) [n_r]."""
        return self.kernel.diag(self.X)

    @torch.no_grad()
    def columns(self, index: Tensor) -> Tensor:
        """K[this process's rows, index] [n_r, k] for global row indices ``index`` [k]."""
        return self.kernel(self.X, self.X_all[index.to(self.device)])

    def bilinear(self, left: Tensor, right: Tensor) -> Tensor:
        """``sum_i left_i^T K right_i`` over this process's rows of ``left`` [n_r, t] and every row of ``right``
        [n_r, t] (gathered), as a 0-dim tensor that is differentiable with respect to the kernel's hyperparameters
        (``left`` and ``right`` are constants). Its backward pass recomputes K a block at a time, so neither pass
        holds more than a block."""
        right_all = self.comm.all_gather(right.detach()) if self.comm.world_size > 1 else right.detach()
        params = [p for p in self.kernel.parameters() if p.requires_grad]
        return _Bilinear.apply(self, left.detach(), right_all, *params)

    @torch.no_grad()
    def fill_lower(self, A: Tensor, shift: float | Tensor) -> None:
        """Write the lower triangle of K + ``shift`` I into A [n, n] (one process, all rows), row block by row
        block: a block of rows is computed against the columns up to its last row only, so the fill costs half of
        K. The kernel is evaluated in A's dtype (a float32 model's kernel in float64 for a float64 factor)."""
        kernel = self.kernel if A.dtype == self.dtype else copy.deepcopy(self.kernel).to(A.dtype)
        X = self.X_all.to(A.dtype)
        for a, b in self._blocks(self.n_global):
            A[a:b, :b] = kernel(X[a:b], X[:b])
        A.diagonal().add_(shift)


class _Bilinear(torch.autograd.Function):
    """``sum_i l_i^T K(theta) r_i`` for a process's rows of L and all of R, with the gradient in theta."""

    @staticmethod
    def forward(ctx, op: BlockedKernel, left: Tensor, right_all: Tensor, *params: Tensor) -> Tensor:
        ctx.op, ctx.params = op, params
        ctx.save_for_backward(left, right_all)
        total = torch.zeros((), dtype=torch.float64, device=left.device)
        for a, b in op._blocks(op.n_local):
            total += (left[a:b] * (op.kernel(op.X[a:b], op.X_all) @ right_all)).sum().double()
        return total.to(left.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        op, params = ctx.op, ctx.params
        left, right_all = ctx.saved_tensors
        grads = [torch.zeros_like(p) for p in params]
        with torch.enable_grad():
            for a, b in op._blocks(op.n_local):
                value = (left[a:b] * (op.kernel(op.X[a:b], op.X_all) @ right_all)).sum()
                for total, g in zip(grads, torch.autograd.grad(value, params, allow_unused=True)):
                    if g is not None:
                        total += g
        return (None, None, None, *(grad * g for g in grads))

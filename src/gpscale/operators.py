"""Symmetric positive definite matrices kept in their structure: each operator has ``size``, ``solve(B)``,
``matmul(B)``, ``inv_quad(R)`` (``tr(R^T M^{-1} R)``), ``logdet()`` and ``to_dense()`` (B, R [n, k]), and
composes with the others (a block may be a block-diagonal, a Kronecker factor a diagonal-plus-low-rank). The
variational Fourier features use them for their K_uu (:mod:`gpscale.kernels.fourier`); :class:`DenseSPD` gives any
dense matrix the same interface through its Cholesky factor.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch import Tensor

from .linalg import cholesky, logdet_from_cholesky, solve_lower

__all__ = ["DenseSPD", "DiagPlusLowRank", "BlockDiagonal", "Kronecker"]


@dataclass
class DenseSPD:
    """A dense SPD matrix K [n, n] through its Cholesky factor (:func:`gpscale.linalg.cholesky`, with its jitter
    escalation and error message; ``what`` names the matrix in it)."""

    K: Tensor
    what: str = "matrix"
    L: Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.L = cholesky(self.K, what=self.what)

    @property
    def size(self) -> int:
        return self.K.shape[0]

    def solve(self, B: Tensor) -> Tensor:
        return torch.cholesky_solve(B, self.L)

    def inv_quad(self, R: Tensor) -> Tensor:
        return solve_lower(self.L, R).square().sum()

    def matmul(self, B: Tensor) -> Tensor:
        return self.K @ B

    def logdet(self) -> Tensor:
        return logdet_from_cholesky(self.L)

    def to_dense(self) -> Tensor:
        return self.K


@dataclass
class DiagPlusLowRank:
    """``M = diag(d) + W W^T`` [n, n] with d [n] > 0 and W [n, r] (r small), kept in that form.

    Solves by Woodbury, ``M^{-1} B = D^{-1} B - D^{-1} W C^{-1} W^T D^{-1} B`` with the r x r capacitance
    ``C = I + W^T D^{-1} W``; ``log|M| = sum log d + log|C|`` (the determinant lemma): O(n r^2 + n r k) for B [n, k].
    """

    d: Tensor
    W: Tensor

    @property
    def size(self) -> int:
        return self.d.shape[0]

    @classmethod
    def block_diagonal(cls, parts: list[DiagPlusLowRank]) -> DiagPlusLowRank:
        """``blockdiag(M_1, ..., M_k)`` as one diagonal plus low rank: d stacked, W block diagonal [n, sum r_i].
        One Woodbury solve with a (sum r_i)-square capacitance replaces k small ones: a handful of kernels
        instead of several per block, which is what the additive VFF K_uu (D x 2 blocks) needs on a GPU."""
        return cls(torch.cat([part.d for part in parts]), torch.block_diag(*[part.W for part in parts]))

    def with_jitter(self, jitter: float) -> DiagPlusLowRank:
        return DiagPlusLowRank(self.d + jitter, self.W) if jitter else self

    @cached_property
    def _DW(self) -> Tensor:
        """D^{-1} W [n, r]"""
        return self.W / self.d.unsqueeze(-1)

    @cached_property
    def _capacitance_cholesky(self) -> Tensor:
        return cholesky(torch.eye(self.W.shape[1], dtype=self.d.dtype, device=self.d.device) + self.W.T @ self._DW,
                        what="capacitance I + W^T D^-1 W")

    def solve(self, B: Tensor) -> Tensor:
        """``M^{-1} B`` for B [n, k]."""
        DB = B / self.d.unsqueeze(-1)
        if self.W.shape[1] == 0:
            return DB
        return DB - self._DW @ torch.cholesky_solve(self.W.T @ DB, self._capacitance_cholesky)

    def inv_quad(self, R: Tensor) -> Tensor:
        """``tr(R^T M^{-1} R) = tr(R^T D^{-1} R) - ||Lc^{-1} W^T D^{-1} R||_F^2`` (Lc the capacitance's factor): two
        passes over R and an [r, n] x [n, k] product, where ``solve(R)`` would make several [n, k] temporaries."""
        quad = (R.square().sum(-1) / self.d).sum()  # row sums first: d's gradient needs no [n, k] temporaries
        if self.W.shape[1] == 0:
            return quad
        return quad - solve_lower(self._capacitance_cholesky, self._DW.T @ R).square().sum()

    def logdet(self) -> Tensor:
        logdet = torch.log(self.d).sum()
        if self.W.shape[1] == 0:
            return logdet
        return logdet + 2 * torch.log(torch.diagonal(self._capacitance_cholesky)).sum()

    def matmul(self, B: Tensor) -> Tensor:
        return self.d.unsqueeze(-1) * B + self.W @ (self.W.T @ B)

    def to_dense(self) -> Tensor:
        return torch.diag(self.d) + self.W @ self.W.T


@dataclass
class BlockDiagonal:
    """``blockdiag(M_1, ..., M_k)`` of structured blocks (each with solve, logdet, matmul, to_dense)."""

    blocks: list

    @property
    def size(self) -> int:
        return sum(block.size for block in self.blocks)

    def _split(self, B: Tensor) -> tuple[Tensor, ...]:
        return B.split([block.size for block in self.blocks])

    def solve(self, B: Tensor) -> Tensor:
        return torch.cat([block.solve(part) for block, part in zip(self.blocks, self._split(B))])

    def inv_quad(self, R: Tensor) -> Tensor:
        return sum(block.inv_quad(part) for block, part in zip(self.blocks, self._split(R)))

    def matmul(self, B: Tensor) -> Tensor:
        return torch.cat([block.matmul(part) for block, part in zip(self.blocks, self._split(B))])

    def logdet(self) -> Tensor:
        return sum(block.logdet() for block in self.blocks)

    def to_dense(self) -> Tensor:
        return torch.block_diag(*[block.to_dense() for block in self.blocks])


@dataclass
class Kronecker:
    """``M_1 ⊗ ... ⊗ M_D`` (C order: the first factor is the most significant) of structured factors.

    ``(⊗ M_i)^{-1} = ⊗ M_i^{-1}`` is applied factor by factor on the reshaped right-hand side, and
    ``log|⊗ M_i| = sum_i (prod_{j != i} n_j) log|M_i|``: O(sum_i n_i^2 N / n_i) for N = prod n_i.
    """

    factors: list

    @property
    def size(self) -> int:
        return math.prod(factor.size for factor in self.factors)

    def _apply(self, B: Tensor, op: str) -> Tensor:
        sizes = [factor.size for factor in self.factors]
        k = B.shape[1]
        T = B.reshape(*sizes, k)
        for i, factor in enumerate(self.factors):
            moved = T.movedim(i, 0)  # [n_i, ..., k]
            shape = moved.shape
            flat = getattr(factor, op)(moved.reshape(shape[0], -1))
            T = flat.reshape(shape).movedim(0, i)
        return T.reshape(-1, k)

    def solve(self, B: Tensor) -> Tensor:
        return self._apply(B, "solve")

    def inv_quad(self, R: Tensor) -> Tensor:
        return (R * self.solve(R)).sum()

    def matmul(self, B: Tensor) -> Tensor:
        return self._apply(B, "matmul")

    def logdet(self) -> Tensor:
        total = self.size
        return sum(total // factor.size * factor.logdet() for factor in self.factors)

    def to_dense(self) -> Tensor:
        dense = self.factors[0].to_dense()
        for factor in self.factors[1:]:
            dense = torch.kron(dense, factor.to_dense())
        return dense

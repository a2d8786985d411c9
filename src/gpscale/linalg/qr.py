"""Least squares through QR: tall matrices that arrive in row chunks are factored by :class:`StreamingQR` (TSQR),
which gives the same R as one QR of the stacked rows while holding only one chunk in memory."""
from __future__ import annotations

from typing import Iterable

import torch
from torch import Tensor


def qr_r(A: Tensor) -> Tensor:
    """The R factor [k, k] of the reduced QR of ``A`` [n, k] (n >= k), with a non-negative diagonal.

    Fixing the signs makes R unique, so a streamed factorisation can be compared with a one-shot one.
    """
    R = torch.linalg.qr(A, mode="reduced" if A.requires_grad else "r").R
    signs = torch.where(R.diagonal() < 0, -1.0, 1.0).to(R.dtype)
    return signs.unsqueeze(-1) * R


class StreamingQR:
    """Tall-skinny QR over row chunks (TSQR): the R of ``[A_1; A_2; ...]`` from one chunk at a time.

    Each :meth:`update` stacks the current R on the new rows and re-factors, so memory is
    O((chunk + k) k) however many rows pass. ``R`` has a non-negative diagonal, so it equals the R of one QR
    of the stacked matrix (:func:`qr_r`). For least squares, append the right-hand side as extra columns:
    the R of ``[A, b]`` holds ``R_A``, ``Q^T b`` and the residual norm as its blocks.
    """

    def __init__(self) -> None:
        self.R: Tensor | None = None  # [k, k]

    def update(self, A: Tensor) -> None:
        """Absorb rows ``A`` [c, k]."""
        self.R = qr_r(A if self.R is None else torch.cat([self.R, A], dim=0))

    @classmethod
    def of_chunks(cls, chunks: Iterable[Tensor]) -> Tensor:
        """R of the row-stacked ``chunks``."""
        qr = cls()
        for chunk in chunks:
            qr.update(chunk)
        if qr.R is None:
            raise ValueError("StreamingQR.of_chunks() needs at least one chunk.")
        return qr.R

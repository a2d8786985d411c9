"""Matrix products that skip what they need not form: triangles of zeros, transposed layouts, and the second product
of a backward that one product gives.

Each is a ``torch.autograd.Function`` with a backward of its own where autograd's would form more than the
gradient needs; the values are those of the dense products they replace.
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable


def _block_edges(m: int) -> list[int]:
    """Edges of the (at most four) row blocks of a triangular product: blocks of 128 rows or more, so that each
    product stays efficient."""
    k = max(1, min(4, m // 128))
    return [round(i * m / k) for i in range(k + 1)]


def tril_outer(X: Tensor, Y: Tensor) -> Tensor:
    """``tril(X Y^T)`` [..., m, m] for X, Y [..., m, c], forming the lower blocks only (with four blocks, 10 of
    16: 5/8 of the product's flops)."""
    edges = _block_edges(X.shape[-2])
    out = torch.zeros(*torch.broadcast_shapes(X.shape[:-2], Y.shape[:-2]), X.shape[-2], Y.shape[-2],
                      dtype=X.dtype, device=X.device)
    for a, b in zip(edges, edges[1:]):
        torch.matmul(X[..., a:, :], Y[..., a:b, :].mT, out=out[..., a:, a:b])
    return out.tril_()


def tril_matmul(S: Tensor, B: Tensor) -> Tensor:
    """``S B`` [..., m, c] for lower-triangular S [..., m, m] (upper triangle zero) and B [..., m, c], from the
    lower blocks of S only (5/8 of the flops with four blocks)."""
    edges = _block_edges(S.shape[-1])
    out = torch.empty(*torch.broadcast_shapes(S.shape[:-2], B.shape[:-2]), S.shape[-2], B.shape[-1],
                      dtype=B.dtype, device=B.device)
    for a, b in zip(edges, edges[1:]):
        torch.matmul(S[..., a:b, :b], B[..., :b, :], out=out[..., a:b, :])
    return out


class _LowerTransposeProduct(torch.autograd.Function):
    """``S^T A`` for lower-triangular S (upper triangle zero), forward and backward from S's lower blocks only:
    ``dA = S G``, ``dS = tril(A G^T)``."""

    @staticmethod
    def forward(ctx, S: Tensor, A: Tensor) -> Tensor:
        ctx.save_for_backward(S, A)
        edges = _block_edges(S.shape[-1])
        out = torch.empty(*torch.broadcast_shapes(S.shape[:-2], A.shape[:-2]), S.shape[-1], A.shape[-1],
                          dtype=A.dtype, device=A.device)
        for a, b in zip(edges, edges[1:]):
            torch.matmul(S[..., a:, a:b].mT, A[..., a:, :], out=out[..., a:b, :])
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, G: Tensor):
        S, A = ctx.saved_tensors
        dS = tril_outer(A, G).sum_to_size(S.shape) if ctx.needs_input_grad[0] else None
        dA = tril_matmul(S, G).sum_to_size(A.shape) if ctx.needs_input_grad[1] else None
        return dS, dA


def lower_transpose_product(S: Tensor, A: Tensor) -> Tensor:
    """``S^T A`` [..., m, c] for lower-triangular ``S`` [..., m, m] whose upper triangle is zero (as a Cholesky
    factor's, or ``tril`` of a parameter) and A [..., m, c], leading axes broadcast: the triangle of zeros is
    skipped forward and backward, 5/8 of a dense product's flops with four blocks."""
    return _LowerTransposeProduct.apply(S, A)


class _WeightedSum(torch.autograd.Function):
    """``w^T K`` over the second-to-last axis, with dL/dK = w g^T formed by a broadcast multiply: as a matrix
    product's backward it is a product of inner dimension 1, which runs at a fraction of a multiply's speed."""

    @staticmethod
    def forward(ctx, w: Tensor, K: Tensor) -> Tensor:
        ctx.save_for_backward(w, K)
        return (w.unsqueeze(-2) @ K).squeeze(-2)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        w, K = ctx.saved_tensors
        need_w, need_K = ctx.needs_input_grad
        # g K^T, not K g: a batched product with one column runs far slower than with one row and K transposed
        dw = (grad.unsqueeze(-2) @ K.mT).squeeze(-2) if need_w else None
        if not need_K:
            return dw, None
        if K.mT.is_contiguous() and not K.is_contiguous():  # a transposed view: formed in its source's layout
            return dw, torch.mul(grad.unsqueeze(-1), w.unsqueeze(-2)).mT
        return dw, torch.mul(w.unsqueeze(-1), grad.unsqueeze(-2))


def weighted_sum(w: Tensor, K: Tensor) -> Tensor:
    """``sum_s w[..., s] K[..., s, :]`` [..., N] for w [..., S] and K [..., S, N] (leading axes equal; K may be a
    transposed view, for a sum over a matrix's last axis, ``weighted_sum(w, M.mT)``): one product
    forward, where ``(w[..., None] * K).sum(-2)`` makes a [..., S, N] temporary and reduces across rows, and a
    broadcast multiply for dL/dK backward."""
    return _WeightedSum.apply(w, K)


class _SquaredNorms(torch.autograd.Function):
    """``||M_i||^2`` along one axis, with the backward ``dM = 2 g M`` as one multiply: ``(M * M).sum`` has autograd
    take two products of M's size and their sum, each a fresh tensor (for DBK's [n, 128] bases, four passes over n
    rows that page faults dominate). Along the last axis the squares are formed a block of rows at a time, never all
    at once."""

    @staticmethod
    def forward(ctx, M: Tensor, dim: int) -> Tensor:
        ctx.save_for_backward(M)
        ctx.dim = dim
        if dim not in (-1, M.dim() - 1):
            return (M * M).sum(dim)
        rows = M.reshape(M.shape[:-1].numel(), M.shape[-1])
        out = rows.new_empty(rows.shape[0])
        for block, norms in zip(rows.split(_NORM_ROWS), out.split(_NORM_ROWS)):
            torch.sum(block * block, dim=-1, out=norms)
        return out.reshape(M.shape[:-1])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        (M,) = ctx.saved_tensors
        return M * (2 * grad).unsqueeze(ctx.dim), None


_NORM_ROWS = 8192  # rows a block: small enough that a block's square of a basis's columns stays on the heap


def squared_norms(M: Tensor, dim: int = -1) -> Tensor:
    """``||M_i||^2`` along the axis ``dim`` of M (by default the last, [..., r] -> [...])."""
    return _SquaredNorms.apply(M, dim)



class _Gram(torch.autograd.Function):
    """``M^T M`` whose backward is one product, ``dM = M (G + G^T)``; autograd's matmul backward takes two (one
    per operand), which for features [n, p] is an extra n p^2 of the dominant cost of a GRIEF or SoftKI step."""

    @staticmethod
    def forward(ctx, M: Tensor) -> Tensor:
        ctx.save_for_backward(M)
        return M.T @ M

    @staticmethod
    def backward(ctx, grad: Tensor):
        (M,) = ctx.saved_tensors
        return M @ (grad + grad.T)


def transposed_times(A: Tensor, B: Tensor) -> Tensor:
    """``A^T B`` [..., p, k] for A [..., n, p] and a narrower B [..., n, k], taken as ``(B^T A)^T`` (a transposed
    view): MKL multiplies a transposed wide operand into few columns at a fraction of the rate of the same product
    with that operand on the right."""
    return (B.transpose(-2, -1) @ A).transpose(-2, -1)


def gram(M: Tensor) -> Tensor:
    """``M^T M`` [p, p] for M [n, p], differentiable at the cost of one extra n p^2 product (not two)."""
    return _Gram.apply(M)

"""Solves and inverses against square and triangular matrices, most of them against a Cholesky factor.

Results come back row-major: LAPACK writes column-major, and element-wise work that mixes the two layouts runs far
slower than either alone, so each solve is arranged (or copied once) to return the layout its callers multiply in.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..device import check_failed
from .factor import cholesky, logdet_from_cholesky
from .products import tril_outer


def solve(A: Tensor, B: Tensor) -> Tensor:
    """``A^{-1} B`` for square ``A`` [m, m] and ``B`` [m, k], by LU as ``torch.linalg.solve``, whose error a singular
    A still raises; the check is one read on the host, deferrable as :func:`cholesky`'s is."""
    X, info = torch.linalg.solve_ex(A, B)
    if check_failed(info.ne(0)):
        return torch.linalg.solve(A, B)  # raises torch's error, naming the singular pivot
    return X


def _row_major(X: Tensor) -> Tensor:
    """X in row-major layout. A right-hand side given column-major comes back from LAPACK column-major however it is
    transposed on the way (a gradient that arrives as the transpose of a row-major tensor does): one copy here costs
    less than one element-wise pass mixing layouts after it, and about the same for memory-bound sizes."""
    return X if X.is_contiguous() else X.contiguous()


def _solve_lower_transposed(L: Tensor, G: Tensor) -> Tensor:
    """``L^{-T} G`` row-major, solved as ``(G^T L^{-1})^T`` (see :func:`solve_lower`)."""
    return _row_major(torch.linalg.solve_triangular(L, G.mT, upper=False, left=False).mT)


def _solve_lower(L: Tensor, B: Tensor) -> Tensor:
    return _row_major(torch.linalg.solve_triangular(L.mT, B.mT, upper=True, left=False).mT)


class _SolveLower(torch.autograd.Function):
    """``A = L^{-1} B`` with ``dB = L^{-T} G`` (row-major) and either ``dL = -tril(dB A^T)``, formed from its lower
    blocks only (5/8 of that product's flops with four blocks; torch's backward forms the whole product and returns
    dL column-major), or, given the matrix Kuu that L factors, Kuu's gradient directly (see :func:`whitened_solve`)."""

    @staticmethod
    def forward(ctx, L: Tensor, B: Tensor, Kuu: Tensor | None) -> Tensor:
        A = _solve_lower(L, B)
        ctx.save_for_backward(L, A)
        ctx.B_shape = B.shape
        ctx.Kuu_dtype = None if Kuu is None else Kuu.dtype
        return A

    @staticmethod
    @once_differentiable
    def backward(ctx, G: Tensor):
        L, A = ctx.saved_tensors
        need_L, need_B, need_Kuu = ctx.needs_input_grad
        dB = _solve_lower_transposed(L, G) if need_L or need_B else None
        dL = tril_outer(dB, A).neg_().sum_to_size(L.shape) if need_L else None
        dKuu = None
        if need_Kuu:
            Phi = tril_outer(G, A)
            Phi.diagonal(dim1=-2, dim2=-1).mul_(0.5)
            dKuu = torch.linalg.solve_triangular(L, torch.linalg.solve_triangular(L.mT, Phi, upper=True), upper=False,
                                                 left=False)
            dKuu = (dKuu.mT + dKuu).mul_(-0.5).to(ctx.Kuu_dtype)  # row-major, as the kernel's backward reads it
        return dL, None if dB is None or not need_B else dB.sum_to_size(ctx.B_shape), dKuu


def solve_lower(L: Tensor, B: Tensor) -> Tensor:
    """``L^{-1} B`` for lower-triangular ``L`` [..., m, m] and ``B`` [..., m, k], row-major, and so are its gradients.

    Solved as ``(B^T L^{-T})^T``: LAPACK writes its result column-major, so ``L^{-1} B`` solved directly comes back
    transposed in memory, and every element-wise operation that then mixes it with a row-major tensor of its shape
    runs at a fraction of its speed; the transposed solve is also the faster one."""
    if torch.is_grad_enabled() and (L.requires_grad or B.requires_grad):
        return _SolveLower.apply(L, B, None)
    return _solve_lower(L, B)


def solve_upper(U: Tensor, B: Tensor) -> Tensor:
    """``U^{-1} B`` for upper-triangular ``U`` [m, m] and ``B`` [m, k]."""
    return torch.linalg.solve_triangular(U, B, upper=True)


def cho_solve(L: Tensor, B: Tensor) -> Tensor:
    """``A^{-1} B`` where ``A = L L^T``; ``B`` [m, k]."""
    return torch.cholesky_solve(B, L, upper=False)


def cho_solve_triangular(L: Tensor, B: Tensor) -> Tensor:
    """``A^{-1} B`` where ``A = L L^T`` (L [m, m] lower, B [m, k]) by two triangular solves, which read L where it
    lies: ``torch.cholesky_solve`` first copies a row-major L into column-major memory, a second m x m matrix, which
    at the exact GP's m of tens of thousands is gigabytes. Only L's lower triangle is read."""
    return solve_upper(L.mT, solve_lower(L, B))



def whitened_solve(K: Tensor, L: Tensor, Kuu: Tensor | None = None) -> Tensor:
    """``A = L^{-1} K`` [..., m, k] in K's dtype for the lower Cholesky factor ``L`` of ``Kuu`` [..., m, m]; given
    ``Kuu`` (the very matrix L factors, with its graph; L then carries none), the gradient reaches Kuu directly.

    With ``G = dloss/dA``: ``dK = L^{-T} G``, and since ``dA = -Phi(L^{-1} dKuu L^{-T}) A`` (the Cholesky factor's
    derivative, ``dL = L Phi(L^{-1} dKuu L^{-T})``, Phi taking the lower triangle and half the diagonal),

        dKuu = -L^{-T} Phi(G A^T) L^{-1}   (symmetrised).

    Autograd through the solve and then the factorisation forms the same matrix as ``L^{-T} Phi(L^T dL) L^{-1}``
    with ``dL = -tril(L^{-T} G A^T)``: one m^3 product more (``L^T dL``, since ``L^T L^{-T} = I``). The backward
    runs in K's dtype: its inputs G and A carry K's precision, which no float64 solve restores, so a float32
    model's gradient costs float32 solves (the factorisation itself stays float64)."""
    if Kuu is None or not torch.is_grad_enabled():
        return solve_lower(L.to(K.dtype), K)
    return _SolveLower.apply(L.detach().to(K.dtype), K, Kuu)


def cholesky_inverse(L: Tensor) -> Tensor:
    """``(L L^T)^{-1}`` [..., m, m] from the lower Cholesky factor ``L``, without reading a status on the host: on the
    CPU by LAPACK's potri (``torch.cholesky_inverse``, 2/3 m^3 flops), whose status check costs nothing there;
    elsewhere by two triangular solves against the identity, as torch itself computes it on a GPU, less the status
    check that would wait for the device."""
    if L.device.type == "cpu":
        inverse = torch.cholesky_inverse(L)
    else:
        inverse = cho_solve(L, torch.eye(L.shape[-1], dtype=L.dtype, device=L.device).expand_as(L))
    # row-major: the column-major result's transpose is itself (symmetric), and element-wise work mixing layouts is slow
    return inverse.mT if not inverse.is_contiguous() and inverse.mT.is_contiguous() else inverse


def lower_inverse(L: Tensor, block: int = 128) -> Tensor:
    """``L^{-1}`` [..., m, m] for lower-triangular ``L`` [..., m, m], by halves: ``[[A, 0], [C, D]]^{-1} = [[A^-1,
    0], [-D^-1 C A^-1, D^-1]]``. About m^3 / 3 flops, nearly all in matrix products, where a triangular solve against
    the identity costs m^3; blocks of at most ``block`` rows are solved directly."""
    m = L.shape[-1]
    if m <= block:
        return solve_lower(L, torch.eye(m, dtype=L.dtype, device=L.device).expand_as(L))
    k = m // 2
    A_inv, D_inv = lower_inverse(L[..., :k, :k], block), lower_inverse(L[..., k:, k:], block)
    inverse = torch.zeros_like(L)
    inverse[..., :k, :k], inverse[..., k:, k:] = A_inv, D_inv
    inverse[..., k:, :k] = -D_inv @ (L[..., k:, :k] @ A_inv)
    return inverse


def inverse_cholesky(P: Tensor, *, what: str = "matrix") -> Tensor:
    """Lower ``L`` [m, m] with ``L L^T = P^{-1}`` for SPD ``P``, from one Cholesky factorisation and one triangular
    inverse (about 2/3 m^3 flops; ``cholesky_inverse`` then ``cholesky`` cost twice that). With J the reversal,
    ``J P J = U U^T`` gives ``P^{-1} = (J U^{-T} J)(J U^{-T} J)^T`` and ``J U^{-T} J`` is lower triangular.
    Raises :class:`NotPSDError` (no jitter) when P is not positive definite."""
    U = cholesky(P.flip(-2, -1), max_tries=0, what=what)
    return lower_inverse(U).mT.flip(-2, -1)


class _GaussianLogLikelihood(torch.autograd.Function):
    """``log N(y | 0, K)`` with the closed-form gradient ``dK = 1/2 (alpha alpha^T - K^{-1})``, ``dy = -alpha``.

    Autograd through the Cholesky factorisation costs several n^3 triangular solves; the closed form needs one
    ``cholesky_inverse``, so an exact-GP step costs about half as much.
    """

    @staticmethod
    def forward(ctx, K: Tensor, y: Tensor, what: str) -> Tensor:
        L = cholesky(K, what=what)
        alpha = cho_solve(L, y.unsqueeze(-1)).squeeze(-1)  # K^{-1} y
        ctx.save_for_backward(L, alpha)
        return -0.5 * (y @ alpha) - 0.5 * logdet_from_cholesky(L) - 0.5 * y.shape[0] * math.log(2 * math.pi)

    @staticmethod
    def backward(ctx, grad: Tensor):
        L, alpha = ctx.saved_tensors
        dK = 0.5 * grad * (torch.outer(alpha, alpha) - cholesky_inverse(L))
        return dK, -grad * alpha, None


def gaussian_log_likelihood(K: Tensor, y: Tensor, what: str = "covariance") -> Tensor:
    """``log N(y | 0, K)`` for K [n, n] symmetric positive definite and y [n], differentiable in both."""
    return _GaussianLogLikelihood.apply(K, y, what)

"""Dense linear algebra with the numerics every method shares.

Every Cholesky in gpscale goes through :func:`cholesky`: it adds escalating jitter, warns when it had to, and
raises :class:`NotPSDError` with a remedy instead of returning NaN; a caller that handles failures itself takes
:func:`cholesky_ex`, the factorisation both use. Least squares goes through QR: tall matrices that arrive in
row chunks are factored by :class:`StreamingQR` (TSQR),
which gives the same R as one QR of the stacked rows while holding only one chunk in memory. Iterative solves
go through :func:`conjugate_gradients`.
"""
from __future__ import annotations

import math
import warnings
from typing import Callable, Iterable

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .device import check_failed

__all__ = [
    "CORE",
    "NotPSDError",
    "NumericalWarning",
    "cholesky",
    "cholesky_ex",
    "cholesky_in_place",
    "CHOLESKY_PANEL",
    "solve",
    "solve_lower",
    "whiten",
    "tril_outer",
    "tril_matmul",
    "lower_transpose_product",
    "weighted_sum",
    "squared_norms",
    "solve_upper",
    "cho_solve",
    "cho_solve_triangular",
    "cholesky_inverse",
    "logdet_from_cholesky",
    "inverse_cholesky",
    "lower_inverse",
    "gaussian_log_likelihood",
    "transposed_times",
    "gram",
    "qr_r",
    "StreamingQR",
    "conjugate_gradients",
]

# The dtype of every small core (m x m, r x r, p x p) and its factorisations, whatever the model's dtype: their
# condition numbers grow with n / sigma^2 and with cond(K_uu), which float32 cannot hold.
CORE = torch.float64


class NotPSDError(RuntimeError):
    """A matrix that should be positive definite is not, even after adding jitter."""


class NumericalWarning(RuntimeWarning):
    """Numerical trouble that gpscale repaired (e.g. jitter added), which the user may want to know about."""


# LAPACK's Cholesky on the CPU (MKL's, torch 2.13) slows down when the order is a multiple of 64, probably because
# its columns then fall into the same cache sets. Measured on a 2-core Intel Xeon, float64, the best of eight:
# m = 512, 2.18 ms against 0.91 ms for m = 520; 1,024, 12.1 against 3.9 ms (1,032); 1,280, 15.1 against 7.7 ms
# (1,288); 2,048, 83 against 40 ms (2,100); float32 alike (1,024: 10.9 against 2.9 ms for 1,040). The triangular
# solves that read such a factor took at most 12% longer than at the order 8 above, its inverse up to 18%: only
# the factorisation is padded. Not below an order of 128 (at 64 the padded factorisation took twice as long), nor a
# batch of matrices (200 of order 64 to 256: 1.2 to 1.7 times as long padded; eight of 256: the same).
CHOLESKY_ALIASED_ORDER = 64
CHOLESKY_PADDED_FROM = 128
CHOLESKY_PADDING = 8


def cholesky_ex(A: Tensor) -> tuple[Tensor, Tensor]:
    """``torch.linalg.cholesky_ex(A)``: the lower factor L [..., m, m] and LAPACK's ``info`` [...] (0, or the order
    of the first leading minor that is not positive definite), the same function of A. On the CPU, a single matrix
    whose order is a multiple of :data:`CHOLESKY_ALIASED_ORDER` from :data:`CHOLESKY_PADDED_FROM` is factored as the
    block-diagonal [[A, 0], [0, I]] of :data:`CHOLESKY_PADDING` more rows, whose factor is [[L, 0], [0, I]] and
    whose info is A's (see above)."""
    m = A.shape[-1]
    if A.device.type != "cpu" or A.dim() != 2 or m % CHOLESKY_ALIASED_ORDER or m < CHOLESKY_PADDED_FROM:
        return torch.linalg.cholesky_ex(A)
    padded = torch.nn.functional.pad(A, (0, CHOLESKY_PADDING, 0, CHOLESKY_PADDING))
    padded.diagonal(dim1=-2, dim2=-1)[..., m:] = 1.0
    L, info = torch.linalg.cholesky_ex(padded)
    return L[..., :m, :m].mT.contiguous().mT, info  # column-major, as LAPACK's own factor


def cholesky(A: Tensor, *, jitter: float = 1e-8, max_tries: int = 4, what: str = "matrix") -> Tensor:
    """Lower Cholesky factor L of a symmetric positive definite ``A`` [..., m, m], with ``L L^T = A``.

    If the factorisation fails, ``jitter * mean(diag(A)) * 10**i`` is added to the diagonal for
    ``i = 0 .. max_tries - 1`` and a :class:`NumericalWarning` says how much was needed. If every try fails,
    :class:`NotPSDError` explains what to change. NaN or inf in the lower triangle (the one the factorisation
    reads; the upper is never read) raises at once: no jitter repairs it.

    Whether the first try succeeded is one read on the host (:func:`gpscale.device.check_failed`); inside
    :func:`gpscale.device.deferred_checks` it is deferred, and the first try's factor is returned as if it had.
    """
    L, info = cholesky_ex(A)
    # a NaN or inf in the triangle the factorisation reads stops it (info > 0) or leaves a non-finite diagonal:
    # checking those m numbers, not all m^2 of A, took a fifth of the time of a 512 x 512 factorisation
    if not check_failed(info.ne(0).any() | ~torch.isfinite(L.diagonal(dim1=-2, dim2=-1)).all()):
        return L
    if not torch.isfinite(A).all():
        raise _non_finite(what, A.shape, f"{(~torch.isfinite(A)).sum().item()} ")
    scale = A.diagonal(dim1=-2, dim2=-1).abs().mean(-1, keepdim=True).clamp_min(torch.finfo(A.dtype).tiny)
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    for i in range(max_tries):
        level = jitter * 10**i
        L, info = cholesky_ex(A + (level * scale).unsqueeze(-1) * eye)
        if not info.any():
            warnings.warn(
                f"The {what} ({tuple(A.shape)}) was not positive definite; added jitter of "
                f"{level:.1e} x its mean diagonal.",
                NumericalWarning,
                stacklevel=2,
            )
            return L
    raise _not_positive_definite(what, A.shape, jitter * 10 ** (max_tries - 1),
                                 "a larger noise floor, fewer inducing points (or inducing points further apart), or "
                                 "dtype='float64'")


def _non_finite(what: str, shape, count: str = "") -> NotPSDError:
    return NotPSDError(f"The {what} ({tuple(shape)}) has {count}NaN/inf entries, so it has no Cholesky factor. This "
                       "usually means the training diverged: lower the learning rate, or use dtype='float64'.")


def _not_positive_definite(what: str, shape, jitter: float, remedy: str) -> NotPSDError:
    return NotPSDError(f"The {what} ({tuple(shape)}) is not positive definite, even after adding jitter up to "
                       f"{jitter:.1e} x its mean diagonal. Try {remedy}.")


# The columns of one panel of the blocked factorisation: its trailing updates are matrix products of that inner size,
# which reach a CPU's matrix-product rate from a few hundred columns and a GPU's from a few thousand.
CHOLESKY_PANEL = {"cpu": 512, "cuda": 4096}


def cholesky_in_place(A: Tensor, fill: Callable[[Tensor], None], *, jitter: float = 1e-8, max_tries: int = 4,
                      what: str = "matrix", block: int | None = None) -> Tensor:
    """The lower Cholesky factor of an SPD matrix [m, m] formed in A itself: the memory of one m x m matrix, where
    ``torch.linalg.cholesky`` holds the matrix and its factor (two). Returns A, whose lower triangle then holds L
    (``L L^T`` = the matrix). Its strict upper triangle keeps whatever ``fill`` left there and is never written: the
    triangular solves (:func:`solve_lower`, :func:`cho_solve`) read the lower triangle only, and on Linux the pages
    of a fresh allocation that nothing writes take no memory, so a fill of the lower triangle alone keeps about half
    of the m x m matrix resident.

    ``fill(A)`` writes the matrix into A (its lower triangle is all that is read, so a fill may skip the upper).
    A failed factorisation has overwritten A, so a retry calls ``fill`` again and adds jitter as :func:`cholesky`
    does (``jitter * mean(diag) * 10**i``, a :class:`NumericalWarning` saying how much), then raises
    :class:`NotPSDError`. The factorisation is right-looking and blocked, ``block`` columns at a time (default
    :data:`CHOLESKY_PANEL` for A's device): each panel's diagonal block is factored (a ``block x block`` copy), the
    rows below it solved against that factor, and the trailing lower triangle updated by matrix products, a block of
    rows at a time, in place.
    """
    block = block or CHOLESKY_PANEL.get(A.device.type, 2048)
    fill(A)
    scale = A.diagonal().abs().mean().clamp_min(torch.finfo(A.dtype).tiny)
    for attempt in range(max_tries + 1):
        level = jitter * 10 ** (attempt - 1)
        if attempt:
            A.diagonal().add_(level * scale)
        if not _potrf_lower_(A, block):
            if attempt:
                warnings.warn(f"The {what} ({tuple(A.shape)}) was not positive definite; added jitter of "
                              f"{level:.1e} x its mean diagonal.", NumericalWarning, stacklevel=2)
            return A
        fill(A)  # the failed factorisation overwrote it
        if attempt == 0 and not all(torch.isfinite(A[i:i + block, :i + block].tril(i)).all()
                                    for i in range(0, A.shape[0], block)):
            raise _non_finite(what, A.shape)
    raise _not_positive_definite(what, A.shape, jitter * 10 ** (max_tries - 1),
                                 "a larger noise floor (noise_floor=...)")


def _potrf_lower_(A: Tensor, block: int) -> bool:
    """Factor A's lower triangle in place, ``block`` columns at a time; whether it failed (a leading minor not
    positive definite; A is then partly overwritten). Each panel's check is :func:`gpscale.device.check_failed`'s."""
    m = A.shape[0]
    for k0 in range(0, m, block):
        k1 = min(k0 + block, m)
        L_kk, info = torch.linalg.cholesky_ex(A[k0:k1, k0:k1])
        if check_failed(info.ne(0)):
            return True
        A[k0:k1, k0:k1] = L_kk
        for i0 in range(k1, m, block):  # the panel below: A_ik <- A_ik L_kk^{-T}
            i1 = min(i0 + block, m)
            A[i0:i1, k0:k1] = torch.linalg.solve_triangular(L_kk.mT, A[i0:i1, k0:k1], upper=True, left=False)
        for i0 in range(k1, m, block):  # the trailing lower triangle: A_ij -= A_ik A_jk^T
            i1 = min(i0 + block, m)
            A[i0:i1, k1:i1].addmm_(A[i0:i1, k0:k1], A[k1:i1, k0:k1].mT, alpha=-1)
    return False


def solve(A: Tensor, B: Tensor) -> Tensor:
    """``A^{-1} B`` for square ``A`` [m, m] and ``B`` [m, k], by LU as ``torch.linalg.solve``, whose error a singular
    A still raises; the check is one read on the host, deferrable as :func:`cholesky`'s is."""
    X, info = torch.linalg.solve_ex(A, B)
    if check_failed(info.ne(0)):
        return torch.linalg.solve(A, B)  # raises torch's error, naming the singular pivot
    return X


def _row_major(X: Tensor) -> Tensor:
    """X in row-major layout. A right-hand side given column-major comes back from LAPACK column-major however it is
    transposed on the way (a gradient that arrives as the transpose of a row-major tensor does): one copy here (0.30
    ms for 512 x 1,024 float32, two threads) costs less than one element-wise pass mixing layouts after it (0.76
    ms); for memory-bound sizes the two cost about the same (24 ms each at 512 x 8,192 float64)."""
    return X if X.is_contiguous() else X.contiguous()


def _solve_lower_transposed(L: Tensor, G: Tensor) -> Tensor:
    """``L^{-T} G`` row-major, solved as ``(G^T L^{-1})^T`` (see :func:`solve_lower`)."""
    return _row_major(torch.linalg.solve_triangular(L, G.mT, upper=False, left=False).mT)


def _solve_lower(L: Tensor, B: Tensor) -> Tensor:
    return _row_major(torch.linalg.solve_triangular(L.mT, B.mT, upper=True, left=False).mT)


class _SolveLower(torch.autograd.Function):
    """``A = L^{-1} B`` with ``dB = L^{-T} G`` (row-major) and either ``dL = -tril(dB A^T)``, formed from its lower
    blocks only (5/8 of that product's flops with four blocks; torch's backward forms the whole product and returns
    dL column-major), or, given the matrix Kuu that L factors, Kuu's gradient directly (see :func:`whiten`)."""

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
    runs at a twentieth of its speed (0.76 ms against 0.03 ms for a 512 x 1,024 float32 product, two threads); the
    transposed solve is also the faster one (2.0 against 3.4 ms for L [512, 512], B [512, 1,024])."""
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


def logdet_from_cholesky(L: Tensor) -> Tensor:
    """``log |A|`` from the Cholesky factor of ``A`` (any triangular factor with ``|A| = prod(diag)^2``)."""
    return 2.0 * L.diagonal(dim1=-2, dim2=-1).abs().log().sum(-1)


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
    skipped forward and backward, 5/8 of a dense product's flops with four blocks (at m = 512 and 1,024 columns,
    2.1 against 2.8 ms forward, two threads, float32)."""
    return _LowerTransposeProduct.apply(S, A)


class _WeightedSum(torch.autograd.Function):
    """``w^T K`` over the second-to-last axis, with dL/dK = w g^T formed by a broadcast multiply: as a matrix
    product's backward it is a product of inner dimension 1, which ran at a fraction of a multiply's speed (HVGP's
    [8, 262,144] orbit chunk: 3.3 ms against 2.3 in a profile of its paper step)."""

    @staticmethod
    def forward(ctx, w: Tensor, K: Tensor) -> Tensor:
        ctx.save_for_backward(w, K)
        return (w.unsqueeze(-2) @ K).squeeze(-2)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        w, K = ctx.saved_tensors
        need_w, need_K = ctx.needs_input_grad
        # g K^T, not K g: a batched product with one column ran ten times slower than with one row and K
        # transposed (1.5 against 0.16 ms at [8, 256, 1,024] float32)
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
    broadcast multiply for dL/dK backward. At [8, 256, 1,024] float32 (two threads, the median of 60): forward 0.22
    against 0.36 ms; forward and backward in both inputs 0.8 against 11 ms."""
    return _WeightedSum.apply(w, K)


class _SquaredNorms(torch.autograd.Function):
    """``||M_i||^2`` along one axis, with the backward ``dM = 2 g M`` as one multiply: ``(M * M).sum`` has autograd
    take two products of M's size and their sum, each a fresh tensor (for DBK's [n, 128] bases, four passes over n
    rows that page faults dominate; for the [8, 256, 1,024] float32 factors of an HVGP step, forward and backward
    1.8 -> 1.4 ms, float64 [512, 1,024] along the first axis 1.0 -> 0.75 ms). Along the last axis the squares are
    formed a block of rows at a time, never all at once."""

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


_NORM_ROWS = 8192  # rows a block: a block's square (4 MiB of 128 float32 columns) stays on the heap


def squared_norms(M: Tensor, dim: int = -1) -> Tensor:
    """``||M_i||^2`` along the axis ``dim`` of M (by default the last, [..., r] -> [...])."""
    return _SquaredNorms.apply(M, dim)


def whiten(K: Tensor, L: Tensor, Kuu: Tensor | None = None) -> Tensor:
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
    view): MKL multiplies a transposed wide operand into few columns at down to a fifth of the rate of the same
    product with that operand on the right, on two cores (float64 [8,192, 256] by [8,192, 4]: 3.8 against 0.78 ms;
    float32 [1,024, 512] by [1,024, 11]: 0.92 against 0.18 ms)."""
    return (B.transpose(-2, -1) @ A).transpose(-2, -1)


def gram(M: Tensor) -> Tensor:
    """``M^T M`` [p, p] for M [n, p], differentiable at the cost of one extra n p^2 product (not two)."""
    return _Gram.apply(M)


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


def conjugate_gradients(matvec: Callable[[Tensor], Tensor], b: Tensor, *,
                        preconditioner: Callable[[Tensor], Tensor] | None = None, tol: float = 1e-8,
                        max_iterations: int | None = None) -> tuple[Tensor, int]:
    """Solve ``K x = b`` for a symmetric positive definite K given by ``matvec`` (x -> K x, for b [n]) by
    (preconditioned) conjugate gradients from x = 0, stopping when ``||b - K x|| <= tol ||b||``.

    ``preconditioner`` applies ``M^{-1}`` for an SPD M close to K (e.g. :meth:`gpscale.models.grief.GRIEF.
    preconditioner`). Returns x and the number of iterations; warns (:class:`NumericalWarning`) when
    ``max_iterations`` (default n) pass without reaching ``tol``.
    """
    precondition = preconditioner if preconditioner is not None else (lambda v: v)
    x = torch.zeros_like(b)
    r = b.clone()
    z = precondition(r)
    d, rz = z, r @ z
    target = tol * torch.linalg.vector_norm(b)
    limit = b.shape[0] if max_iterations is None else max_iterations
    for iteration in range(limit):
        if torch.linalg.vector_norm(r) <= target:
            return x, iteration
        Kd = matvec(d)
        step = rz / (d @ Kd)
        x, r = x + step * d, r - step * Kd
        z = precondition(r)
        rz, rz_old = r @ z, rz
        d = z + (rz / rz_old) * d
    if torch.linalg.vector_norm(r) > target:
        warnings.warn(f"Conjugate gradients stopped after {limit} iterations with a relative residual of "
                      f"{(torch.linalg.vector_norm(r) / torch.linalg.vector_norm(b)).item():.2e} > tol = {tol}. "
                      "Raise max_iterations, loosen tol, or pass a preconditioner.", NumericalWarning, stacklevel=2)
    return x, limit


"""The Cholesky factorisation every method shares, and the errors it raises.

Every Cholesky in gpscale goes through :func:`cholesky`: it adds escalating jitter, warns when it had to, and
raises :class:`NotPSDError` with a remedy instead of returning NaN; a caller that handles failures itself takes
:func:`cholesky_ex`, the factorisation both use. :func:`cholesky_in_place` forms the factor in the matrix's own
memory, for the exact GP's n x n matrix.
"""
from __future__ import annotations

import warnings
from typing import Callable

import torch
from torch import Tensor

from ..device import check_failed

# The dtype of every small core (m x m, r x r, p x p) and its factorisations, whatever the model's dtype: their
# condition numbers grow with n / sigma^2 and with cond(K_uu), which float32 cannot hold.
CORE = torch.float64


class NotPSDError(RuntimeError):
    """A matrix that should be positive definite is not, even after adding jitter."""


class NumericalWarning(RuntimeWarning):
    """Numerical trouble that gpscale repaired (e.g. jitter added), which the user may want to know about."""


# LAPACK's Cholesky on the CPU (MKL's) slows down when the order is a multiple of 64, probably because its columns
# then fall into the same cache sets; a factorisation padded by a few rows of the identity runs at the speed of its
# neighbours' orders. The triangular solves and the inverse that read such a factor lose little, so only the
# factorisation is padded; not below an order of 128, where the padding costs more than the aliasing, nor a batch of
# matrices, which padding slows down.
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
    # checking those m numbers, not all m^2 of A, keeps the check a small part of the factorisation's time
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


def logdet_from_cholesky(L: Tensor) -> Tensor:
    """``log |A|`` from the Cholesky factor of ``A`` (any triangular factor with ``|A| = prod(diag)^2``)."""
    return 2.0 * L.diagonal(dim1=-2, dim2=-1).abs().log().sum(-1)

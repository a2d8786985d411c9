"""The real harmonic sub-kernels of an invariant kernel under a group action:
``k_t(x, x') = sum_s W[t, s] k(x, G^s x')`` [T, n1, n2], their symmetric Gram matrices from half the orbit, and the
check that the kernel is invariant at all."""
from __future__ import annotations

import operator

import torch
from torch import Tensor

from ..stationary import Kernel
from .group import GroupAction


def orbit_gram(kernel: Kernel, action: GroupAction, X1: Tensor, X2: Tensor) -> Tensor:
    """``k(X1, G^s X2)`` [S, n1, n2], from one kernel call on the stacked orbit."""
    if X1.ndim != 2 or X1.shape[-1] != X2.shape[-1]:
        raise ValueError(f"X1 [n1, d] and X2 [n2, d] must share d; got {tuple(X1.shape)} and {tuple(X2.shape)}.")
    orbit = action.orbit(X2)  # [S, n2, d]
    K = kernel(X1, orbit.reshape(-1, X2.shape[-1]))  # [n1, S * n2]
    return K.reshape(X1.shape[0], action.order, X2.shape[0]).movedim(1, 0)


def harmonic_kernels(kernel: Kernel, action: GroupAction, X1: Tensor, X2: Tensor) -> Tensor:
    """All real sub-kernels ``k_t(X1, X2) = sum_s W[t, s] k(X1, G^s X2)`` [T, n1, n2] from one orbit of X2."""
    K_orbit = orbit_gram(kernel, action, X1, X2)
    return torch.einsum("ts,sij->tij", action.weights(K_orbit.dtype, K_orbit.device), K_orbit)


def harmonic_kernel(kernel: Kernel, action: GroupAction, t: int, X1: Tensor, X2: Tensor) -> Tensor:
    """One real sub-kernel ``k_t(X1, X2)`` [n1, n2], t in 0..T-1 (row-major over the ways' frequencies)."""
    t = operator.index(t)
    if not 0 <= t < action.n_subkernels:
        raise ValueError(f"Sub-kernel t={t} is outside 0..{action.n_subkernels - 1} for {action!r}.")
    K_orbit = orbit_gram(kernel, action, X1, X2)
    return torch.einsum("s,sij->ij", action.weights(K_orbit.dtype, K_orbit.device)[t], K_orbit)


def harmonic_gram(kernel: Kernel, action: GroupAction, X: Tensor, t: int | None = None) -> Tensor:
    """``k_t(X, X)`` [T, n, n] (or [n, n] for one t), symmetric, from half the orbit of X.

    Invariance gives ``k(x, G^{-s} x') = k(G^s x, x') = k(x', G^s x)``, so K_{-s} = K_s^T, and the real weights are
    even in s: ``k_t = sym(sum_s W[t, s] K_s)`` needs K_s only for one of s and -s, with weight 2 W[t, s] where
    they differ. That is S / 2 + 1 kernel blocks instead of S for a cyclic group."""
    if t is not None and not 0 <= operator.index(t) < action.n_subkernels:
        raise ValueError(f"Sub-kernel t={t} is outside 0..{action.n_subkernels - 1} for {action!r}.")
    K = _half_orbit_grams(kernel, action, X)  # [n, H, n]
    W = action.half_orbit_weights(K.dtype, K.device)
    K_t = _symmetric(torch.einsum("th,ihj->tij", W if t is None else W[t:t + 1], K))
    return K_t if t is None else K_t[0]


def block_harmonic_grams(kernel: Kernel, action: GroupAction, Z: Tensor, ts: list[int]) -> Tensor:
    """``k_{t_b}(Z_b, Z_b)`` [B, m, m] for blocks of points Z [B, m, d], block b's own sub-kernel ``ts[b]``, as
    :func:`harmonic_gram` forms each: every block's half orbit in one product and their Gram matrices in one call
    of the kernel over a leading batch axis, which the kernel must take (:attr:`Kernel.takes_batches`), where a
    call per block took a dozen operators forward and backward for each."""
    K = _half_orbit_grams(kernel, action, Z)  # [B, m, H, m]
    # [B, H], its rows picked on the host: on a GPU, indexing with a list copies the list from the host
    W = action.constants.get(("half_orbit_weights", *ts),
                             lambda: action.half_orbit_weights(torch.float64, None)[list(ts)], K.dtype, K.device)
    return _symmetric(torch.einsum("bh,bihj->bij", W, K))


def _half_orbit_grams(kernel: Kernel, action: GroupAction, X: Tensor) -> Tensor:
    """``k(X_b, G^s X_b)`` [..., n, H, n] for s over the half orbit, for points X [n, d] (one kernel call on rows)
    or blocks X [B, n, d] (one over a batch axis)."""
    *batch, n, d = X.shape
    half = action.half_orbit()
    orbit = action.orbit(X.reshape(-1, d), half).view(len(half), *batch, n, d).movedim(0, -3)  # [..., H, n, d]
    return kernel(X, orbit.reshape(*batch, len(half) * n, d)).view(*batch, n, len(half), n)


def _symmetric(K: Tensor) -> Tensor:
    return 0.5 * (K + K.mT)


def check_invariant(kernel: Kernel, action: GroupAction, X: Tensor, atol: float = 1e-10) -> None:
    """Raise ValueError unless ``k(G_j X, G_j X) = k(X, X)`` to ``atol`` for every generator G_j (which gives
    invariance to the whole group) on the sample points X [n, d]."""
    with torch.no_grad():
        K = kernel(X, X)
        stride = action.order
        for j, P in enumerate(action.periods):
            stride //= P  # G_j is the element with s_j = 1 and every other exponent 0
            if P == 1:
                continue
            GX = action.apply(X, stride)
            error = (kernel(GX, GX) - K).abs().max().item()
            if error > atol:
                raise ValueError(
                    f"{type(kernel).__name__} is not invariant to way {j} (period {P}) of {action!r}: "
                    f"max |k(G X, G X') - k(X, X')| = {error:.2e} > atol={atol:g}, so its harmonic sub-kernels "
                    "would be neither symmetric nor PSD. Use hyperparameters the group respects: ard=False (one "
                    "shared lengthscale) for PCA negations, rotations, coordinate shifts and image actions, and "
                    "sphere embeddings rather than raw (lon, lat) for longitude rotations.")

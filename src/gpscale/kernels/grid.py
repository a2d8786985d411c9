"""Cartesian grids of inducing points and the GP-GRIEF eigenfunctions (Evans & Nair 2018, arXiv 1807.02125).

With a product kernel ``k(x, z) = prod_i k_i(x_i, z_i)`` and inducing points U on the grid ``xg[0] x ... x xg[d-1]``
(``mbar_i`` points in dimension i, ``m = prod_i mbar_i`` of them, up to 10^33 and more), every quantity GRIEF needs
factorises over dimensions:

    K_UU = K^(1) ⊗ ... ⊗ K^(d),         K^(i) = k_i(xg[i], xg[i]) = Q^(i) diag(lambda^(i)) Q^(i)T   [mbar_i, mbar_i]
    K_XU = K_XU^(1) * ... * K_XU^(d),   K_XU^(i) = k_i(X[:, i], xg[i])                             [n, mbar_i]

(``⊗`` Kronecker, ``*`` row-wise Khatri-Rao). The p largest eigenvalues of K_UU and their Kronecker indices come from
Algorithm 1 in O(d mbar p) memory, and the feature matrix ``Phi = K_XU Q S_p^T Lambda_p^{-1/2}`` [n, p], with
``Phi Phi^T`` the rank-p Nyström approximation of K_XX, from Theorem 2 as a Hadamard product of d matrices [n, p].
Nothing of size m is ever formed: eigenvalues are handled as logs and Phi in the log domain with signs.

The d one-dimensional quantities are held as padded batches, one tensor each: the grids [d, M] (:func:`pad_grids`,
M the largest mbar_i), the factors and their eigenvectors [d, M, M], the cross factors [d, n, M], with zeros past
each dimension's mbar_i, so that every step is one batched operation instead of one per dimension.

Kronecker order is C (row-major): grid point (g_1, ..., g_d) has flat index ``sum_i g_i prod_{j>i} mbar_j``, so the
first dimension is the most significant. Everything here is float64 (the callers cast): the log-domain sums of d
terms would lose digits in float32.

The 1-D kernels are squared exponentials, ``k_i(a, b) = exp(-(a - b)^2 / (2 l_i^2))``, with the signal variance
``s_f^2`` on the first factor only (on every factor it would be raised to the power d).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from .stationary import underflow_cutoff

__all__ = ["grid_points", "pad_grids", "se_factor", "real_points", "grid_factors", "cross_factors", "factor_eigh",
           "top_eigenvalues", "grief_features", "interpolated_kernel"]

# eigh's backward ignores pairs of eigenvalues closer than this (relative to the largest): they are degenerate to
# working precision, and 1 / (lambda_i - lambda_j) would turn round-off into inf or NaN.
DEGENERATE_GAP = 100 * torch.finfo(torch.float64).eps


def grid_points(X: Tensor, grid_size: int = 10) -> list[Tensor]:
    """The 1-D grids xg[i] [mbar_i] of the inputs X [n, d] (as the official ``InducingGrid``).

    ``mbar_i = min(grid_size, #unique(X[:, i]))``: a column with at most ``grid_size`` distinct values (binary or
    categorical features, a constant) gets exactly those values, sorted; any other gets ``grid_size`` points
    spaced evenly from its minimum to its maximum. Build it from the training inputs only
    (the official tutorial builds it from train and test inputs together, which lets the test inputs shape the
    features the model is trained with).
    """
    grids = []
    for column in X.T:
        unique = torch.unique(column)
        if unique.numel() <= grid_size:
            grids.append(unique)
        else:
            grids.append(torch.linspace(column.min().item(), column.max().item(), grid_size, dtype=X.dtype,
                                        device=X.device))
    return grids


def se_factor(a: Tensor, b: Tensor, lengthscale: Tensor, hold: bool = False) -> Tensor:
    """``exp(-(a_j - b_k)^2 / (2 l^2))`` [..., na, nb] for 1-D points a [..., na], b [..., nb] and a lengthscale l
    (a scalar, or one per leading entry shaped to broadcast against [..., na, nb]).

    With ``hold``, the exponent is held at :func:`~gpscale.kernels.stationary.underflow_cutoff`, as the stationary
    kernels' are (a held entry is flat: its gradient is 0): an exponential below the normal range, and the
    subnormal numbers it returns, run at a tenth of the speed or less on x86 processors, and a fit of GP-GRIEF
    can take some of its cross factors' exponents below it (the GP-GRIEF lab notes give a count). The grid's own
    small factors are left exact: LAPACK's eigendecomposition can fail to converge on a nearly diagonal one whose
    far entries are held (as it did at a lengthscale GP-GRIEF-I sampled)."""
    exponent = -0.5 * ((a.unsqueeze(-1) - b.unsqueeze(-2)) / lengthscale) ** 2
    return torch.exp(exponent.clamp_min_(underflow_cutoff(a.dtype)) if hold else exponent)


def pad_grids(xg: list[Tensor], width: int | None = None) -> tuple[Tensor, tuple[int, ...]]:
    """The grids xg[i] [mbar_i] as one [d, width] tensor (row i holds xg[i] in its first mbar_i entries, zeros after
    them; width defaults to the largest mbar_i), the layout the functions below take, and the sizes mbar_i."""
    sizes = tuple(int(x.shape[0]) for x in xg)
    grid = xg[0].new_zeros(len(xg), max(sizes) if width is None else width)
    for i, x in enumerate(xg):
        grid[i, : x.shape[0]] = x
    return grid, sizes


def real_points(sizes: tuple[int, ...], width: int, device: torch.device | None = None) -> Tensor:
    """[d, width] bool: which entries of a padded grid are grid points (the first ``sizes[i]`` of row i)."""
    return torch.arange(width, device=device) < torch.tensor(sizes, device=device).unsqueeze(-1)


def _factor_scales(outputscale: Tensor, d: int) -> Tensor:
    """[d]: s_f^2 for the first factor, 1 for the others."""
    return torch.cat([outputscale.reshape(1), outputscale.new_ones(d - 1)])


def grid_factors(grid: Tensor, sizes: tuple[int, ...], lengthscale: Tensor, outputscale: Tensor,
                 jitter: float = 1e-12) -> Tensor:
    """The Kronecker factors ``K^(i) = k_i(xg[i], xg[i]) + jitter I`` of K_UU, padded into one tensor [d, M, M].

    Args:
        grid: the d grids, padded: row i holds xg[i] [mbar_i] in its first ``sizes[i]`` entries.
        sizes: mbar_i for each dimension.
        lengthscale: [d] (ARD) or [1] (shared).
        outputscale: s_f^2, a scalar, multiplied into the first factor only.
        jitter: added to each factor, as the official code's ``dim_noise_var`` (so K_UU gets
            ``(K^(1) + eps I) ⊗ (K^(2) + eps I) ⊗ ...``, not ``+ eps I``).

    K^(i) fills the top-left mbar_i x mbar_i block of entry i. The rest is ``-c_i I`` with c_i the block's diagonal
    (s_f^2 or 1), uncoupled from it, so that entry i's eigenvalues are the block's and M - mbar_i copies of -c_i.
    The block's are all above -c_i (it is positive definite but for round-off), so an ascending eigendecomposition
    lists the padding's first (see :func:`factor_eigh`); and the block's largest is at least its diagonal c_i, so
    the largest magnitude, from which the eigh backward's degeneracy threshold is taken, is the block's own. All d
    factors are then one batched operation each, where a list took a dozen small operations per dimension forward
    and back.
    """
    d, width = grid.shape
    scale = _factor_scales(outputscale, d).unsqueeze(-1).unsqueeze(-1)  # [d, 1, 1]
    real = real_points(sizes, width, grid.device)
    block = real.unsqueeze(-1) & real.unsqueeze(-2)
    eye = torch.eye(width, dtype=grid.dtype, device=grid.device)
    K = scale * se_factor(grid, grid, lengthscale.expand(d).unsqueeze(-1).unsqueeze(-1)) + jitter * eye
    return torch.where(block, K, -scale * eye)


def cross_factors(X: Tensor, grid: Tensor, sizes: tuple[int, ...], lengthscale: Tensor,
                  outputscale: Tensor) -> Tensor:
    """The Khatri-Rao factors ``K_XU^(i) = k_i(X[:, i], xg[i])`` of K_XU (eq. 9), s_f^2 on the first, padded into
    one tensor [d, n, M]: entry i holds K_XU^(i) [n, mbar_i] in its first mbar_i columns, zeros after them (``grid``
    and ``sizes`` as :func:`grid_factors`)."""
    d, width = grid.shape
    weights = torch.where(real_points(sizes, width, grid.device), _factor_scales(outputscale, d).unsqueeze(-1), 0.0)
    ls = lengthscale.expand(d).unsqueeze(-1).unsqueeze(-1)
    return se_factor(X.T, grid, ls, hold=True) * weights.unsqueeze(-2)


class _SymmetricEigh(torch.autograd.Function):
    """``torch.linalg.eigh`` whose backward skips degenerate pairs.

    The gradient of a symmetric eigendecomposition ``K = Q diag(lam) Q^T`` is
    ``Q (diag(g_lam) + F ∘ (Q^T g_Q)) Q^T`` with ``F_ij = 1 / (lam_j - lam_i)``. torch evaluates F for every pair,
    so two equal eigenvalues give ``0 / 0 = NaN`` in the whole gradient even when neither eigenvector is used.
    Here ``F_ij = 0`` for pairs closer than ``DEGENERATE_GAP`` times the largest eigenvalue (of each matrix of a
    batch). GRIEF uses only the selected eigenpairs, so the unselected columns of g_Q are 0 and contribute nothing;
    the gradient is exact when each selected eigenvalue is separated from every other one, and finite otherwise,
    where the eigenvector is not a differentiable function of K anyway (SE factors have simple eigenvalues, except at
    the jitter floor, where nearly equal eigenvalues are common).
    """

    @staticmethod
    def forward(ctx, K: Tensor) -> tuple[Tensor, Tensor]:
        lam, Q = torch.linalg.eigh(K)
        ctx.save_for_backward(lam, Q)
        return lam, Q

    @staticmethod
    def backward(ctx, g_lam: Tensor, g_Q: Tensor) -> Tensor:
        lam, Q = ctx.saved_tensors
        gap = lam.unsqueeze(-2) - lam.unsqueeze(-1)  # [..., i, j] = lam_j - lam_i
        separated = gap.abs() > DEGENERATE_GAP * lam.abs().amax(-1, keepdim=True).unsqueeze(-1)
        F = torch.where(separated, 1.0 / torch.where(separated, gap, torch.ones_like(gap)), torch.zeros_like(gap))
        inner = F * (Q.mT @ g_Q) + torch.diag_embed(g_lam)
        G = Q @ inner @ Q.mT
        return 0.5 * (G + G.mT)


def factor_eigh(K: Tensor, sizes: tuple[int, ...] | None = None) -> tuple[Tensor, Tensor]:
    """Eigenvalues lam [..., M] (ascending) and orthonormal eigenvectors Q [..., M, M] (columns) of factors K.

    Round-off can make the small eigenvalues of a smooth kernel zero or negative, which breaks both the logs and
    the exactness of Algorithm 1 (it needs positive factors, see :func:`top_eigenvalues`), so they are clipped at
    ``eps * max(lam)``, the resolution of eigh; with the default jitter of 1e-12 the clip rarely acts.
    Differentiable, without NaN on degenerate pairs (see :class:`_SymmetricEigh`).

    With ``sizes``, K [d, M, M] is :func:`grid_factors`' padded stack: factor i's mbar_i eigenpairs come first in
    ascending order (the padding's eigenvalues, listed first by eigh, are moved behind them), and the padding's
    entries are 0 in lam and in Q, as they would be had the factors been padded after their decomposition.
    """
    lam, Q = _SymmetricEigh.apply(K)
    if sizes is not None:  # rotate each factor's block to the front: its eigenvalues are eigh's last mbar_i
        width = K.shape[-1]
        order = (torch.arange(width, device=K.device) + width - torch.tensor(sizes, device=K.device).unsqueeze(-1))
        order = order % width  # [d, M]
        lam, Q = lam.gather(-1, order), Q.gather(-1, order.unsqueeze(-2).expand_as(Q))
    floor = torch.finfo(lam.dtype).eps * lam.detach().amax(-1, keepdim=True)
    lam = torch.maximum(lam, floor)
    if sizes is None:
        return lam, Q
    real = real_points(sizes, K.shape[-1], K.device)
    return torch.where(real, lam, 0.0), Q * (real.unsqueeze(-1) & real.unsqueeze(-2))


def top_eigenvalues(lams: Tensor, sizes: tuple[int, ...], p: int) -> tuple[Tensor, Tensor]:
    """Algorithm 1: the p largest eigenvalues of ``⊗_i diag(lam^(i))`` and their Kronecker indices.

    Args:
        lams: [d, M], row i holding lam^(i) [mbar_i], all > 0 (the products are monotone in each factor only then),
            in its first ``sizes[i]`` entries (the rest are ignored), as :func:`factor_eigh` gives them.
        sizes: mbar_i for each dimension.
        p: how many; capped at m = prod mbar_i.

    Returns:
        logl [p'] (descending, p' = min(p, m)), the log-eigenvalues, differentiable with respect to ``lams``;
        idxs [p', d] (int64): eigenvalue k is ``prod_i lam^(i)[idxs[k, i]]``.

    Dimension by dimension, the candidates are the current top p times every lam^(i) (``|logl| * mbar_i`` of them,
    the C order of ``logl ⊗ lam^(i)``), of which the top p are kept: a prefix outside the top p is beaten by p
    prefixes times the same suffix, so no eigenvalue of the top p is lost. Time O(d mbar p log(mbar p)), memory
    O(mbar p), whatever m. The padding's log-eigenvalues are -inf, so its candidates sort last and are never kept.
    The sort is stable, so exact ties go to the lower flat index and the top-p set is reproducible: isotropic kernels
    on identical grids give equal products, and a tie that straddles position p would otherwise be broken
    arbitrarily. (Identical factors decomposed in one batch by :func:`factor_eigh` can differ in the last bit, as
    MKL's batched eigh gives for odd sizes; their ties are then broken by that round-off, the same in every run.)
    """
    width = lams.shape[-1]
    real = real_points(sizes, width, lams.device)
    logs = torch.where(real, torch.where(real, lams, 1.0).log(), -math.inf)  # the inner where keeps log's grad finite
    logl, order = torch.sort(logs[0], descending=True, stable=True)
    kept = min(p, sizes[0])
    logl, idxs = logl[:kept], order[:kept].unsqueeze(-1)
    for log_lam, size in zip(logs[1:], sizes[1:]):
        candidates = (logl.unsqueeze(-1) + log_lam).reshape(-1)  # [|logl| * M], -inf past each row's mbar_i
        kept = min(p, logl.shape[0] * size)
        logl, order = torch.sort(candidates, descending=True, stable=True)
        logl, order = logl[:kept], order[:kept]
        # floor by the padded width: any other divisor still gives a PSD kernel, but the wrong one
        idxs = torch.cat([idxs[order // width], (order % width).unsqueeze(-1)], dim=1)
    return logl, idxs


def grief_features(Kxu: Tensor, Q: Tensor, idxs: Tensor, logl: Tensor) -> Tensor:
    """``Phi = K_XU Q S_p^T Lambda_p^{-1/2}`` [n, p] by Theorem 2, in the log domain (eq. 15):

        Phi = [⊙_i sign(B^(i))] ⊙ exp(sum_i log|B^(i)| - 1/2 1_n logl^T),    B^(i) = K_XU^(i) Q^(i)[:, idxs[:, i]].

    ``R^(i) = K_XU^(i) Q^(i)`` [n, M] for all d dimensions is one batched product, of which only the c columns that
    ``idxs`` selects somewhere are kept. Column k of B^(i) is the kept column that ``idxs[k, i]`` names, so with the
    one-hot selection S [c, p] the sum over dimensions of the log-magnitudes is one matrix product,
    ``log|R_kept| S``, and the sign is the parity of the negative factors, ``[R_kept < 0] S`` mod 2: O(d n M^2 + n c
    p) at matmul speed (c <= d M, usually a few per dimension), where gathering d [n, p] matrices is bound by memory
    traffic, several times slower forward and backward. An exact zero in some B^(i) contributes
    log 1 = 0 and zeroes its entry of Phi through the count ``[R_kept == 0] S``, without NaN (its gradient with
    respect to that entry is then taken as 0, a measure-zero case). Dividing by sqrt(lambda) inside the exponent
    keeps Phi of order 1 where the products themselves over- or underflow.

    Args:
        Kxu: [d, n, M], the factors K_XU^(i) [n, mbar_i] padded with zero columns (:func:`cross_factors`).
        Q: [d, M, M], the eigenvector matrices Q^(i) [mbar_i, mbar_i] (columns) padded with zeros
            (:func:`factor_eigh` with sizes).
        idxs: [p, d] Kronecker indices from :func:`top_eigenvalues`.
        logl: [p] log-eigenvalues of those indices.
    """
    d, n, width = Kxu.shape
    p = idxs.shape[0]
    selected = idxs + torch.arange(d, device=idxs.device) * width  # [p, d]: column i M + j is R^(i)[:, j]
    used = torch.zeros(d * width, dtype=torch.bool, device=idxs.device)
    used[selected] = True
    kept = used.nonzero().squeeze(-1)  # [c], ascending
    S = Kxu.new_zeros(kept.shape[0], p)  # [c, p]
    S[(used.cumsum(0) - 1)[selected], torch.arange(p, device=idxs.device).unsqueeze(-1)] = 1.0
    R = (Kxu @ Q).transpose(0, 1).reshape(n, d * width).index_select(1, kept)  # [n, c]
    is_zero = R == 0
    log_abs = torch.where(is_zero, torch.ones_like(R), R).abs().log() @ S
    with torch.no_grad():
        odd = ((R < 0).to(R.dtype) @ S).to(torch.int32) & 1
        sign = (1 - 2 * odd).to(log_abs.dtype)
        if is_zero.any():
            sign = torch.where(is_zero.to(R.dtype) @ S > 0, 0.0, sign)
    return sign * torch.exp(log_abs - 0.5 * logl)


def interpolated_kernel(E: list[Tensor], K: list[Tensor], rows: slice = slice(None)) -> Tensor:
    """Rows ``rows`` of the interpolated covariance ``E K_UU E^T`` [n_rows, n] on a grid, for interpolation that
    factorises over dimensions (``E = E^(1) * ... * E^(d)``, row-wise Khatri-Rao; paper Section 4.2):

        E K_UU E^T = ⊙_i E^(i) K^(i) E^(i)T,

    d products of [n, mbar_i] matrices instead of one with m = prod_i mbar_i columns, so structured kernel
    interpolation (SKI) costs O(d n^2 mbar) rather than growing exponentially in d. ``E^(i)`` may be dense or a
    torch sparse matrix (e.g. Wilson & Nickisch's cubic weights, 4 non-zeros per row); ``E^(i) = K_XU^(i)
    K^(i)^{-1}`` gives SoR.
    The result is quadratic in n: take it a block of rows at a time for large n.

    Args:
        E: d interpolation factors E^(i) [n, mbar_i].
        K: d Kronecker factors K^(i) [mbar_i, mbar_i] of K_UU (e.g. the blocks ``K[i, :mbar_i, :mbar_i]`` of
            :func:`grid_factors`).
        rows: the rows of the result to form.
    """
    out = None
    for Ei, Ki in zip(E, K):
        Ei = Ei.to_dense() if Ei.is_sparse else Ei  # [n, mbar_i]: small whatever the sparsity
        block = (Ei[rows] @ Ki) @ Ei.T  # [n_rows, n]
        out = block if out is None else out * block
    return out


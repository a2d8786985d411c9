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

Kronecker order is C (row-major): grid point (g_1, ..., g_d) has flat index ``sum_i g_i prod_{j>i} mbar_j``, so the
first dimension is the most significant. Everything here is float64 (the callers cast): the log-domain sums of d
terms would lose digits in float32.

The 1-D kernels are squared exponentials, ``k_i(a, b) = exp(-(a - b)^2 / (2 l_i^2))``, with the signal variance
``s_f^2`` on the first factor only (on every factor it would be raised to the power d).
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["grid_points", "se_factor", "grid_factors", "cross_factors", "factor_eigh", "top_eigenvalues",
           "grief_features", "interpolated_kernel"]

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


def se_factor(a: Tensor, b: Tensor, lengthscale: Tensor) -> Tensor:
    """``exp(-(a_j - b_k)^2 / (2 l^2))`` [na, nb] for 1-D points a [na], b [nb] and a scalar lengthscale l."""
    return torch.exp(-0.5 * ((a.unsqueeze(-1) - b) / lengthscale) ** 2)


def grid_factors(xg: list[Tensor], lengthscale: Tensor, outputscale: Tensor, jitter: float = 1e-12) -> list[Tensor]:
    """The Kronecker factors ``K^(i) = k_i(xg[i], xg[i]) + jitter I`` [mbar_i, mbar_i] of K_UU.

    Args:
        xg: d grids [mbar_i].
        lengthscale: [d] (ARD) or [1] (shared).
        outputscale: s_f^2, a scalar, multiplied into the first factor only.
        jitter: added to each factor, as the official code's ``dim_noise_var`` (so K_UU gets
            ``(K^(1) + eps I) ⊗ (K^(2) + eps I) ⊗ ...``, not ``+ eps I``).
    """
    ls = lengthscale.expand(len(xg))
    factors = []
    for i, x in enumerate(xg):
        K = se_factor(x, x, ls[i])
        K = outputscale * K if i == 0 else K
        factors.append(K + jitter * torch.eye(x.shape[0], dtype=K.dtype, device=K.device))
    return factors


def cross_factors(X: Tensor, xg: list[Tensor], lengthscale: Tensor, outputscale: Tensor) -> list[Tensor]:
    """The Khatri-Rao factors ``K_XU^(i) = k_i(X[:, i], xg[i])`` [n, mbar_i] of K_XU (eq. 9), s_f^2 on the first."""
    ls = lengthscale.expand(len(xg))
    factors = [se_factor(X[:, i], x, ls[i]) for i, x in enumerate(xg)]
    factors[0] = outputscale * factors[0]
    return factors


class _SymmetricEigh(torch.autograd.Function):
    """``torch.linalg.eigh`` whose backward skips degenerate pairs.

    The gradient of a symmetric eigendecomposition ``K = Q diag(lam) Q^T`` is
    ``Q (diag(g_lam) + F ∘ (Q^T g_Q)) Q^T`` with ``F_ij = 1 / (lam_j - lam_i)``. torch evaluates F for every pair,
    so two equal eigenvalues give ``0 / 0 = NaN`` in the whole gradient even when neither eigenvector is used.
    Here ``F_ij = 0`` for pairs closer than ``DEGENERATE_GAP`` times the largest eigenvalue. GRIEF uses only the
    selected eigenpairs, so the unselected columns of g_Q are 0 and contribute nothing; the gradient is exact when
    each selected eigenvalue is separated from every other one, and finite otherwise, where the eigenvector
    is not a differentiable function of K anyway (SE factors have simple eigenvalues, except at the jitter
    floor, where nearly equal eigenvalues are common).
    """

    @staticmethod
    def forward(ctx, K: Tensor) -> tuple[Tensor, Tensor]:
        lam, Q = torch.linalg.eigh(K)
        ctx.save_for_backward(lam, Q)
        return lam, Q

    @staticmethod
    def backward(ctx, g_lam: Tensor, g_Q: Tensor) -> Tensor:
        lam, Q = ctx.saved_tensors
        gap = lam.unsqueeze(-2) - lam.unsqueeze(-1)  # [i, j] = lam_j - lam_i
        separated = gap.abs() > DEGENERATE_GAP * lam.abs().max()
        F = torch.where(separated, 1.0 / torch.where(separated, gap, torch.ones_like(gap)), torch.zeros_like(gap))
        inner = F * (Q.T @ g_Q) + torch.diag(g_lam)
        G = Q @ inner @ Q.T
        return 0.5 * (G + G.T)


def factor_eigh(K: Tensor) -> tuple[Tensor, Tensor]:
    """Eigenvalues lam [mbar] (ascending) and orthonormal eigenvectors Q [mbar, mbar] (columns) of one factor K.

    Round-off can make the small eigenvalues of a smooth kernel zero or negative, which breaks both the logs and
    the exactness of Algorithm 1 (it needs positive factors, see :func:`top_eigenvalues`), so they are clipped at
    ``eps * max(lam)``, the resolution of eigh; with the default jitter of 1e-12 the clip rarely acts.
    Differentiable, without NaN on degenerate pairs (see :class:`_SymmetricEigh`).
    """
    lam, Q = _SymmetricEigh.apply(K)
    floor = torch.finfo(lam.dtype).eps * lam.detach().max()
    return torch.maximum(lam, floor), Q


def top_eigenvalues(lams: list[Tensor], p: int) -> tuple[Tensor, Tensor]:
    """Algorithm 1: the p largest eigenvalues of ``⊗_i diag(lam^(i))`` and their Kronecker indices.

    Args:
        lams: d vectors lam^(i) [mbar_i], all > 0 (the products are monotone in each factor only then).
        p: how many; capped at m = prod mbar_i.

    Returns:
        logl [p'] (descending, p' = min(p, m)), the log-eigenvalues, differentiable with respect to ``lams``;
        idxs [p', d] (int64): eigenvalue k is ``prod_i lam^(i)[idxs[k, i]]``.

    Dimension by dimension, the candidates are the current top p times every lam^(i) (``|logl| * mbar_i`` of them,
    index ``a * mbar_i + b``, the C order of ``logl ⊗ lam^(i)``), of which the top p are kept: a prefix outside
    the top p is beaten by p prefixes times the same suffix, so no eigenvalue of the top p is lost. Time
    O(d mbar p log(mbar p)), memory O(mbar p), whatever m. The sort is stable, so ties go to the lower flat
    index and the top-p set is reproducible: isotropic kernels on identical grids give exactly equal products,
    and a tie that straddles position p would otherwise be broken arbitrarily.
    """
    logl, order = torch.sort(torch.log(lams[0]), descending=True, stable=True)
    logl, idxs = logl[:p], order[:p].unsqueeze(-1)
    for lam in lams[1:]:
        mbar = lam.shape[0]
        candidates = (logl.unsqueeze(-1) + torch.log(lam)).reshape(-1)  # [|logl| * mbar]
        logl, order = torch.sort(candidates, descending=True, stable=True)
        logl, order = logl[:p], order[:p]
        # floor by the size of the dimension being appended: any other divisor still gives a PSD kernel, but the
        # wrong one
        idxs = torch.cat([idxs[order // mbar], (order % mbar).unsqueeze(-1)], dim=1)
    return logl, idxs


def grief_features(Kxu: list[Tensor], Q: list[Tensor], idxs: Tensor, logl: Tensor) -> Tensor:
    """``Phi = K_XU Q S_p^T Lambda_p^{-1/2}`` [n, p] by Theorem 2, in the log domain (eq. 15):

        Phi = [⊙_i sign(B^(i))] ⊙ exp(sum_i log|B^(i)| - 1/2 1_n logl^T),    B^(i) = K_XU^(i) Q^(i)[:, idxs[:, i]].

    Only the c_i distinct eigenvector columns that ``idxs[:, i]`` selects are multiplied, R^(i) = K_XU^(i)
    Q^(i)[:, columns] [n, c_i]. Column k of B^(i) is the column of R^(i) that ``idxs[k, i]`` names, so with the
    one-hot selection S [sum_i c_i, p] the sum over dimensions of the log-magnitudes is one matrix product,
    ``[log|R^(1)|, ..., log|R^(d)|] S``, and the sign is the parity of the negative factors, ``[R < 0] S`` mod 2:
    O(d n mbar c + n p sum_i c_i) at matmul speed, where gathering d [n, p] matrices is bound by memory traffic
    (5-10 times slower forward and backward at d = 18, p = 1000). An exact zero in some B^(i) contributes log 1 = 0
    and zeroes its entry of Phi through the count ``[R == 0] S``, without NaN (its gradient with respect to that
    entry is then taken as 0, a measure-zero case). Dividing by sqrt(lambda) inside the exponent keeps Phi of order
    1 where the products themselves over- or underflow.

    Args:
        Kxu: d factors K_XU^(i) [n, mbar_i].
        Q: d eigenvector matrices Q^(i) [mbar_i, mbar_i] (columns).
        idxs: [p, d] Kronecker indices from :func:`top_eigenvalues`.
        logl: [p] log-eigenvalues of those indices.
    """
    log_R, negative, zero, selections = [], [], [], []
    for i, (K, Qi) in enumerate(zip(Kxu, Q)):
        columns, inverse = torch.unique(idxs[:, i], return_inverse=True)
        R = K @ Qi[:, columns]  # [n, c_i]
        is_zero = R == 0
        log_R.append(torch.where(is_zero, torch.ones_like(R), R).abs().log())
        negative.append((R < 0).to(R.dtype))
        zero.append(is_zero.to(R.dtype))
        selections.append(torch.nn.functional.one_hot(inverse, columns.numel()).T.to(R.dtype))  # [c_i, p]
    S = torch.cat(selections)  # [sum_i c_i, p]
    log_abs = torch.cat(log_R, dim=1) @ S
    with torch.no_grad():
        odd = (torch.cat(negative, dim=1) @ S).to(torch.int32) & 1
        sign = (1 - 2 * odd).to(log_abs.dtype)
        zero = torch.cat(zero, dim=1)
        if zero.any():
            sign = torch.where(zero @ S > 0, 0.0, sign)
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
        K: d Kronecker factors K^(i) [mbar_i, mbar_i] of K_UU (e.g. :func:`grid_factors`).
        rows: the rows of the result to form.
    """
    out = None
    for Ei, Ki in zip(E, K):
        Ei = Ei.to_dense() if Ei.is_sparse else Ei  # [n, mbar_i]: small whatever the sparsity
        block = (Ei[rows] @ Ki) @ Ei.T  # [n_rows, n]
        out = block if out is None else out * block
    return out


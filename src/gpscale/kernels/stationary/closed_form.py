"""The backward passes of stationary kernel matrices in closed form: ``torch.autograd.Function`` s that keep K (or
the state its slope reads) instead of every n1 x n2 intermediate, and apply the scalars to [n, d] results.

Each takes the kernel (a :class:`~gpscale.kernels.stationary.Stationary`) for its :meth:`gram` and
:meth:`weighted_slope`, and scaled inputs A = X / l.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .distances import distance_gradient

if TYPE_CHECKING:
    from .radial import Stationary


class StationaryGram(torch.autograd.Function):
    """``s^2 g(||a - b||^2)`` [..., n1, n2] for scaled inputs A [..., n1, d], B [..., n2, d], with the backward in
    closed form.

    With ``G = dL/dK * s^2 g'`` = c H (the kernel's :meth:`~Stationary.weighted_slope`), the Gram expansion gives
    ``dL/dA = 2 c (rowsum(H) A - H B)`` and ``dL/dB = 2 c (colsum(H) B - H^T A)``, and ``dL/ds^2 = <dL/dK, K> / s^2``.
    Autograd through the expression instead keeps every n1 x n2 intermediate (distance, root, exponential,
    polynomial) and takes a pass over each on the way back: for the kernel matrices that dominate an HVGP or SVGP
    step (a batch against every inducing point of every orbit), element-wise work is most of the time. Here the
    output K is saved in place of g (g = K / s^2), the scalars c and s^2 are applied to [n, d] results, and the
    backward reads n1 x n2 matrices only to form H and <dL/dK, K>, besides the two products (whose extra column
    gives H's row and column sums, :func:`distance_gradient`).
    """

    @staticmethod
    def forward(ctx, A: Tensor, B: Tensor, outputscale: Tensor, kernel: Stationary) -> Tensor:
        K, state = kernel.gram(A, B, outputscale)
        ctx.kernel = kernel
        ctx.save_for_backward(A, B, outputscale, K, *state)
        return K

    @staticmethod
    @once_differentiable  # the saved K and state are not differentiable functions of A and B
    def backward(ctx, grad: Tensor):
        A, B, outputscale, K, *state = ctx.saved_tensors
        need_A, need_B, need_scale, _ = ctx.needs_input_grad
        dA = dB = dscale = None
        if need_scale:
            dscale = torch.tensordot(grad, K, dims=K.dim()) / outputscale
        if need_A or need_B:
            H, c = ctx.kernel.weighted_slope(grad, K, tuple(state))
            if need_A:
                dA = distance_gradient(H, A, B).mul_(2.0 * c)
            if need_B:
                dB = distance_gradient(H, B, A, transposed=True).mul_(2.0 * c)
        return dA, dB, dscale, None


class WeightedSelfGrams(torch.autograd.Function):
    """``v_i = sum_pq W_pq s^2 g(||a_ip - a_iq||^2)`` [c] for scaled inputs A [c, r, d] and a symmetric W [r, r],
    with the backward in closed form.

    Both arguments of each Gram matrix are the same points, and with W symmetric so is H (as
    :class:`StationaryGram`'s, here with dL/dK_i = dL/dv_i W), so the gradients through the two arguments are equal
    and ``dL/dA = 4 c (rowsum(H) A - H A)``: one product a set where the Gram matrix's own backward takes two, and
    no [c, r, r] gradient formed from the weighted sum's backward first. ``dL/dW = sum_i dL/dv_i K_i`` and
    ``dL/ds^2 = sum_i dL/dv_i v_i / s^2``.
    """

    @staticmethod
    def forward(ctx, A: Tensor, weights: Tensor, outputscale: Tensor, kernel: Stationary) -> Tensor:
        K, state = kernel.gram(A, A, outputscale)
        values = K.flatten(-2) @ weights.reshape(-1)
        ctx.kernel = kernel
        ctx.save_for_backward(A, weights, outputscale, K, values, *state)
        return values

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        A, weights, outputscale, K, values, *state = ctx.saved_tensors
        need_A, need_weights, need_scale, _ = ctx.needs_input_grad
        dA = dweights = dscale = None
        if need_scale:
            dscale = (grad @ values) / outputscale
        if need_weights:
            dweights = torch.mv(K.flatten(-2).T, grad).view_as(weights)  # not a product of inner dimension c
        if need_A:
            H, c = ctx.kernel.weighted_slope(weights * grad[:, None, None], K, tuple(state))
            dA = distance_gradient(H, A, A).mul_(4.0 * c)
        return dA, dweights, dscale, None


class WeightedGrams(torch.autograd.Function):
    """``V_t = sum_s W[t, s] K_ts`` [T, m, c], ``K_ts = s^2 g(||a_tsi - b_j||^2)``, for scaled inputs A [T, S, m, d],
    B [c, d] and constant weights W [T, S], with the backward in closed form.

    dL/dK_ts is ``W[t, s] dL/dV_t``: with H_ts formed from dL/dV_t broadcast over s (as :class:`StationaryGram`'s
    H, one pass over the [T, S, m, c] matrices, none to form dL/dK), the weights scale the rows of A's results and
    of A: ``dL/dA_ts = 2 c W[t, s] (rowsum(H_ts) A_ts - H_ts B)``, ``dL/dB = 2 c sum_ts (colsum(W[t, s] H_ts) B -
    H_ts^T W[t, s] A_ts)``, and ``dL/ds^2 = <dL/dV, V> / s^2``, a pass over the [T, m, c] output instead of the
    kernel matrices. Only what the kernel's slope reads is kept for the backward (Matérn's, not the kernel matrix).
    Autograd through the weighted sum would form dL/dK in a pass over each block's orbit and read the kernel
    matrices again for <dL/dK, K>.
    """

    @staticmethod
    def forward(ctx, A: Tensor, B: Tensor, weights: Tensor, outputscale: Tensor, kernel: Stationary) -> Tensor:
        T, S, m, d = A.shape
        rows = A.reshape(T * S * m, d)
        K, state = kernel.gram(rows, B, outputscale)
        V = (weights.unsqueeze(-2) @ K.view(T, S, m * B.shape[0])).view(T, m, B.shape[0])
        ctx.kernel, ctx.shape = kernel, (T, S, m, B.shape[0], d)
        ctx.save_for_backward(rows, B, weights, outputscale, V, K if kernel.slope_reads_gram else None, *state)
        return V

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        rows, B, weights, outputscale, V, K, *state = ctx.saved_tensors
        need_A, need_B, _, need_scale, _ = ctx.needs_input_grad
        T, S, m, c, d = ctx.shape
        grad = grad.contiguous()  # H takes grad's layout, and is viewed [T S m, c] below (a transposed V's is not)
        dA = dB = dscale = None
        if need_scale:
            dscale = torch.tensordot(grad, V, dims=3) / outputscale
        if need_A or need_B:
            by_set = (lambda t: None if t is None else t.view(T, S, m, c))
            H, scale = ctx.kernel.weighted_slope(grad.unsqueeze(1), by_set(K), tuple(map(by_set, state)))
            H = H.view(T * S * m, c)
            row_weights = weights.unsqueeze(-1).expand(T, S, m).reshape(T * S * m, 1)  # W[t, s] on A_ts's rows
            if need_A:
                dA = distance_gradient(H, rows, B).mul_(row_weights * (2.0 * scale)).view(T, S, m, d)
            if need_B:
                dB = distance_gradient(H, B, rows, row_weights, transposed=True).mul_(2.0 * scale)
        return dA, dB, None, dscale, None

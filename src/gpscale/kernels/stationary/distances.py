"""Scaled squared distances formed in one matrix product, their gradient in one more, and the exponent at which a
kernel's value is held above the subnormal numbers."""
from __future__ import annotations

import math

import torch
from torch import Tensor

from ...linalg import transposed_times


def underflow_cutoff(dtype: torch.dtype) -> float:
    """The exponent ``c`` at which a kernel's ``exp`` is held: ``e^c = tiny^(1/3)`` (2.3e-13 in float32, 2.8e-103 in
    float64), so that a product of two kernel values, or of one with a number above tiny^(2/3), is a normal number.

    Numbers below ``tiny`` (subnormals) and the exponentials that produce them are many times slower than normal
    numbers on x86 processors, and a kernel matrix of far-apart points (many features at the start lengthscale) is
    mostly such numbers: every pass over it, its gradient and the products formed from it would pay that. The cube
    root of tiny, not its square root, keeps the products of two held kernel values normal as well. Held, an entry
    is off by at most ``s^2 e^c`` times the Matérn polynomial at the held distance (7e-11 times s^2 for Matérn-5/2
    in float32), far below the dtype's resolution of s^2 (eps 1.2e-7), and k(x, x) is s^2 exactly.
    The held entries are flat in the inputs, but the closed-form backward still gives each a slope of its held
    value times the scaled difference, where the exact slope is 0."""
    return math.log(torch.finfo(dtype).tiny) / 3


def sq_dist(A: Tensor, B: Tensor, scale: float = 1.0, bound: float | None = None) -> Tensor:
    """``scale ||a - b||^2`` [..., n1, n2] for rows of A [..., n1, d] and B [..., n2, d] (no batch axis, or one): one
    product of the rows augmented by two columns each,

        [a, scale |a|^2, scale] . [-2 scale b, 1, |b|^2] = scale (|a|^2 - 2 a.b + |b|^2),

    so that the product writes the n1 x n2 buffer once and a kernel's scale of the distance costs no pass of its own
    (norms joined in passes of their own would read the buffer twice more). Clamped at 0 against round-off, which
    can leave a squared
    distance below 0 (so that the kernel's value there is its value at distance 0), and at ``bound`` (where a
    kernel's value is held, :func:`underflow_cutoff`) on the other side, in the same pass. Where B is A (points
    against themselves) the diagonal is 0 exactly: the expanded form leaves about eps |a|^2 there, whose root
    (Matérn's distance) is some 1e-8 |a|, which would move Matérn-1/2's k(a, a) off s^2."""
    norms_A = (A * A).sum(-1, keepdim=True)
    norms_B = norms_A if B is A else (B * B).sum(-1, keepdim=True)
    rows = torch.cat([A, norms_A * scale, torch.full_like(norms_A, scale)], -1)
    columns = torch.cat([B * (-2.0 * scale), torch.ones_like(norms_B), norms_B], -1)
    sq = rows @ columns.transpose(-2, -1)
    if B is A:
        sq.diagonal(dim1=-2, dim2=-1).zero_()
    return sq.clamp_(0.0, bound) if scale > 0 else sq.clamp_(bound, 0.0)


def distance_gradient(H: Tensor, X: Tensor, Y: Tensor, weights: Tensor | None = None,
                      transposed: bool = False) -> Tensor:
    """``sum_j H_ij w_j (x_i - y_j)`` [..., n1, d], half the gradient of ``sum_ij H_ij w_j ||x_i - y_j||^2`` with
    respect to X [..., n1, d], for Y [..., n2, d], H [..., n1, n2] (with ``transposed``, H is given as its transpose
    [..., n2, n1]) and weights w [..., n2, 1] on Y's points (all 1 when None): ``rowsum(H w) X - H (w Y)`` from one
    product of H with ``[w Y, w]``, whose last column is the weighted row sums: a row sum of its own, or a product of
    H with the weights alone, would read the n1 x n2 matrix once more, where the product's extra column costs about
    nothing (it reads H once either way)."""
    augmented = torch.cat([Y, torch.ones_like(Y[..., :1])], -1)
    if weights is not None:
        augmented.mul_(weights)
    product = transposed_times(H, augmented) if transposed else H @ augmented
    return product[..., -1:] * X - product[..., :-1]

"""Variational Fourier features (VFF; Hensman, Durrande & Solin 2018, "Variational Fourier features
for Gaussian processes", JMLR) of Matérn kernels on an interval [a, b].

The features are RKHS projections ``zeta_j = <f, phi_j>_H`` of f onto the harmonic Fourier basis on [a, b],

    phi(x) = [1, cos(omega_1 (x - a)), ..., cos(omega_F (x - a)), sin(omega_1 (x - a)), ..., sin(omega_F (x - a))],
    omega_m = 2 pi m / (b - a),

2F + 1 of them (the cos block, m = 0..F, first). For Matérn-1/2, 3/2 and 5/2 restricted to [a, b] their
covariances are known in closed form:

- ``Kuf = Cov(zeta, f(x)) = phi(x)`` for x in [a, b], whatever the hyperparameters (the reproducing property);
  outside [a, b] only the boundary form survives and the entries decay like ``exp(-lambda delta)`` (:func:`vff_Kuf`);
- ``Kuu = <phi_i, phi_j>_H = blockdiag(K_cos, K_sin)``, each block a diagonal plus a rank-0, 1 or 2 term, kept
  as one :class:`~gpscale.operators.DiagPlusLowRank` with a block-diagonal W, whose solves and log-determinant
  cost O(M r^2) by Woodbury and the determinant lemma; nothing M x M is ever inverted.

In D dimensions an additive kernel ``sum_d k_d(x_d, x'_d)`` has D independent feature sets (K_uu block diagonal
over dimensions, again one diagonal plus low rank with W block diagonal), a product kernel ``prod_d k_d`` the
tensor-product features (K_uu the Kronecker product of the 1-D matrices, :class:`~gpscale.operators.Kronecker`;
(2F + 1)^D features, for D <= 3).

Interval: the induced kernel ``phi^T Kuu^{-1} phi`` converges to k inside (a, b) as F grows, but not at the ends,
where every feature has phi(a) = phi(b) and the residual stays about s^2 / 2. So the box must
contain the data with a margin of a few lengthscales (:func:`box_with_margin`), and F must be large enough that
omega_F exceeds a few lambda: for Matérn-3/2, F of about (b - a) / l gives 1% kernel error.

Everything is float64 (the callers cast): the diagonal grows like omega^(2 nu + 1), so cond(Kuu) grows like
F^(2 nu + 1).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.nn.functional import pad

from ..device import none_set
from ..operators import DiagPlusLowRank

__all__ = ["NUS", "matern_lambda", "frequencies", "fourier_basis", "vff_Kuf", "vff_Kuu", "row_kronecker",
           "box_with_margin"]

NUS = (0.5, 1.5, 2.5)


def matern_lambda(nu: float, lengthscale: Tensor) -> Tensor:
    """``lambda = sqrt(2 nu) / l``: the decay rate in ``k = s^2 p(lambda r) exp(-lambda r)``."""
    _check_nu(nu)
    return math.sqrt(2.0 * nu) / lengthscale


def frequencies(a: float | Tensor, b: float | Tensor, n_frequencies: int, dtype=torch.float64,
                device=None) -> Tensor:
    """``omega_m = 2 pi m / (b - a)`` for m = 0..F [..., F + 1]: harmonic, m whole periods on [a, b]
    (not 2 pi (b - a) / m); one row per interval where a and b are tensors [...]."""
    m = torch.arange(n_frequencies + 1, dtype=dtype, device=device)
    return 2 * math.pi * m / _as_column(b - a, dtype, device)


def _as_column(value: float | Tensor, dtype, device) -> Tensor | float:
    """A per-interval value as [..., 1], to broadcast against the frequencies [..., F + 1]; a number as is."""
    if not torch.is_tensor(value):
        return value
    return value.to(dtype=dtype, device=device).unsqueeze(-1)


def fourier_basis(x: Tensor, a: float | Tensor, b: float | Tensor, n_frequencies: int) -> Tensor:
    """``phi(x)`` [..., 2F + 1, n] for 1-D inputs x [..., n] on the intervals [a, b] (numbers, or tensors [...], one
    interval per leading index): cos(omega_m (x - a)) for m = 0..F, then sin for m = 1..F."""
    omega = frequencies(a, b, n_frequencies, x.dtype, x.device).unsqueeze(-1)  # [..., F + 1, 1]
    angle = omega * (x - _as_column(a, x.dtype, x.device)).unsqueeze(-2)  # [..., F + 1, n]
    return torch.cat([torch.cos(angle), torch.sin(angle[..., 1:, :])], dim=-2)


def vff_Kuf(nu: float, x: Tensor, a: float | Tensor, b: float | Tensor, n_frequencies: int,
            lengthscale: Tensor) -> Tensor:
    """``Cov(zeta, f(x))`` [..., 2F + 1, n] for a 1-D Matérn-nu with lengthscale l, at x [..., n]: one feature set per
    leading index, each with its own interval (a, b tensors [...]) and lengthscale [...] (an additive kernel's
    dimensions in one call); numbers and a 0-d lengthscale for one interval.

    Inside [a, b] it is ``phi(x)``. Outside, with e the nearer end, delta = |x - e| and s = x - e, the features
    see f(x) only through the boundary terms of the inner product, and the entries are (per frequency omega):

        nu = 1/2:  cos: exp(-lambda delta);                                       sin: 0
        nu = 3/2:  cos: (1 + lambda delta) exp(-lambda delta);                    sin: s omega exp(-lambda delta)
        nu = 5/2:  cos: (1 + lambda delta + (lambda^2 - omega^2) delta^2 / 2) exp(-lambda delta);
                   sin: s omega (1 + lambda delta) exp(-lambda delta)

    (the reference code has 1/2 and 3/2 only; 5/2 is derived the same way, from the boundary terms of the inner
    product, and checked against inner products integrated by quadrature in the tests).
    These are continuous at a and b but reproduce k poorly: keep the data inside with a margin.
    """
    lo, hi = _as_column(a, x.dtype, x.device), _as_column(b, x.dtype, x.device)
    inside = fourier_basis(torch.clamp(x, lo, hi), a, b, n_frequencies)
    outside = (x < lo) | (x > hi)
    if none_set(outside):  # on a GPU the edge forms are computed for every row instead, used where x is outside
        return inside
    lam = _as_column(matern_lambda(nu, lengthscale).to(x.dtype), x.dtype, x.device)  # [..., 1]
    omega = frequencies(a, b, n_frequencies, x.dtype, x.device).unsqueeze(-1)  # [..., F + 1, 1]
    s = torch.where(x < lo, x - lo, torch.where(x > hi, x - hi, torch.zeros_like(x)))  # [..., n]
    delta = s.abs()
    decay = torch.exp(-lam * delta)
    lam, s, delta, decay = (t.unsqueeze(-2) for t in (lam, s, delta, decay))  # against the frequencies' axis
    cos_rows = (*x.shape[:-1], n_frequencies + 1, x.shape[-1])
    if nu == 0.5:
        cos = decay.expand(cos_rows)
        sin = torch.zeros((*x.shape[:-1], n_frequencies, x.shape[-1]), dtype=x.dtype, device=x.device)
    elif nu == 1.5:
        cos = ((1 + lam * delta) * decay).expand(cos_rows)
        sin = s * omega[..., 1:, :] * decay
    else:
        cos = (1 + lam * delta + (lam**2 - omega**2) * delta**2 / 2) * decay
        sin = s * omega[..., 1:, :] * (1 + lam * delta) * decay
    return torch.where(outside.unsqueeze(-2), torch.cat([cos, sin], dim=-2), inside)


def vff_Kuu(nu: float, a: float | Tensor, b: float | Tensor, n_frequencies: int, lengthscale: Tensor,
            variance: Tensor) -> DiagPlusLowRank:
    """``Kuu = <phi_i, phi_j>_H`` [2F + 1, 2F + 1] for a 1-D Matérn-nu (variance s^2, lengthscale l) on [a, b]:
    ``blockdiag(K_cos, K_sin)`` (the cos-sin block is exactly zero), each ``diag + W W^T``, returned as one
    ``diag + W W^T`` with W = blockdiag(W_cos, W_sin):

        nu = 1/2: d = Delta (lambda^2 + omega^2) / (c lambda s^2),         c = 2 (m = 0), 4;  W_cos = 1 / s
        nu = 3/2: d = Delta (lambda^2 + omega^2)^2 / (c lambda^3 s^2),     c = 4, 8;          W_cos = 1 / s,
                  W_sin = omega / (lambda s)
        nu = 5/2: d = 3 Delta (lambda^2 + omega^2)^3 / (c lambda^5 s^2),   c = 16, 32;
                  W_cos = [(3 omega^2 / lambda^2 - 1) / (s sqrt 8), 1 / s],  W_sin = sqrt(3) omega / (lambda s)

    The diagonal is the integral term of the RKHS inner product; the low-rank terms are its boundary terms at a,
    evaluated at (g, g', g'') = (1, 0, -omega^2) for cos and (0, omega, 0) for sin. Differentiable in l and s^2.

    With D intervals (a, b, l and s^2 tensors [D]: an additive kernel's dimensions) it is their block-diagonal
    matrix [D (2F + 1), D (2F + 1)] in one ``diag + W W^T`` (W block diagonal [D (2F + 1), D r]), formed in one
    pass of vectorised operators instead of one pass per dimension.
    """
    lam = matern_lambda(nu, lengthscale).reshape(-1, 1)  # [D, 1]
    dtype, device = lam.dtype, lam.device
    variance = variance.reshape(-1, 1)
    delta = _as_column(b - a, dtype, device)  # [D, 1], or a number
    omega = frequencies(a, b, n_frequencies, dtype, device).reshape(-1, n_frequencies + 1)  # [D, F + 1]
    # 1 for the constant, which has twice the squared norm of a cos of the same frequency, else 2 (made by an
    # operator: assigning c[0] a number copies it from the host, a wait on a GPU)
    c = 2.0 - (torch.arange(n_frequencies + 1, device=device) == 0).to(dtype)
    s = torch.sqrt(variance)
    ones = torch.ones_like(omega)
    power = nu + 0.5  # 1, 2, 3
    spectrum = (lam**2 + omega**2) ** power  # ||L phi||^2 per unit length, up to the factor below
    if nu == 0.5:
        d = delta * spectrum / (2 * c * lam * variance)
        W_cos = (ones / s).unsqueeze(-1)
        W_sin = omega[:, 1:, None][..., :0]
    elif nu == 1.5:
        d = delta * spectrum / (4 * c * lam**3 * variance)
        W_cos = (ones / s).unsqueeze(-1)
        W_sin = (omega[:, 1:] / (lam * s)).unsqueeze(-1)
    else:
        d = 3 * delta * spectrum / (16 * c * lam**5 * variance)
        W_cos = torch.stack([(3 * omega**2 / lam**2 - 1) / (s * math.sqrt(8)), ones / s], dim=-1)
        W_sin = (math.sqrt(3) * omega[:, 1:] / (lam * s)).unsqueeze(-1)
    # per interval blockdiag(W_cos, W_sin) [D, 2F + 1, r], then blockdiag over the intervals
    r_cos, r_sin = W_cos.shape[-1], W_sin.shape[-1]
    W = torch.cat([pad(W_cos, (0, r_sin)), pad(W_sin, (r_cos, 0))], dim=-2)
    D = W.shape[0]
    W = (W.unsqueeze(2) * torch.eye(D, dtype=dtype, device=device)[:, None, :, None]).reshape(D * W.shape[1], -1)
    return DiagPlusLowRank(torch.cat([d, d[:, 1:]], dim=-1).reshape(-1), W)


def row_kronecker(factors: list[Tensor]) -> Tensor:
    """Column-wise Kronecker of feature matrices [n_i, n] -> [prod n_i, n] (C order), the product-kernel
    features ``phi(x) = ⊗_d phi_d(x_d)`` for every column x."""
    out = factors[0]
    for factor in factors[1:]:
        out = (out.unsqueeze(1) * factor.unsqueeze(0)).reshape(-1, out.shape[-1])
    return out


def box_with_margin(X: Tensor, margin: float) -> tuple[Tensor, Tensor]:
    """Per-column interval ``[min - margin r, max + margin r]`` of X [n, D], r the column's range (1 for a constant
    column): lower [D], upper [D] (float64)."""
    lo, hi = X.min(0).values.to(torch.float64), X.max(0).values.to(torch.float64)
    span = torch.where(hi > lo, hi - lo, torch.ones_like(hi))
    return lo - margin * span, hi + margin * span


def _check_nu(nu: float) -> None:
    if nu not in NUS:
        raise ValueError(f"Variational Fourier features exist for Matérn nu in {NUS} (the RKHS must contain the "
                         f"Fourier basis; it does not for the RBF). Got nu={nu}.")

"""Sums of a 1-D Matérn profile against a vector in O((n_t + n_s) log n_s) instead of O(n_t n_s): what the additive
Matérn's ``K(X1, X2) v`` needs (:meth:`~gpscale.kernels.separable.AdditiveMatern.matvec`).

On inputs scaled by ``sqrt(2 nu) / l`` the 1-D Matérn-nu correlation is ``g(u) = P(|u|) e^{-|u|}``, and its slope is
``dg/du = c h(u)`` with the odd ``h(u) = sign(u) Q(|u|) e^{-|u|}``:

    nu = 1/2:  P(z) = 1,                 Q(z) = 1,          c = -1
    nu = 3/2:  P(z) = 1 + z,             Q(z) = z,          c = -1
    nu = 5/2:  P(z) = 1 + z + z^2 / 3,   Q(z) = z + z^2,    c = -1/3

For a target t and sources s_j with weights v_j the sum ``sum_j g(t - s_j) v_j`` splits at t: a source left of t
adds ``P(t - s) e^{s - t} v``, one right of it ``P(s - t) e^{t - s} v``, one equal to it ``g(0) v = v``. Expanding
``(t - s)^k`` binomially makes each side ``e^{-t}`` (or ``e^{t}``) times a polynomial in t whose coefficients are
the moments

    left_m(t) = sum_{s_j < t} s_j^m e^{s_j} v_j,        right_m(t) = sum_{s_j > t} s_j^m e^{-s_j} v_j,     m <= p,

a prefix and a suffix sum over the sources sorted once, read at each target's place among them (a binary search).
The h-sums take the same moments.

Numerics, in float64 throughout: the coordinates are taken from the centre r of the sources' range and the weights
scaled to at most 1, so ``s^m e^{+-s} v`` stays finite while every source lies within :data:`HALF_SPAN` of r
(:func:`too_wide` says where not), and only a weight below 1e-90 of the largest can underflow there; the prefix
sums add terms that grow along them, so they err by about as much as the dense sum over the same terms; the
binomial expansion adds a relative error of about ``|t - r|^p`` times the unit round-off.
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["DENSE_BELOW", "HALF_SPAN", "SLOPE", "matern_sums", "too_wide"]

# P's and Q's coefficients by power of z, and c, per nu
_P = {0.5: (1.0,), 1.5: (1.0, 1.0), 2.5: (1.0, 1.0, 1.0 / 3.0)}
_Q = {0.5: (1.0,), 1.5: (0.0, 1.0), 2.5: (0.0, 1.0, 1.0)}
SLOPE = {0.5: -1.0, 1.5: -1.0, 2.5: -1.0 / 3.0}

# Below this many kernel values (D n1 n2) the dense product is the shorter: the sums' forward and backward have a
# fixed cost whatever the size (sorting, binary searches, some 40 small operators), which the dense product's
# passes over D n1 n2 values outgrow near this size on a CPU (the timings are on the Performance page).
DENSE_BELOW = 1_000_000

# Sources within HALF_SPAN of the centre keep e^{+-s} below e^{500} = 1.4e217: with the weights scaled to at most 1
# and s^m at most 500^2, a prefix sum over a million sources stays below 1e229.
HALF_SPAN = 500.0
# A target farther than this from the centre lies more than 100 from every source: its sums, below 1e-40 of the
# weights' (P(100) e^{-100}), are taken at this distance instead, where e^{+-t} and t^p stay finite.
_FAR = HALF_SPAN + 100.0


def too_wide(*points: Tensor) -> Tensor:
    """Whether any of the non-empty sets of scaled points [n, D] spans more than ``2 HALF_SPAN`` in a dimension (a
    lengthscale below ``range sqrt(2 nu) / 1,000``), where it cannot be the sources of :func:`matern_sums`: a 0-dim
    boolean tensor, not read (a training step checks it with :func:`~gpscale.device.check_failed`)."""
    return torch.stack([((x.amax(0) - x.amin(0)) > 2 * HALF_SPAN).any() for x in (p.detach() for p in points)]).any()


def _prefix_sums(s: Tensor, v: Tensor, p: int) -> Tensor:
    """[2, p + 1, D, n_s + 1]: at k, the sums of ``s^m e^{s} v`` over the first k sources and of ``s^m e^{-s} v``
    over the others, for sorted sources s [D, n_s] with weights v [D, n_s]."""
    powers = [v]
    for _ in range(p):
        powers.append(powers[-1] * s)
    x, e = torch.stack(powers), s.exp()  # s^m v [p + 1, D, n_s]
    zero = x.new_zeros(x.shape[:-1] + (1,))
    return torch.stack([torch.cat([zero, (x * e).cumsum(-1)], -1),
                        torch.cat([(x / e).flip(-1).cumsum(-1).flip(-1), zero], -1)])


def _read(sums: Tensor, s: Tensor, t: Tensor, with_equal: bool) -> Tensor:
    """``left_m(t) e^{-t}`` (and ``right_m(t) e^{t}`` where ``sums`` has both sides) [sides, p + 1, D, n_t]: the
    prefix sums read at each target's count of sources below it (with those equal to it, ``with_equal``)."""
    count = torch.searchsorted(s, t, right=with_equal)
    e_t = t.neg().exp()
    factors = torch.stack([e_t, e_t.reciprocal()])[:sums.shape[0]].unsqueeze(1)
    return sums.gather(-1, count.expand(sums.shape[:2] + tuple(t.shape))) * factors


def matern_sums(targets: Tensor, sources: Tensor, v: Tensor, nu: float) -> tuple[Tensor, Tensor]:
    """``sum_j g(t_di - s_dj) v_j`` and ``sum_j h(t_di - s_dj) v_j`` [D, n_t] (float64), for scaled targets
    [D, n_t], scaled sources [D, n_s] (n_s > 0) not :func:`too_wide` and weights v [n_s], per dimension d (module
    docstring)."""
    targets, sources, v = (x.to(torch.float64) for x in (targets, sources, v))
    scale = v.abs().amax()
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # weights at most 1: no overflow, no underflow
    low, high = sources.aminmax(dim=-1, keepdim=True)
    centre = (low + high) / 2
    s, order = (sources - centre).sort(-1)
    s, t = s.contiguous(), (targets - centre).contiguous()  # the binary search wants both contiguous
    t = t.clamp(-_FAR, _FAR)
    v = (v / scale).expand_as(s).gather(-1, order)
    P, Q = _P[nu], _Q[nu]
    p = len(P) - 1
    sums = _prefix_sums(s, v, p)
    left, right = _read(sums, s, t, with_equal=True)
    a, b = left + right, left - right
    # sum_j (t - s_j)^k e^{-|t - s_j|} v_j over the sources on both sides (plus), and the left side's less the
    # right side's (minus), from the moments: (t - s)^k expanded on the left, (s - t)^k on the right
    plus, minus = [a[0]], [b[0]]
    if p >= 1:
        plus.append(t * b[0] - b[1])
        minus.append(t * a[0] - a[1])
    if p >= 2:
        plus.append(t * (t * a[0] - 2.0 * a[1]) + a[2])
        minus.append(t * (t * b[0] - 2.0 * b[1]) + b[2])
    g = sum(c * term for c, term in zip(P, plus) if c)
    if nu == 0.5:  # h(0) = 0, where h(0+) = 1: h's left sum leaves out the sources equal to t, which g's takes
        h = _read(sums[:1], s, t, with_equal=False)[0, 0] - right[0]
    else:  # Q(0) = 0: a source equal to t adds nothing to h on either side
        h = sum(c * term for c, term in zip(Q, minus) if c)
    return g * scale, h * scale

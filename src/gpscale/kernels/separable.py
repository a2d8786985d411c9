"""Separable Matérn kernels: a sum or a product over input dimensions of 1-D Matérns, the kernels whose RKHS
variational Fourier features factorise over dimensions (one feature set per dimension for a sum, tensor-product
features for a product).

    additive:  k(x, x') = sum_d s_d^2 g(|x_d - x'_d| / l_d)      (its own s_d^2 and l_d per dimension)
    product:   k(x, x') = s^2 prod_d g(|x_d - x'_d| / l_d)

with g the 1-D Matérn-nu profile. Neither equals the ARD Matérn of :mod:`.stationary`, which is a function of
the joint distance ``||(x - x') / l||``.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable
from torch.nn.functional import softplus

from ..device import check_failed
from ..linalg import CORE
from . import matern_sums as sums
from .stationary import SOFTPLUS_ZERO, Kernel, inverse_softplus, underflow_cutoff

__all__ = ["AdditiveMatern", "ProductMatern"]


def _differences(A: Tensor, B: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """u = a_d - b_d [D, n1, n2] for A [n1, D] and B [n2, D], z = |u| and e = exp(-z), laid out [D, n1, n2]: from
    A^T and B^T as they are (strided views) torch lays the difference out [n1, n2, D], and every pass after it
    reduces or reshapes across D's stride, a slow pattern of memory access. u is held within [-c, c], c minus the
    :func:`~gpscale.kernels.stationary.underflow_cutoff` (29 scaled lengthscales in float32): beyond, exp(-z) and
    the products of its result are slow on x86 processors; a factor held there is flat (its value at |u| = c, at
    most 2.3e-13 times the Matérn polynomial at 29 in float32), with a slope of at most c e^-c per entry."""
    c = -underflow_cutoff(A.dtype)
    u = (A.T.contiguous().unsqueeze(-1) - B.T.contiguous().unsqueeze(-2)).clamp_(-c, c)
    z = u.abs()
    return u, z, torch.neg(z).exp_()


def _profile(z: Tensor, e: Tensor, nu: float) -> Tensor:
    """The 1-D Matérn-nu correlation g at z = |u| (e = exp(-z)); for nu = 1/2 it is e itself, not a copy."""
    if nu == 0.5:
        return e
    if nu == 1.5:
        return torch.addcmul(e, z, e)
    return z.div(3.0).add_(1.0).mul_(z).add_(1.0).mul_(e)


def _slope(u: Tensor, e: Tensor, nu: float) -> tuple[Tensor, float]:
    """dg/du = c h as h (a new tensor) and the number c, from u and e = exp(-|u|): the backward passes reduce h
    before c scales their [D, n] sums, one pass over [D, n1, n2] fewer than scaling h itself."""
    if nu == 0.5:
        return torch.sign(u).mul_(e), -1.0
    if nu == 1.5:
        return torch.mul(u, e), -1.0
    return u.abs().add_(1.0).mul_(u).mul_(e), -1.0 / 3.0


class _MaternFactors(torch.autograd.Function):
    """The 1-D Matérn-nu correlations ``g(|u|)`` [D, n1, n2] with ``u = a_d - b_d`` for inputs already scaled by
    ``sqrt(2 nu) / l_d``, A [n1, D] and B [n2, D], with the backward in closed form:

        nu = 1/2:  g = e,                      dg/du = -sign(u) e
        nu = 3/2:  g = (1 + z) e,              dg/du = -u e
        nu = 5/2:  g = (1 + z + z^2 / 3) e,    dg/du = -u (1 + z) e / 3        (z = |u|, e = exp(-z))

    so ``dL/da = sum_j dL/dg * dg/du`` and ``dL/db = -sum_i dL/dg * dg/du``. Autograd through the expression keeps
    every [D, n1, n2] intermediate (difference, |.|, scaled distance, exponential, polynomial) and takes a pass
    over each on the way back. At u = 0 the slope is 0 (sign(0) = 0), the derivative of every profile there.
    """

    @staticmethod
    def forward(ctx, A: Tensor, B: Tensor, nu: float) -> Tensor:
        u, z, e = _differences(A, B)
        g = _profile(z, e, nu)
        ctx.nu = nu
        ctx.save_for_backward(u, e)
        return g.clone() if g is e else g

    @staticmethod
    @once_differentiable  # the saved u and e are not differentiable functions of A and B
    def backward(ctx, grad: Tensor):
        u, e = ctx.saved_tensors
        h, c = _slope(u, e, ctx.nu)
        H = h.mul_(grad)
        need_A, need_B, _ = ctx.needs_input_grad
        return (H.sum(-1).mul_(c).T if need_A else None), (H.sum(-2).mul_(-c).T if need_B else None), None


class _AdditiveMaternGram(torch.autograd.Function):
    """``K = sum_d w_d g(|a_d - b_d|)`` [n1, n2] for inputs scaled as :class:`_MaternFactors`' and weights w [D],
    with G = dL/dK and per dimension

        dL/dw_d = sum_ij G_ij g_dij,     dL/da_di = w_d sum_j G_ij g'_dij,     dL/db_dj = -w_d sum_i G_ij g'_dij

    The factors' function followed by a weighted sum would pass the weights' outer product with G [D, n1, n2] to
    its backward (a product of inner dimension 1 through the [D, n1, n2] tensor, then a multiply); here w_d
    multiplies the row and column sums instead, [D, n1] and [D, n2].
    """

    @staticmethod
    def forward(ctx, A: Tensor, B: Tensor, w: Tensor, nu: float) -> Tensor:
        u, z, e = _differences(A, B)
        g = _profile(z, e, nu)
        ctx.nu = nu
        ctx.save_for_backward(u, e, g, w)
        return (w @ g.view(w.shape[0], -1)).view(g.shape[1:])

    @staticmethod
    @once_differentiable
    def backward(ctx, G: Tensor):
        u, e, g, w = ctx.saved_tensors
        need_A, need_B, need_w, _ = ctx.needs_input_grad
        dw = g.view(w.shape[0], -1) @ G.reshape(-1) if need_w else None
        if not (need_A or need_B):
            return None, None, dw, None
        h, c = _slope(u, e, ctx.nu)
        H = h.mul_(G)
        cw = w.unsqueeze(-1) * c  # the slope's number folded into the weights [D, 1]
        return (H.sum(-1).mul_(cw).T if need_A else None), (H.sum(-2).mul_(cw).neg_().T if need_B else None), dw, None


class _AdditiveMaternMatvec(torch.autograd.Function):
    """``K v = sum_d w_d M_d`` [n1] with ``M_d = sum_j g(a_d - b_dj) v_j`` for inputs scaled as
    :class:`_MaternFactors`', weights w [D] and v [n2], through :func:`~gpscale.kernels.matern_sums.matern_sums`
    (O((n1 + n2) log n2), no [D, n1, n2] tensor); float64. With G = dL/d(K v), c the slope's number and
    ``H_d = sum_j h(a_d - b_dj) v_j`` (h odd, dg/du = c h):

        dL/dw_d = M_d . G,   dL/dv_j = sum_d w_d sum_i g(b_dj - a_di) G_i,
        dL/da_di = c w_d G_i H_di,   dL/db_dj = c w_d v_j sum_i h(b_dj - a_di) G_i

    so the backward is one more call with the roles of a and b swapped and G as the weights.
    """

    @staticmethod
    def forward(ctx, A: Tensor, B: Tensor, w: Tensor, v: Tensor, nu: float) -> Tensor:
        M, H = sums.matern_sums(A.T, B.T, v, nu)
        ctx.nu = nu
        ctx.save_for_backward(A, B, w, v, M, H)
        return w @ M

    @staticmethod
    @once_differentiable
    def backward(ctx, G: Tensor):
        A, B, w, v, M, H = ctx.saved_tensors
        cw = (sums.SLOPE[ctx.nu] * w).unsqueeze(-1)  # [D, 1]
        need_A, need_B, need_w, need_v, _ = ctx.needs_input_grad
        N, H_b = sums.matern_sums(B.T, A.T, G, ctx.nu) if (need_B or need_v) else (None, None)
        return ((cw * H * G).T if need_A else None, (cw * H_b * v).T if need_B else None,
                M @ G if need_w else None, w @ N if need_v else None, None)


class _SeparableMatern(Kernel):
    """Per-dimension lengthscales l [D] and Matérn smoothness nu; the variance(s) are the subclass's."""

    def __init__(self, n_features: int, nu: float = 1.5, lengthscale: float = SOFTPLUS_ZERO):
        super().__init__()
        if nu not in (0.5, 1.5, 2.5):
            raise ValueError(f"Matern nu must be 0.5, 1.5 or 2.5, got {nu}.")
        self.n_features = int(n_features)
        self.nu = float(nu)
        self.raw_lengthscale = nn.Parameter(inverse_softplus(torch.full((self.n_features,), float(lengthscale))))

    @property
    def lengthscale(self) -> Tensor:
        """[D]"""
        return softplus(self.raw_lengthscale)

    def config(self) -> dict:
        return {"n_features": self.n_features, "nu": self.nu}

    def scaled(self, X: Tensor) -> Tensor:
        """X [n, D] in units of the Matérn's scaled distance, ``x_d sqrt(2 nu) / l_d``."""
        return X * (math.sqrt(2.0 * self.nu) / self.lengthscale.to(X.dtype))

    def factors(self, X1: Tensor, X2: Tensor) -> Tensor:
        """The 1-D correlations g(|x_d - x'_d| / l_d) [D, n1, n2]."""
        return _MaternFactors.apply(self.scaled(X1), self.scaled(X2), self.nu)


class AdditiveMatern(_SeparableMatern):
    """``sum_d s_d^2 g_nu(|x_d - x'_d| / l_d)``: D one-dimensional Matérns with their own variances.

    Args:
        n_features: D.
        nu: 0.5, 1.5 or 2.5.
        lengthscale: initial l_d.
        outputscale: initial total variance ``sum_d s_d^2`` (split evenly: s_d^2 = outputscale / D).
    """

    def __init__(self, n_features: int, nu: float = 1.5, lengthscale: float = SOFTPLUS_ZERO,
                 outputscale: float = 1.0):
        super().__init__(n_features, nu, lengthscale)
        self.raw_variance = nn.Parameter(inverse_softplus(torch.full((self.n_features,),
                                                                     float(outputscale) / self.n_features)))

    @property
    def variance(self) -> Tensor:
        """s_d^2 [D]"""
        return softplus(self.raw_variance)

    def forward(self, X1: Tensor, X2: Tensor) -> Tensor:
        return _AdditiveMaternGram.apply(self.scaled(X1), self.scaled(X2), self.variance.to(X1.dtype), self.nu)

    def diag(self, X: Tensor) -> Tensor:
        return self.variance.to(X.dtype).sum().expand(X.shape[0]).clone()

    def matvec(self, X1: Tensor, X2: Tensor, v: Tensor) -> Tensor:
        """``K(X1, X2) v`` [n1] in v's dtype, in O((n1 + n2) log n2) per dimension
        (:mod:`~gpscale.kernels.matern_sums`), float64 within; the dense product where a dimension's scaled
        inputs span more than that allows (a lengthscale below about a thousandth of the inputs' range: X2's, and
        X1's where a gradient in X2 or v is wanted), or where the matrix is small enough that forming it is shorter
        (fewer than :data:`~gpscale.kernels.matern_sums.DENSE_BELOW` values)."""
        if self.n_features * X1.shape[0] * X2.shape[0] < sums.DENSE_BELOW:  # empty sets too
            return super().matvec(X1, X2, v)
        A, B, v64 = self.scaled(X1.to(CORE)), self.scaled(X2.to(CORE)), v.to(CORE)
        # X1's points are the sources of the backward's sums for the gradients in X2 and v
        backward_sources = (A,) if torch.is_grad_enabled() and (B.requires_grad or v64.requires_grad) else ()
        if check_failed(sums.too_wide(B, *backward_sources)):  # in a training step: recorded; fit redoes the epoch
            return super().matvec(X1, X2, v)
        return _AdditiveMaternMatvec.apply(A, B, self.variance.to(CORE), v64, self.nu).to(v.dtype)


class ProductMatern(_SeparableMatern):
    """``s^2 prod_d g_nu(|x_d - x'_d| / l_d)``.

    Args:
        n_features: D.
        nu: 0.5, 1.5 or 2.5.
        lengthscale: initial l_d.
        outputscale: initial s^2.
    """

    def __init__(self, n_features: int, nu: float = 1.5, lengthscale: float = SOFTPLUS_ZERO,
                 outputscale: float = 1.0):
        super().__init__(n_features, nu, lengthscale)
        self.raw_outputscale = nn.Parameter(inverse_softplus(torch.tensor(float(outputscale))))

    @property
    def outputscale(self) -> Tensor:
        return softplus(self.raw_outputscale)

    def forward(self, X1: Tensor, X2: Tensor) -> Tensor:
        """Each factor is at least ``tiny^(1/3)`` (its difference held, :func:`_differences`), so a product of
        two, ``tiny^(2/3)``, is a normal number even times an outputscale; with more, the product is held at
        ``tiny^(1/3)`` after each multiplication, so that none of its steps returns a subnormal number (slow on x86
        processors, see :func:`~gpscale.kernels.stationary.underflow_cutoff`; a held entry is flat): three held
        factors multiply to about ``tiny``, and times an outputscale below 1 to a subnormal number."""
        factors = self.factors(X1, X2)
        if len(factors) <= 2:
            return self.outputscale.to(X1.dtype) * factors.prod(0)
        K, held = factors[0], math.exp(underflow_cutoff(X1.dtype))
        for factor in factors[1:]:
            K = (K * factor).clamp_min_(held)
        return self.outputscale.to(X1.dtype) * K

    def diag(self, X: Tensor) -> Tensor:
        return self.outputscale.to(X.dtype).expand(X.shape[0]).clone()

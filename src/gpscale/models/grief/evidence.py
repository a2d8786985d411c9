"""GP-GRIEF-I's evidence: ``log N(y | 0, Phi W Phi^T + sigma^2 I)`` (Evans & Nair 2018, eqs. 16-18) as pure functions of
the weights w and the noise sigma^2 on statistics of fixed features, and the predictive at given (w, sigma^2).

With theta fixed, one streamed pass gives ``A = Phi^T Phi`` [p, p], ``r = Phi^T y`` and y^T y
(:meth:`~gpscale.models.linear.engine.FeatureSpaceGP.statistics`); every evaluation then costs nothing in n:

- :func:`reweighted_log_likelihood`: eq. 18 on the features themselves, O(p^3);
- :func:`row_space_log_likelihood`: the same in the q-dimensional row space of Phi, O(q^2 p), for q = rank(Phi)
  well below p (n < p);
- :func:`orthogonal_log_likelihood`: on the orthogonalised basis of :func:`orthogonalise`, O(p): a different prior,
  since the basis depends on the data.

Each is a float64 scalar (or one per MCMC chain), differentiable in w and sigma^2 through closed-form gradients.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property

import torch
from torch import Tensor

from ...linalg import CORE, cholesky_ex, logdet_from_cholesky, lower_inverse, solve_lower
from ..linear.weight_space import Statistics, weight_posterior_cholesky, weight_space_predictive

__all__ = ["weighted", "reweighted_log_likelihood", "reweighted_predict", "OrthogonalBasis", "orthogonalise",
           "orthogonal_log_likelihood", "orthogonal_predict", "row_space_factor", "row_space_log_likelihood"]

LOG_2PI = math.log(2 * math.pi)


def weighted(stats: Statistics, w: Tensor) -> Statistics:
    """The statistics of the features ``Phi W^{1/2}``, whose kernel is ``Phi W Phi^T`` (eq. 17)."""
    root = w.to(CORE).sqrt()
    return replace(stats, A=root.unsqueeze(-1) * stats.A * root, b=root * stats.b)


def reweighted_log_likelihood(w: Tensor, noise: Tensor, stats: Statistics) -> Tensor:
    """``log N(y | 0, Phi W Phi^T + sigma^2 I)`` (eq. 18) from ``A = Phi^T Phi``, ``r = Phi^T y``, y^T y and n in
    ``stats`` (:meth:`~gpscale.models.linear.engine.FeatureSpaceGP.statistics`), for weights w [..., p] > 0 and noise
    sigma^2 [...]: O(p^3), whatever n.

    It is the engine's evidence of the features ``Phi W^{1/2}``: with ``B = I + W^{1/2} A W^{1/2} / sigma^2 = L L^T``,

        -1/2 [n log(2 pi sigma^2) + log|B| + y^T y / sigma^2 - ||L^{-1} W^{1/2} r||^2 / sigma^4],

    and ``|B| = |P| |W| / sigma^{2p}`` with ``P = sigma^2 W^{-1} + A`` turns it into eq. 18b. Valid for p > n. The
    data fit is ``y^T y / sigma^2 - c^T c``: with only the statistics there is no cancellation-free form.
    Differentiable in w and sigma^2 through the closed forms (:class:`_ReweightedEvidence`); batched over leading
    dimensions (MCMC chains); NaN where B is not numerically positive definite (w overflowed), which a sampler
    rejects.
    """
    return _ReweightedEvidence.apply(w.to(CORE), noise.to(CORE), stats.A, stats.b, stats.yy, stats.n)


class _ReweightedEvidence(torch.autograd.Function):
    """Eq. 18 with the gradient in closed form: with ``c = L^{-1} W^{1/2} r / sigma^2``, the data fit
    ``quad = y^T y / sigma^2 - ||c||^2``, ``a = L^{-T} c = B^{-1} W^{1/2} r / sigma^2`` and the diagonal ``d`` of
    ``B^{-1}``,

        dLML/dw_i = (a_i^2 - 1 + d_i) / (2 w_i),
        dLML/dsigma^2 = (quad - ||a||^2 - (n - p) - sum_i d_i) / (2 sigma^2),

    from ``dLML/dK = 1/2 (K^{-1} y y^T K^{-1} - K^{-1})`` and Woodbury (``Phi^T K^{-1} y = W^{-1/2} a``,
    ``diag(Phi^T K^{-1} Phi) = (1 - d) / w``, ``tr K^{-1} = (n - p + sum d) / sigma^2``). B^{-1}'s diagonal needs
    one triangular inverse (p^3 / 3 flops, in matrix products), so a step costs about 2/3 p^3 where autograd
    through the Cholesky factorisation costs several p^3 in triangular solves, which run slower than matrix
    products: hence the hand-written backward pass.
    """

    @staticmethod
    def forward(ctx, w: Tensor, s2: Tensor, A: Tensor, b: Tensor, yy: Tensor, n: int) -> Tensor:
        root = w.sqrt()
        eye = torch.eye(A.shape[-1], dtype=CORE, device=A.device)
        L = _cholesky_or_nan(eye + root.unsqueeze(-1) * A * root.unsqueeze(-2) / s2[..., None, None])
        c = solve_lower(L, (root * b).unsqueeze(-1)).squeeze(-1) / s2.unsqueeze(-1)
        quad = yy / s2 - (c**2).sum(-1)
        ctx.save_for_backward(w, s2, L, c, quad)
        ctx.n = n
        return -0.5 * (n * (LOG_2PI + s2.log()) + logdet_from_cholesky(L) + quad)

    @staticmethod
    def backward(ctx, grad: Tensor):
        w, s2, L, c, quad = ctx.saved_tensors
        L_inv = lower_inverse(L)
        d = (L_inv**2).sum(-2)  # diag(B^{-1}) = diag(L^{-T} L^{-1}): column sums of squares
        a = (L_inv.mT @ c.unsqueeze(-1)).squeeze(-1)
        dw = (a**2 - 1 + d) / (2 * w)
        ds2 = (quad - (a**2).sum(-1) - (ctx.n - w.shape[-1]) - d.sum(-1)) / (2 * s2)
        return grad.unsqueeze(-1) * dw, grad * ds2, None, None, None, None


def _cholesky_or_nan(C: Tensor) -> Tensor:
    """The lower Cholesky factor of each matrix in C [..., k, k], NaN where one is not numerically positive definite.

    Not :func:`~gpscale.linalg.cholesky`: with sigma^2 > 0 these matrices only fail on overflow (e.g. of w), and
    then each chain's proposal must be rejected on its own (NaN) rather than every chain's factor jittered or the
    batch raising."""
    L, info = cholesky_ex(C)
    return torch.where((info == 0)[..., None, None], L, torch.full_like(L, math.nan))


def reweighted_predict(Phi: Tensor, w: Tensor, noise: Tensor, stats: Statistics) -> tuple[Tensor, Tensor]:
    """Latent mean ``phi*^T P^{-1} r`` and variance ``sigma^2 phi*^T P^{-1} phi*`` [c] of the re-weighted model at
    test features Phi [c, p] (``P = sigma^2 W^{-1} + A``)."""
    post = weight_posterior_cholesky(weighted(stats, w), noise.to(CORE))
    return weight_space_predictive(post.L_B, post.weight_mean, Phi.to(CORE) * w.to(CORE).sqrt())


@dataclass
class OrthogonalBasis:
    """The training features orthogonalised: ``Phi = U_s diag(s) V^T`` (thin SVD, from
    ``A = Phi^T Phi = V diag(s^2) V^T``), basis ``phi~(x) = diag(s)^{-1} V^T phi(x)`` with ``Phi~ = U_s``."""

    V: Tensor  # [p, q], the kept right singular vectors of Phi
    s: Tensor  # [q], its kept singular values
    r: Tensor  # [q], r~ = U_s^T y = V^T r / s
    rss: Tensor  # [], y^T y - ||r~||^2 = ||(I - U_s U_s^T) y||^2, the part of y outside the span of Phi
    n: int

    def transform(self, Phi: Tensor) -> Tensor:
        """``Phi~ = Phi V diag(s)^{-1}`` [c, q] for features Phi [c, p], training or test rows
        alike (test features go through the training basis, never one of their own)."""
        return Phi.to(CORE) @ (self.V / self.s)

    @cached_property
    def G(self) -> Tensor:
        """The training features in their row space, ``diag(s) V^T`` [q, p]: ``Phi = U_s G``."""
        return (self.s.unsqueeze(-1) * self.V.T).contiguous()


def orthogonalise(stats: Statistics, rcond: float = 1e-12) -> OrthogonalBasis:
    """The orthogonal basis of the features whose statistics are ``stats``, without holding Phi (the orthogonal form's
    memory trick, O(p^3) once).

    eigh of A squares the condition number of Phi, so directions with ``s^2 <= rcond * max(s^2)`` are dropped
    (relative: the official code drops ``s <= 1e-7`` from an SVD of Phi itself); q = p~ <= min(n, p) remain. The
    weights ``w~ = s^2`` give the evidence of the Nyström model with w = 1, up to the dropped directions (for
    predictions see :func:`orthogonal_predict`).
    """
    s2, V = torch.linalg.eigh(stats.A.to(CORE))
    keep = s2 > rcond * s2.max()
    s, V = s2[keep].sqrt(), V[:, keep]
    r = (V.T @ stats.b.to(CORE)) / s
    return OrthogonalBasis(V=V, s=s, r=r, rss=(stats.yy - r @ r).clamp_min(0.0), n=stats.n)


def orthogonal_log_likelihood(w: Tensor, noise: Tensor, basis: OrthogonalBasis) -> Tensor:
    """``log N(y | 0, U_s W~ U_s^T + sigma^2 I)`` for weights w~ [q] > 0 on the orthogonal basis, in O(q):

        -1/2 [rss / sigma^2 + sum_i r~_i^2 / (w~_i + sigma^2) + sum_i log(w~_i + sigma^2)
              + (n - q) log sigma^2 + n log 2 pi].

    A float64 scalar, differentiable in w~ and sigma^2, batched over leading dimensions of w~ [..., q] and sigma^2
    [...]. It is a different prior from eq. 18's (the basis depends on the data); ``w~ = basis.s ** 2`` gives the
    w = 1 model.
    """
    s2 = noise.to(CORE)
    total = w.to(CORE) + s2.unsqueeze(-1)
    q = basis.r.shape[0]
    return -0.5 * (basis.rss / s2 + (basis.r**2 / total).sum(-1) + total.log().sum(-1)
                   + (basis.n - q) * s2.log() + basis.n * LOG_2PI)


def row_space_factor(w: Tensor, noise: Tensor, basis: OrthogonalBasis) -> tuple[Tensor, Tensor]:
    """``G W`` [..., q, p] and the lower Cholesky factor [..., q, q] of ``C = G W G^T + sigma^2 I_q`` (NaN where C is
    not numerically positive definite, e.g. when w overflowed), with ``G = diag(s) V^T`` the training features in
    their row space (``Phi = U_s G``), for weights w [..., p] and noise [...]: O(q^2 p) for C, O(q^3) for its factor.
    """
    G = basis.G
    GW = G * w.to(CORE).unsqueeze(-2)
    eye = torch.eye(G.shape[0], dtype=CORE, device=G.device)
    return GW, _cholesky_or_nan(GW @ G.T + noise.to(CORE)[..., None, None] * eye)


def row_space_log_likelihood(w: Tensor, noise: Tensor, basis: OrthogonalBasis) -> Tensor:
    """Eq. 18, ``log N(y | 0, Phi W Phi^T + sigma^2 I)`` for weights w [..., p] on the features themselves and noise
    [...], evaluated in the q-dimensional row space of Phi (q = rank <= min(n, p)) in O(q^2 p + q^3) instead of
    O(p^3):

        -1/2 [rss / sigma^2 + r~^T C^{-1} r~ + log|C| + (n - q) log sigma^2 + n log 2 pi],

    with ``C = G W G^T + sigma^2 I_q``: y splits into ``U_s r~`` and a residual of norm^2 rss orthogonal to every
    feature, which sees sigma^2 alone. The same model as :func:`reweighted_log_likelihood` up to the directions
    that :func:`orthogonalise` drops; cheaper when q is well below p (n < p: the small sets at p = 1000). The data
    fit has no ``y^T y / sigma^2 - c^T c`` cancellation. Differentiable in w and sigma^2 through closed forms
    (:class:`_RowSpaceEvidence`); batched over leading dimensions (MCMC chains); NaN where C is not numerically
    positive definite, which a sampler rejects.
    """
    return _RowSpaceEvidence.apply(w.to(CORE), noise.to(CORE), basis)


class _RowSpaceEvidence(torch.autograd.Function):
    """The row-space eq. 18 with its gradient in closed form: with ``alpha = C^{-1} r~`` and the columns g_i of G,

        dLML/dw_i = 1/2 [(g_i^T alpha)^2 - g_i^T C^{-1} g_i],
        dLML/dsigma^2 = 1/2 [rss / sigma^4 + ||alpha||^2 - tr C^{-1} - (n - q) / sigma^2],

    ``g_i^T C^{-1} g_i`` being the squared column norms of ``L^{-1} G``. About 2 q^2 p + 2/3 q^3 flops per step, in
    matrix products, where autograd spends several q^2 p in triangular solves: hence the hand-written backward
    pass, as in the features' form.
    """

    @staticmethod
    def forward(ctx, w: Tensor, s2: Tensor, basis: OrthogonalBasis) -> Tensor:
        _, L = row_space_factor(w, s2, basis)
        c = solve_lower(L, basis.r.expand(*L.shape[:-1]).unsqueeze(-1)).squeeze(-1)
        ctx.save_for_backward(s2, L, c)
        ctx.basis = basis
        n, q = basis.n, basis.r.shape[0]
        return -0.5 * (basis.rss / s2 + (c**2).sum(-1) + logdet_from_cholesky(L) + (n - q) * s2.log() + n * LOG_2PI)

    @staticmethod
    def backward(ctx, grad: Tensor):
        s2, L, c = ctx.saved_tensors
        basis = ctx.basis
        L_inv = lower_inverse(L)
        alpha = (L_inv.mT @ c.unsqueeze(-1)).squeeze(-1)
        dw = 0.5 * ((alpha @ basis.G) ** 2 - ((L_inv @ basis.G) ** 2).sum(-2))
        q = basis.r.shape[0]
        ds2 = 0.5 * (basis.rss / s2**2 + (alpha**2).sum(-1) - (L_inv**2).sum((-2, -1)) - (basis.n - q) / s2)
        return grad.unsqueeze(-1) * dw, grad * ds2, None


def orthogonal_predict(Phi: Tensor, w: Tensor, noise: Tensor, basis: OrthogonalBasis) -> tuple[Tensor, Tensor]:
    """Latent mean ``Phi~* (w~ r~ / (w~ + sigma^2))`` and variance ``Phi~*^2 (sigma^2 w~ / (w~ + sigma^2))`` [c] at
    test features Phi [c, p], transformed here by ``V / s`` (not the official code's untransformed variance).

    With ``w~ = s^2`` the mean is the w = 1 model's; so is the variance when the kept V span every phi*, i.e.
    p <= n at full rank. Otherwise the part of phi* outside span(V), which no training row constrains, has prior
    variance ``||(I - V V^T) phi*||^2`` in the w = 1 model and none here: the orthogonal form is a different prior.
    """
    Phi_t, w, s2 = basis.transform(Phi), w.to(CORE), noise.to(CORE)
    shrink = w / (w + s2)
    return Phi_t @ (shrink * basis.r), Phi_t**2 @ (s2 * shrink)

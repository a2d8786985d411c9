"""GP-GRIEF: GPs with grid-structured eigenfunctions (Evans & Nair, ICML 2018, arXiv 1807.02125; spec:
shared/specs/grief.md).

The kernel is the Nyström approximation of an SE-ARD kernel on a Cartesian grid U of ``m = prod_i mbar_i`` inducing
points (m up to 10^33), truncated to its top p eigenfunctions (eqs. 3, 4):

    k~(x, z) = phi(x)^T phi(z),     Phi = K_XU Q S_p^T Lambda_p^{-1/2}   [n, p],

computed in O(d n p) with Kronecker and Khatri-Rao algebra (Algorithm 1, Theorem 2; :mod:`gpscale.kernels.grid`).
With weights ``w ~ N(0, I_p)`` it is a Bayesian linear model, so everything runs on the linear engine
(``_linear.py``) with ``B = I + A / sigma^2`` and ``A = Phi^T Phi``, ``r = Phi^T y``: the evidence (eq. 18 with
W = I) and the predictive

    mean = phi*^T P^{-1} r,     var f* = sigma^2 phi*^T P^{-1} phi*,     P = sigma^2 I + A = sigma^2 B.

The registered model is GP-GRIEF-II (type II): w = 1 and the SE-ARD hyperparameters {lengthscales, s_f^2, sigma^2}
maximise the evidence, with autograd gradients through the 1-D eigendecompositions (the official code uses forward
finite differences). The selected top-p index set changes with the lengthscales, so the objective is only
piecewise smooth (pitfall 9); the gradient is exact within each piece.

Initialisation (:meth:`GRIEF.initialise_from_exact_gp`): theta from an exact SE-ARD GP on at most 1000 rows, as the
paper, but fitted by L-BFGS-B inside a box (each hyperparameter within a factor 10^4 of its data scale), and by
default (``init_noise="grief"``) sigma^2 from the GRIEF model itself: the maximiser of its evidence at that theta, a
1-D search on the statistics of all training rows (:func:`_linear.evidence_maximising_noise`). The paper copies the
exact GP's sigma^2 (``init_noise="exact"``), which on near-noiseless small sets is an interpolating GP's: sigma^2 at
its floor, where the low-rank GRIEF kernel has a huge loss and Adam in softplus space cannot move it.

For GP-GRIEF-I (theta fixed, MCMC over re-weighted eigenfunctions ``k~ = sum_i w_i phi_i phi_i``, eqs. 16-18) this
module gives the evidence as pure functions of (w, sigma^2) on precomputed statistics (:meth:`GRIEF.statistics`):
:func:`reweighted_log_likelihood` in O(p^3), the same in the q-dimensional row space of Phi
(:func:`row_space_log_likelihood`, O(q^2 p), for q = rank(Phi) well below p) and, on the orthogonalised basis of
:func:`orthogonal_log_likelihood` in O(p); autograd gives their gradients.
"""
from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Callable

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from .. import lbfgs
from ..distributed import LOCAL, Comm
from ..kernels import RBF, Kernel, inverse_softplus
from ..kernels.grid import (
    cross_factors,
    factor_eigh,
    grid_factors,
    grid_points,
    grief_features,
    top_eigenvalues,
)
from ..linalg import NumericalWarning, logdet_from_cholesky, lower_inverse, solve_lower
from . import _linear
from ._linear import CORE
from .base import GPModel, PredictiveFactors, register
from .exact import ExactGP

__all__ = ["GRIEF", "GridSpectrum", "OrthogonalBasis", "paper_n_eigen", "weighted", "reweighted_log_likelihood",
           "reweighted_predict", "orthogonalise", "orthogonal_log_likelihood", "orthogonal_predict",
           "row_space_factor", "row_space_log_likelihood", "INIT_NOISE"]

LOG_2PI = math.log(2 * math.pi)
INIT_NOISE = ("grief", "exact")
INIT_STRETCH = (1.0, 2.0, 4.0, 8.0, 16.0)  # GRIEF.stretched_starts: the exact GP's lengthscales times these
# The initialisation keeps every positive hyperparameter within a factor INIT_RANGE of its data scale (lengthscale i:
# the range of input i; s_f^2 and sigma^2: mean(y^2)). Its lower end for sigma^2, 10^-4 mean(y^2) (a noise std of
# 1% of y's), is where it matters: the smallest noise in the paper's Table 1 is about 2e-3 of var(y) (energy:
# GRIEF-I's RMSE, an upper bound of the noise std, is 0.046 std(y)), so a model that fits is never held by it, while
# below it lie the interpolating GPs that near-noiseless small sets (slump, wine) pull the evidence toward. It also
# keeps the raw (softplus) noise above about -9.2, where Adam moves it in tens of steps.
INIT_RANGE = 1e4
# The exact-GP fit "explains nothing" when its loss per point is within this of the white-noise model's: it is then
# restarted from lengthscales spread to the data (pumadyn32nm fold 0: from ln 2 in 32 standardised dimensions the
# fit never left the start, with sigma^2 = var(y) and a gradient of 1e-10, and GRIEF-II then had test RMSE 1.00)
EXPLAINS_NOTHING = 1e-3
# The restart fits from the spread lengthscales times each of these and keeps the largest evidence. From the spread
# alone (sqrt(d) std_i, 5.7 on pumadyn32nm) the fit on folds 0 and 2 of pumadyn32nm switched off two of its four
# relevant inputs (lengthscales near 500; loss per point 0.209 and 0.199, sigma^2 0.08, GRIEF-II test RMSE 0.285 and
# 0.277 in y units); from half of it all four were found there (-0.011 and -0.005, sigma^2 0.043), as the spread
# alone found them on fold 1.
SPREAD_FACTORS = (1.0, 0.5)
# An exact GP on at least this many rows that sees an input take one value on all of them but one cannot fit that
# input's lengthscale; fewer rows leave every lengthscale loosely determined, with nothing specific to warn about.
BLIND_MIN_ROWS = 100


def paper_n_eigen(n: int) -> int:
    """The paper's number of eigenfunctions for GP-GRIEF-II, ``p = min(1000, 10^floor(log10 n))`` (Table 1)."""
    return min(1000, 10 ** (len(str(int(n))) - 1))


# --- GP-GRIEF-I: re-weighted eigenfunctions on fixed features ----------------------------------
def weighted(stats: _linear.Statistics, w: Tensor) -> _linear.Statistics:
    """The statistics of the features ``Phi W^{1/2}``, whose kernel is ``Phi W Phi^T`` (eq. 17)."""
    root = w.to(CORE).sqrt()
    return replace(stats, A=root.unsqueeze(-1) * stats.A * root, b=root * stats.b)


def reweighted_log_likelihood(w: Tensor, noise: Tensor, stats: _linear.Statistics) -> Tensor:
    """``log N(y | 0, Phi W Phi^T + sigma^2 I)`` (eq. 18) from ``A = Phi^T Phi``, ``r = Phi^T y``, y^T y and n in
    ``stats`` (``_linear.accumulate``), for weights w [..., p] > 0 and noise sigma^2 [...]: O(p^3), whatever n.

    It is the engine's evidence of the features ``Phi W^{1/2}``: with ``B = I + W^{1/2} A W^{1/2} / sigma^2 = L L^T``,

        -1/2 [n log(2 pi sigma^2) + log|B| + y^T y / sigma^2 - ||L^{-1} W^{1/2} r||^2 / sigma^4],

    and ``|B| = |P| |W| / sigma^{2p}`` with ``P = sigma^2 W^{-1} + A`` turns it into eq. 18b. Valid for p > n. The
    data fit is ``y^T y / sigma^2 - c^T c``: with only the statistics there is no cancellation-free form (pitfall
    8). Differentiable in w and sigma^2 through the closed forms (:class:`_ReweightedEvidence`);
    batched over leading dimensions (MCMC chains); NaN where B is not numerically positive definite (w overflowed),
    which a sampler rejects.
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
    through the Cholesky factorisation costs several p^3 in triangular solves (146 ms against 55-68 ms per chain at
    p = 1000, one thread).
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

    Not ``linalg.cholesky``: with sigma^2 > 0 these matrices only fail on overflow (e.g. of w), and then each
    chain's proposal must be rejected on its own (NaN) rather than every chain's factor jittered or the batch
    raising."""
    L, info = torch.linalg.cholesky_ex(C)
    return torch.where((info == 0)[..., None, None], L, torch.full_like(L, math.nan))


def reweighted_predict(Phi: Tensor, w: Tensor, noise: Tensor, stats: _linear.Statistics) -> tuple[Tensor, Tensor]:
    """Latent mean ``phi*^T P^{-1} r`` and variance ``sigma^2 phi*^T P^{-1} phi*`` [c] of the re-weighted model at
    test features Phi [c, p] (``P = sigma^2 W^{-1} + A``)."""
    post = _linear.collapse_cholesky(weighted(stats, w), noise.to(CORE))
    return _linear.predict_linear(post.L_B, post.weight_mean, Phi.to(CORE) * w.to(CORE).sqrt())


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
        """``Phi~ = Phi V diag(s)^{-1}`` [c, q] for features Phi [c, p] (training or test: pitfall 10)."""
        return Phi.to(CORE) @ (self.V / self.s)

    @cached_property
    def G(self) -> Tensor:
        """The training features in their row space, ``diag(s) V^T`` [q, p]: ``Phi = U_s G``."""
        return (self.s.unsqueeze(-1) * self.V.T).contiguous()


def orthogonalise(stats: _linear.Statistics, rcond: float = 1e-12) -> OrthogonalBasis:
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
    matrix products, where autograd spends several q^2 p in triangular solves (210 ms against 74 ms per chain at
    q = 700, p = 1000, one thread).
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


# --- GP-GRIEF-II ------------------------------------------------------------------------------------------------
@dataclass
class GridSpectrum:
    """The top-p eigenpairs of K_UU at one set of hyperparameters, as Algorithm 1 gives them."""

    Q: list[Tensor]  # d eigenvector matrices Q^(i) [mbar_i, mbar_i]
    idxs: Tensor  # [p, d] Kronecker indices of the selected eigenpairs
    logl: Tensor  # [p] their log-eigenvalues, descending (differentiable)


@register("grief")
class GRIEF(GPModel):
    """GP-GRIEF-II: the Nyström kernel of an SE-ARD kernel on a Cartesian grid, truncated to its top p
    eigenfunctions, with w = 1 and the hyperparameters learned on the evidence, trained full batch.

    Each step rebuilds the d 1-D eigendecompositions, Algorithm 1, Phi [n, p] and ``A = Phi^T Phi``:
    O(d mbar^3 + d n p + n p^2 + p^3) time and O(n p) memory (Phi is computed in checkpointed
    chunks of ``chunk_size`` rows, so the autograd graph is held for one chunk at a time). The posterior is fitted
    in one streamed pass, O(chunk x p) memory, and prediction needs only the cache (grid, selected eigenvectors,
    posterior), not the training data. Features and the p x p core are float64 whatever the model dtype: Phi is a
    sum of d logs.

    Args:
        n_eigen: p, the number of eigenfunctions (capped at m). Default None: the paper's
            ``min(1000, 10^floor(log10 n))``, resolved in :meth:`init` (e.g. 100 for n = 200).
        grid_size: mbar, grid points per dimension (default 10, the paper's); a column with fewer distinct values
            gets exactly those (:func:`~gpscale.kernels.grid.grid_points`). Built from the training inputs.
        init_exact_points: initialise the hyperparameters as the paper does, from an exact SE-ARD GP fitted on
            this many random training rows (default 1000; all of them if n is smaller); 0 keeps the constructor's
            ``lengthscale``, ``outputscale`` and ``noise``.
        init_iterations: L-BFGS-B iterations of that exact-GP fit (default 100).
        init_noise: where the initial sigma^2 comes from: ``"grief"`` (default), the maximiser of this model's
            evidence at the initial theta over all training rows; ``"exact"``, the exact GP's, as the paper.
        init_stretch: factors applied to the exact GP's lengthscales to give the starts of a multi-start type-II
            fit on the exact GP's rows (:meth:`stretched_starts`); the start with the largest GRIEF evidence there
            initialises training. Default ``(1, 2, 4, 8, 16)``; ``(1,)`` is the paper's single start. Only with
            the exact-GP initialisation (``init_exact_points > 0``).
        jitter: added to each 1-D grid factor K^(i) (default 1e-12, the official code's).
        kernel: only ``'rbf'`` (the value :class:`~gpscale.GPRegressor` passes every method) or an
            :class:`~gpscale.kernels.RBF`: the grid algebra needs a product of 1-D squared exponentials. ``ard``
            (default True) gives one lengthscale per dimension; the outputscale is s_f^2, applied once.
        **kwargs: ``lengthscale``, ``outputscale``, ``ard``, ``noise``, ``learn_noise``, ``noise_floor`` and
            ``chunk_size`` of :class:`GPModel`.
    """

    full_batch = True
    data_parallel = "statistics"

    def __init__(self, n_features: int, n_eigen: int | None = None, grid_size: int = 10,
                 init_exact_points: int = 1000, init_iterations: int = 100, jitter: float = 1e-12, *,
                 init_noise: str = "grief", init_stretch: tuple[float, ...] = INIT_STRETCH,
                 kernel: str | Kernel | None = "rbf", **kwargs):
        _check_options(n_eigen=n_eigen, grid_size=grid_size, init_exact_points=init_exact_points,
                       init_iterations=init_iterations, jitter=jitter, init_noise=init_noise,
                       init_stretch=init_stretch, kernel=kernel)
        super().__init__(n_features, kernel="rbf" if kernel is None else kernel, **kwargs)
        self.n_eigen = None if n_eigen is None else int(n_eigen)
        self.grid_size = int(grid_size)
        self.init_exact_points = int(init_exact_points)
        self.init_iterations = int(init_iterations)
        self.init_noise = init_noise
        self.init_stretch = tuple(float(f) for f in init_stretch)
        self.jitter = float(jitter)
        # the grid is data-dependent but its padded shape is not, so a saved model loads into a fresh one
        self.register_buffer("grid", torch.zeros(self.n_features, self.grid_size))  # row i: xg[i], padded
        self.register_buffer("grid_sizes", torch.zeros(self.n_features, dtype=torch.long))  # mbar_i; 0 = no grid
        self.register_buffer("n_eigen_", torch.tensor(0))  # p as resolved by init

    # --- initialisation -----------------------------------------------------------------------------------
    def init(self, X: Tensor, y: Tensor, seed: int = 0) -> None:
        """Build the grid from the training inputs X [n, d] (never test inputs: pitfall 12), resolve p and, if
        ``init_exact_points``, initialise the hyperparameters from an exact GP on a random subset."""
        xg = grid_points(X.detach(), self.grid_size)
        with torch.no_grad():
            self.grid.zero_()
            for i, x in enumerate(xg):
                self.grid[i, : x.shape[0]] = x.to(self.grid.dtype)
                self.grid_sizes[i] = x.shape[0]
            self.n_eigen_.fill_(self.n_eigen if self.n_eigen is not None else paper_n_eigen(X.shape[0]))
        if self.init_exact_points > 0:
            self.initialise_from_exact_gp(X, y, seed)

    def initialise_from_exact_gp(self, X: Tensor, y: Tensor, seed: int = 0) -> None:
        """Fit an exact SE-ARD GP on ``min(n, init_exact_points)`` random rows and copy its lengthscales and s_f^2
        (the paper's initialisation); sigma^2 as ``init_noise`` says (a learned noise only).

        L-BFGS-B over the raw (softplus) parameters, as the paper's GPy, within the box of :func:`_exact_gp_box`;
        for a handful of hyperparameters it reaches the evidence's maximum in tens of iterations, where Adam with a
        fixed budget stops short or oscillates. Points where the Cholesky fails count as a huge loss and the best
        point evaluated is kept; if not even the start can be evaluated, the constructor's hyperparameters stay, with a
        :class:`~gpscale.linalg.NumericalWarning`. float64 throughout: the n x n Cholesky at a 1000 points is where
        float32 fails.
        """
        rows = torch.randperm(X.shape[0], generator=torch.Generator().manual_seed(seed))[: self.init_exact_points]
        Xs, ys = X.detach()[rows.to(X.device)].to(CORE), y.detach()[rows.to(y.device)].to(CORE)
        exact, fitted = self._fit_exact_gp(Xs, ys, self.kernel)
        if fitted.evaluated and fitted.loss >= _white_noise_loss(ys) - EXPLAINS_NOTHING:
            # the fit stayed where the kernel between distinct rows is ~0 (lengthscales far below the spacing of
            # the rows, as ln 2 is in 32 standardised dimensions): restart where typical rows correlate
            spread = _spread_lengthscale(Xs, self.kernel.ard)
            for factor in SPREAD_FACTORS:
                start = copy.deepcopy(self.kernel)
                with torch.no_grad():
                    start.raw_lengthscale.copy_(inverse_softplus(spread * factor))
                exact_spread, fitted_spread = self._fit_exact_gp(Xs, ys, start)
                if fitted_spread.evaluated and fitted_spread.loss < fitted.loss:
                    exact, fitted = exact_spread, fitted_spread
        if fitted.evaluated:
            self.kernel.load_state_dict(exact.kernel.state_dict())
            noise = exact.noise.detach()
            if len(self.init_stretch) > 1:
                self.stretched_starts(Xs, ys)
            else:
                self._warn_about_blind_inputs(Xs)
        else:
            warnings.warn("GP-GRIEF's exact-GP initialisation failed at its starting point (the Cholesky of K + "
                          "sigma^2 I); the constructor's lengthscale, outputscale and noise are kept. Pass other "
                          "starting values, or init_exact_points=0 to skip the exact GP.", NumericalWarning,
                          stacklevel=3)
            noise = self.noise.detach()
        if self.likelihood.learn_noise:
            self._set_noise(self.max_evidence_noise(X, y) if self.init_noise == "grief" else noise)

    def stretched_starts(self, Xs: Tensor, ys: Tensor) -> list[tuple[float, float]]:
        """Multi-start type-II fit on (Xs, ys), the exact GP's rows: from the current theta with every lengthscale
        multiplied by each factor of ``init_stretch`` (sigma^2 at this model's evidence maximiser there), L-BFGS-B
        on this model's evidence for at most ``init_iterations`` iterations; the fit with the largest evidence is
        kept (theta and sigma^2). Returns (factor, loss per point) of every start.

        Why: the exact GP's lengthscales suit the full kernel, and the top-p truncation then drops much of its
        variance; the rank-p evidence has other, better maxima at longer lengthscales, where fewer eigenfunctions
        carry the kernel, which a descent from the exact GP's theta does not reach (energy, p = 100, fold 0: loss
        per point -1.03 from the exact GP's lengthscales, -1.36 from 8 times them). And an input that is constant on
        (almost) all of the exact GP's rows keeps its starting lengthscale, which can lie far below its grid's
        spacing: that factor's mbar_i eigenvalues are then nearly equal and the top p of the product repeat a few
        eigenfunctions of the other inputs (keggundirected, p = 1000: Phi carries 43% of the kernel's variance
        from the exact GP's theta, 99.98% from the best start). O(init_exact_points p^2) per evaluation, a few
        hundred evaluations per start.
        """
        base = copy.deepcopy(self.kernel.state_dict())
        best, found = (math.inf, None), []
        for factor in self.init_stretch:
            self.kernel.load_state_dict(base)
            with torch.no_grad():
                self.kernel.raw_lengthscale.copy_(inverse_softplus(self.kernel.lengthscale * factor))
            if self.likelihood.learn_noise:
                self._set_noise(self.max_evidence_noise(Xs, ys))
            params = [p for group in self.parameter_groups() for p in group["params"]]
            fitted = lbfgs.minimise(lambda: self.loss(Xs, ys, Xs.shape[0]), params,
                                    max_iterations=self.init_iterations)
            found.append((factor, fitted.loss))
            if fitted.loss < best[0]:
                best = (fitted.loss, copy.deepcopy(self.state_dict()))
        if best[1] is None:  # no start could be evaluated: keep the exact GP's theta
            self.kernel.load_state_dict(base)
        else:
            self.load_state_dict(best[1])
        return found

    def _warn_about_blind_inputs(self, Xs: Tensor) -> None:
        """Warn when some input with a grid of several points takes one value on all but at most one of the exact
        GP's rows Xs: the exact GP cannot fit its lengthscale, which keeps its start, and where that lies below the
        grid's spacing the input's mbar_i nearly equal eigenvalues crowd the top p of the product (keggundirected,
        three such inputs at p = 1000: Phi carries 43% of the kernel's variance)."""
        if Xs.shape[0] < BLIND_MIN_ROWS:
            return
        blind = [i for i, size in enumerate(self.grid_sizes.tolist())
                 if size > 1 and Xs[:, i].unique(return_counts=True)[1].max() >= Xs.shape[0] - 1]
        if blind:
            lengthscale = self.kernel.lengthscale.detach().expand(self.n_features)
            warnings.warn(f"GP-GRIEF's inputs {blind} take one value on all but at most one of the exact GP's "
                          f"{Xs.shape[0]} initialisation rows, so it cannot fit their lengthscales, which stay near "
                          f"their start ({', '.join(f'{lengthscale[i].item():.3g}' for i in blind)}). Where these "
                          f"lie below the spacing of those inputs' grids, their nearly equal eigenvalues crowd out "
                          f"the others in the top n_eigen and the features carry little of the kernel's variance. "
                          f"Pass init_stretch=(1, 2, 4, 8, 16) (the multi-start, which lengthens them where that "
                          f"raises the evidence), or init_exact_points=0 with lengthscales of your own.",
                          UserWarning, stacklevel=4)

    def _fit_exact_gp(self, Xs: Tensor, ys: Tensor, kernel: Kernel) -> tuple[ExactGP, lbfgs.LbfgsResult]:
        exact = ExactGP(self.n_features, kernel=copy.deepcopy(kernel), noise=float(self.noise.detach()),
                        learn_noise=self.likelihood.learn_noise, noise_floor=self.likelihood.noise_floor).to(CORE)
        params, bounds = _exact_gp_box(exact, Xs, ys)
        fitted = lbfgs.minimise(lambda: exact.loss(Xs, ys, Xs.shape[0]), params, bounds=bounds,
                                max_iterations=self.init_iterations)
        return exact, fitted

    def max_evidence_noise(self, X: Tensor, y: Tensor) -> Tensor:
        """The sigma^2 that maximises this model's evidence on (X, y) at the current theta, within
        :func:`_noise_range` (one statistics pass, O(n p^2), then a 1-D search:
        :func:`_linear.evidence_maximising_noise`)."""
        stats = self.statistics(X, y)
        lower, upper = _noise_range(stats.yy.item() / stats.n, self.likelihood.noise_floor)
        return torch.tensor(_linear.evidence_maximising_noise(stats, lower, upper), dtype=CORE)

    def _set_noise(self, value: Tensor) -> None:
        """Set the likelihood's sigma^2 to ``value``: raw = inverse_softplus(value - floor), within the floor."""
        lik = self.likelihood
        excess = (value.to(CORE) - lik.noise_floor).clamp_min(torch.finfo(CORE).tiny)
        with torch.no_grad():
            lik.raw_noise.copy_(inverse_softplus(excess).to(lik.raw_noise))

    # --- the features -------------------------------------------------------------------------------------
    def grids(self) -> list[Tensor]:
        """The d 1-D grids xg[i] [mbar_i] (float64)."""
        if not (self.grid_sizes > 0).all():
            raise RuntimeError("The grief model has no grid yet: train it with gpscale.train.fit, or call "
                               "init(X, y) with the training data first.")
        return [row[:size].to(CORE) for row, size in zip(self.grid, self.grid_sizes.tolist())]

    def hyperparameters(self) -> tuple[Tensor, Tensor]:
        """Lengthscales [d] or [1] and s_f^2 [] (float64, differentiable)."""
        return self.kernel.lengthscale.to(CORE), self.kernel.outputscale.to(CORE)

    def spectrum(self) -> GridSpectrum:
        """Eigendecompose the d grid factors and select the top p eigenpairs, differentiably."""
        lengthscale, outputscale = self.hyperparameters()
        eigen = [factor_eigh(K) for K in grid_factors(self.grids(), lengthscale, outputscale, self.jitter)]
        logl, idxs = top_eigenvalues([lam for lam, _ in eigen], int(self.n_eigen_))
        return GridSpectrum(Q=[Q for _, Q in eigen], idxs=idxs, logl=logl)

    def feature_map(self, spectrum: GridSpectrum) -> Callable[[Tensor], Tensor]:
        """``x -> phi(x)``: X [c, d] -> Phi [c, p] (float64) for the eigenpairs of ``spectrum`` (steps 4-5)."""
        xg = self.grids()
        lengthscale, outputscale = self.hyperparameters()

        def phi(X: Tensor) -> Tensor:
            Kxu = cross_factors(X.to(CORE), xg, lengthscale, outputscale)
            return grief_features(Kxu, spectrum.Q, spectrum.idxs, spectrum.logl)

        return phi

    def features(self, X: Tensor) -> Tensor:
        """Phi [n, p] at the current hyperparameters, ``chunk_size`` rows at a time (checkpointed when several)."""
        phi = self.feature_map(self.spectrum())
        chunks = X.split(self.chunk_size)
        if torch.is_grad_enabled() and len(chunks) > 1:
            return torch.cat([checkpoint(phi, Xc, use_reentrant=False) for Xc in chunks])
        return torch.cat([phi(Xc) for Xc in chunks])

    @torch.no_grad()
    def preconditioner(self, X: Tensor) -> Callable[[Tensor], Tensor]:
        """``v -> (Phi Phi^T + sigma^2 I)^{-1} v`` [n] at the current hyperparameters: the paper's §4.1
        preconditioner for conjugate gradients on an exact GP's ``K_XX + sigma^2 I`` (pass it to
        :func:`gpscale.linalg.conjugate_gradients`). With m >> n grid points the Nyström eigenfunctions are
        accurate (Theorem 1), so the preconditioned system's spectrum clusters near 1. Woodbury: O(n p^2 + p^3)
        once, O(n p) per application; Phi [n, p] is held in memory, so it suits the moderate n where an exact
        K_XX is affordable."""
        return _linear.woodbury_solver(self.features(X), self.noise)

    # --- training -----------------------------------------------------------------------------------------
    def log_marginal_likelihood(self, X: Tensor, y: Tensor, comm: Comm = LOCAL) -> Tensor:
        """``log N(y | 0, Phi Phi^T + sigma^2 I)`` (eq. 18 with W = I; float64 scalar, differentiable in every
        hyperparameter), with the engine's cancellation-free data fit (pitfall 8)."""
        Phi, y = self.features(X), y.to(CORE)
        stats = _linear.accumulate(_linear.in_memory, Phi, y, chunk_size=self.chunk_size, recompute=False,
                                   comm=comm)
        post = _linear.collapse_cholesky(stats, self.noise)
        quad = _linear.residual_quad(Phi, y, post.weight_mean, self.noise, chunk_size=self.chunk_size, comm=comm)
        return _linear.log_evidence(replace(post, quad=quad), self.noise)

    def loss(self, X: Tensor, y: Tensor, num_data: int, comm: Comm = LOCAL) -> Tensor:
        return -self.log_marginal_likelihood(X, y, comm) / num_data

    # --- posterior ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def statistics(self, X: Tensor, y: Tensor, comm: Comm = LOCAL,
                   spectrum: GridSpectrum | None = None) -> _linear.Statistics:
        """``A = Phi^T Phi``, ``r = Phi^T y``, y^T y and n at the current hyperparameters (or the eigenpairs of
        ``spectrum``), in one streamed pass (memory O(chunk x p)): the precomputation of GP-GRIEF-I
        (:func:`reweighted_log_likelihood`, :func:`orthogonalise`)."""
        phi = self.feature_map(self.spectrum() if spectrum is None else spectrum)
        return _linear.accumulate(phi, X, y.to(CORE), chunk_size=self.chunk_size, comm=comm)

    @torch.no_grad()
    def fit_posterior(self, X: Tensor, y: Tensor, comm: Comm = LOCAL) -> None:
        spectrum = self.spectrum()
        post = _linear.collapse_cholesky(self.statistics(X, y, comm, spectrum), self.noise)
        self.cache = {**self.spectrum_cache(spectrum), "L_B": post.L_B, "w_mean": post.weight_mean}

    def spectrum_cache(self, spectrum: GridSpectrum) -> dict[str, Tensor]:
        """The eigenpairs as the cache holds them (:meth:`cached_spectrum` reads them back): the d factors Q^(i)
        zero-padded into one [d, mbar, mbar] tensor, so that a saved model loads into a fresh one."""
        Q = torch.zeros(self.n_features, self.grid_size, self.grid_size, dtype=CORE, device=spectrum.logl.device)
        for i, Qi in enumerate(spectrum.Q):
            Q[i, : Qi.shape[0], : Qi.shape[1]] = Qi
        return {"Q": Q, "idxs": spectrum.idxs, "logl": spectrum.logl}

    def cached_spectrum(self) -> GridSpectrum:
        """The spectrum that :meth:`fit_posterior` stored (eigenvector signs included, which the posterior is
        tied to)."""
        sizes = self.grid_sizes.tolist()
        Q = [Qi[:size, :size] for Qi, size in zip(self.cache["Q"], sizes)]
        return GridSpectrum(Q=Q, idxs=self.cache["idxs"], logl=self.cache["logl"])

    def predictive_factors(self, X: Tensor) -> PredictiveFactors:
        """Mean ``phi*^T P^{-1} r`` and covariance ``sigma^2 phi*^T P^{-1} phi*'``, with ``P = sigma^2 I + A`` and
        ``r = Phi^T y`` (the posterior of the weights of the features Phi)."""
        Phi = self.feature_map(self.cached_spectrum())(X)
        return _linear.weight_space_factors(self.cache["L_B"], self.cache["w_mean"], Phi)


def _noise_range(scale: float, floor: float) -> tuple[float, float]:
    """Bounds of the initial sigma^2 for targets of mean square ``scale``: ``scale`` times 10^-4 and 10^4
    (``INIT_RANGE``), the lower one at least twice the noise floor, so that the raw noise
    ``inverse_softplus(sigma^2 - floor)`` is at least ``inverse_softplus(floor)``."""
    lower = max(scale / INIT_RANGE, 2 * floor)
    return lower, max(scale, lower) * INIT_RANGE


def _white_noise_loss(y: Tensor) -> float:
    """The exact GP's loss (negative log evidence per point) of the best white-noise model, N(0, mean(y^2) I)."""
    return 0.5 * (math.log(2 * math.pi * (y**2).mean().item()) + 1.0)


def _spread_lengthscale(X: Tensor, ard: bool) -> Tensor:
    """Lengthscales at which the scaled squared distance between two typical rows of X is about 2 (so k between
    them is about e^-1): sqrt(d) times each column's std (1 for a constant column; their mean without ARD)."""
    std = X.std(0)
    std = torch.where(std > 0, std, torch.ones_like(std)) * math.sqrt(X.shape[1])
    return std if ard else std.mean().reshape(1)


def _exact_gp_box(exact: ExactGP, X: Tensor, y: Tensor) -> tuple[list[Tensor], list[tuple[float, float]]]:
    """The raw parameters of ``exact`` and L-BFGS-B's box for them: each lengthscale within a factor ``INIT_RANGE``
    of its input's range (1 for a constant input; the largest range without ARD), s_f^2 of mean(y^2), sigma^2 in
    :func:`_noise_range`. Without the box the line search steps where a lengthscale underflows to 0 (solar fold 0:
    raw -887, then NaN features and a failed Cholesky) or sigma^2 collapses onto its floor (cancer: raw -225); with
    it every raw value lies where softplus has a usable gradient for the Adam steps of GP-GRIEF-II."""
    span = X.max(0).values - X.min(0).values
    span = torch.where(span > 0, span, torch.ones_like(span))
    if not exact.kernel.ard:
        span = span.max().reshape(1)
    scale = (y**2).mean().item()
    box = [(exact.kernel.raw_lengthscale, span / INIT_RANGE, span * INIT_RANGE, 0.0),
           (exact.kernel.raw_outputscale, scale / INIT_RANGE, scale * INIT_RANGE, 0.0)]
    if exact.likelihood.learn_noise:
        floor = exact.likelihood.noise_floor
        box.append((exact.likelihood.raw_noise, *_noise_range(scale, floor), floor))
    bounds = []
    for param, lower, upper, floor in box:
        raw = [inverse_softplus(torch.as_tensor(v, dtype=CORE) - floor).expand(param.shape).reshape(-1).tolist()
               for v in (lower, upper)]
        bounds += list(zip(*raw))
    return [param for param, *_ in box], bounds


def _check_options(*, n_eigen, grid_size, init_exact_points, init_iterations, jitter, init_noise, init_stretch,
                   kernel) -> None:
    if n_eigen is not None and (int(n_eigen) != n_eigen or n_eigen < 1):
        raise ValueError(f"Expected n_eigen to be a positive integer, or None for the paper's "
                         f"min(1000, 10^floor(log10 n)). Got {n_eigen!r}.")
    if int(grid_size) != grid_size or grid_size < 2:
        raise ValueError(f"Expected grid_size (grid points per dimension; the paper uses 10) to be an integer "
                         f">= 2. Got {grid_size!r}.")
    if int(init_exact_points) != init_exact_points or init_exact_points < 0:
        raise ValueError(f"Expected init_exact_points to be a non-negative integer (0 skips the exact-GP "
                         f"initialisation). Got {init_exact_points!r}.")
    if int(init_iterations) != init_iterations or init_iterations < 1:
        raise ValueError(f"Expected init_iterations to be a positive integer. Got {init_iterations!r}.")
    if not jitter >= 0:
        raise ValueError(f"Expected jitter >= 0. Got {jitter!r}.")
    if init_noise not in INIT_NOISE:
        raise ValueError(f"Expected init_noise to be one of {INIT_NOISE} (the GRIEF evidence's maximiser at the "
                         f"initial theta, or the exact GP's sigma^2 as the paper). Got {init_noise!r}.")
    if isinstance(init_stretch, (str, bytes)) or not (
            hasattr(init_stretch, "__len__") and len(init_stretch) >= 1
            and all(isinstance(f, (int, float)) and math.isfinite(f) and f > 0 for f in init_stretch)):
        raise ValueError(f"Expected init_stretch to be a non-empty sequence of positive factors for the exact GP's "
                         f"lengthscales, e.g. (1, 2, 4, 8, 16), or (1,) for the paper's single start. "
                         f"Got {init_stretch!r}.")
    if not (kernel in (None, "rbf") or isinstance(kernel, RBF)):
        raise ValueError(f"GP-GRIEF's grid algebra needs a product of 1-D squared exponentials: use "
                         f"kernel='rbf' (with ard=True for SE-ARD), got kernel={kernel!r}.")

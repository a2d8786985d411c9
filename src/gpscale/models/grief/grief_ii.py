"""GP-GRIEF: GPs with grid-structured eigenfunctions (Evans & Nair, ICML 2018, arXiv 1807.02125).

The kernel is the Nyström approximation of an SE-ARD kernel on a Cartesian grid U of ``m = prod_i mbar_i`` inducing
points (m up to 10^33), truncated to its top p eigenfunctions (eqs. 3, 4):

    k~(x, z) = phi(x)^T phi(z),     Phi = K_XU Q S_p^T Lambda_p^{-1/2}   [n, p],

computed in O(d n p) with Kronecker and Khatri-Rao algebra (Algorithm 1, Theorem 2; :mod:`gpscale.kernels.grid`).
With weights ``w ~ N(0, I_p)`` it is a Bayesian linear model, so everything runs on the linear engine
(:mod:`gpscale.models.linear.engine`) with ``B = I + A / sigma^2`` and ``A = Phi^T Phi``, ``r = Phi^T y``: the
evidence (eq. 18 with W = I) and the predictive

    mean = phi*^T P^{-1} r,     var f* = sigma^2 phi*^T P^{-1} phi*,     P = sigma^2 I + A = sigma^2 B.

The registered model is GP-GRIEF-II (type II): w = 1 and the SE-ARD hyperparameters {lengthscales, s_f^2, sigma^2}
maximise the evidence, with autograd gradients through the 1-D eigendecompositions (the official code uses forward
finite differences). The selected top-p index set changes with the lengthscales, so the objective is only
piecewise smooth; the gradient is exact within each piece.

Initialisation (:mod:`gpscale.models.grief.init`): theta from an exact SE-ARD GP on a random subset of the rows (at
most 500 by default, the paper 1000), fitted by L-BFGS-B inside a box, and by default sigma^2 from the GRIEF model
itself, the maximiser of its evidence at that theta. GP-GRIEF-I (theta fixed, MCMC over re-weighted eigenfunctions)
is :mod:`gpscale.models.grief.grief_i`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from ...defaults import TrainingDefaults
from ...kernels import RBF, Kernel
from ...kernels.grid import (
    cross_factors,
    factor_eigh,
    grid_factors,
    grid_points,
    grief_features,
    pad_grids,
    top_eigenvalues,
)
from ...linalg import CORE, cholesky, gram
from ...options import check_options
from ..linear.engine import Features, FeatureSpaceGP
from ..base import BenchSize, register
from .init import INIT_NOISE, INIT_STRETCH, initialise_from_exact_gp

__all__ = ["GRIEFII", "GridSpectrum", "paper_n_eigen"]


def paper_n_eigen(n: int) -> int:
    """The paper's number of eigenfunctions for GP-GRIEF-II, ``p = min(1000, 10^floor(log10 n))`` (Table 1)."""
    return min(1000, 10 ** (len(str(int(n))) - 1))


@dataclass
class GridSpectrum:
    """The top-p eigenpairs of K_UU at one set of hyperparameters, as Algorithm 1 gives them."""

    Q: Tensor  # [d, M, M]: the eigenvector matrices Q^(i) [mbar_i, mbar_i], zero-padded to the grid's width M
    idxs: Tensor  # [p, d] Kronecker indices of the selected eigenpairs
    logl: Tensor  # [p] their log-eigenvalues, descending (differentiable)


@register("grief")
class GRIEFII(FeatureSpaceGP):
    """GP-GRIEF-II: the Nyström kernel of an SE-ARD kernel on a Cartesian grid, truncated to its top p
    eigenfunctions, with w = 1 and the hyperparameters learned on the evidence, trained full batch.

    Each step rebuilds the d 1-D eigendecompositions, Algorithm 1, Phi [n, p] and ``A = Phi^T Phi``:
    O(d mbar^3 + d n p + n p^2 + p^3) time and O(n p) memory (Phi is computed in chunks of
    ``chunk_size`` rows, whose graphs the backward pass rebuilds one at a time), and the evidence's data
    fit is taken in its cancellation-free residual form. The posterior is fitted in one streamed pass, O(chunk x p)
    memory, by Cholesky, and prediction needs only the cache (grid, selected eigenvectors, posterior), not the
    training data. Features and the p x p core are float64 whatever the model dtype: Phi is a sum of d logs.

    Args:
        n_eigen: p, the number of eigenfunctions (capped at m). Default None: the paper's
            ``min(1000, 10^floor(log10 n))``, resolved in :meth:`initialise_from_data` (e.g. 100 for n = 200).
        grid_size: mbar, grid points per dimension (default 10, the paper's); a column with fewer distinct values
            gets exactly those (:func:`~gpscale.kernels.grid.grid_points`). Built from the training inputs.
        init_exact_points: initialise the hyperparameters as the paper does, from an exact SE-ARD GP fitted on
            this many random training rows (all of them if n is smaller); 0 keeps the constructor's
            ``lengthscale``, ``outputscale`` and ``noise``. Default 500, where the paper takes 1000: GRIEF's own
            training on all rows starts from that theta and moves it anyway, so the smaller subset, whose exact GP
            costs an eighth of the larger's, only needs to start it near the optimum (the comparison is in the
            GP-GRIEF notes).
        init_iterations: L-BFGS-B iterations of that exact-GP fit (default 100).
        init_noise: where the initial sigma^2 comes from: ``"grief"`` (default), the maximiser of this model's
            evidence at the initial theta over all training rows; ``"exact"``, the exact GP's, as the paper.
        init_stretch: factors applied to the exact GP's lengthscales to give the starts of a multi-start type-II
            fit on the exact GP's rows (:func:`~gpscale.models.grief.init.stretched_starts`); the start with the
            largest GRIEF evidence there initialises training. Default ``(1, 2, 4, 8, 16)``; ``(1,)`` is the
            paper's single start. Only with the exact-GP initialisation (``init_exact_points > 0``), and skipped
            where the top p eigenfunctions at the exact GP's theta drop less prior variance than a tenth of its
            sigma^2 (:data:`~gpscale.models.grief.init.NEGLIGIBLE_DROP`): the rank-p evidence is then the exact
            GP's, whose theta the starts do not improve on (e.g. p = 1,000 on a few inputs).
        jitter: added to each 1-D grid factor K^(i) (default 1e-12, the official code's).
        kernel: only ``'rbf'`` (the value :class:`~gpscale.GPRegressor` passes every method) or an
            :class:`~gpscale.kernels.RBF`: the grid algebra needs a product of 1-D squared exponentials. ``ard``
            (default True) gives one lengthscale per dimension; the outputscale is s_f^2, applied once.
        **kwargs: ``lengthscale``, ``outputscale``, ``ard``, ``noise``, ``learn_noise``, ``noise_floor`` and
            ``chunk_size`` of :class:`GPModel`, whose default here is 2,048 rows: a chunk of p = 1,000 float64
            features then stays below glibc's largest threshold for mapping an allocation afresh, so its
            temporaries reuse memory already mapped instead of each faulting in new pages, as they do at the
            engine's larger default.
    """

    residual_evidence = True
    held_features_advice = "Use fewer eigenfunctions (n_eigen=...) or fewer rows."
    default_training = TrainingDefaults("lbfgs", lr=0.1, max_steps=100)  # a step is dear (p = 1,000); the paper's 100
    # without the exact-GP initialisation, which is not part of a step
    floor_sizes = {"small": BenchSize(500, 2, {"init_exact_points": 0}),
                   "paper": BenchSize(2000, 6, {"init_exact_points": 0})}

    def __init__(self, n_features: int, n_eigen: int | None = None, grid_size: int = 10,
                 init_exact_points: int = 500, init_iterations: int = 100, jitter: float = 1e-12, *,
                 init_noise: str = "grief", init_stretch: tuple[float, ...] = INIT_STRETCH,
                 kernel: str | Kernel | None = "rbf", chunk_size: int = 2048, **kwargs):
        _check_options(n_eigen=n_eigen, grid_size=grid_size, init_exact_points=init_exact_points,
                       init_iterations=init_iterations, jitter=jitter, init_noise=init_noise,
                       init_stretch=init_stretch, kernel=kernel)
        super().__init__(n_features, kernel="rbf" if kernel is None else kernel, chunk_size=chunk_size, **kwargs)
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
        self._layout = self._read_layout()

    # --- initialisation -----------------------------------------------------------------------------------
    def initialise_from_data(self, X: Tensor, y: Tensor, seed: int = 0) -> None:
        """Build the grid from the training inputs X [n, d] (never from test inputs, which would move the features
        of the trained model), resolve p and, if ``init_exact_points``, initialise the hyperparameters from an exact
        GP on a random subset (:func:`~gpscale.models.grief.init.initialise_from_exact_gp`)."""
        grid, sizes = pad_grids(grid_points(X.detach(), self.grid_size), self.grid_size)
        with torch.no_grad():
            self.grid.copy_(grid)
            self.grid_sizes.copy_(torch.tensor(sizes))
            self.n_eigen_.fill_(self.n_eigen if self.n_eigen is not None else paper_n_eigen(X.shape[0]))
        self._layout = self._read_layout()
        if self.init_exact_points > 0:
            initialise_from_exact_gp(self, X, y, seed)

    def solver_for(self, X: Tensor, posterior: bool) -> str:
        """Cholesky of ``I + Phi^T Phi / sigma^2`` always: the features are float64 whatever the data, and the
        training objective is in residual form."""
        return "cholesky"

    def _read_layout(self) -> tuple[tuple[int, ...], int]:
        """(mbar_i for each dimension, p) as Python numbers, read from their buffers when these change (at init and
        on loading), not in every pass: on a GPU each read would wait for the device."""
        return tuple(self.grid_sizes.tolist()), int(self.n_eigen_)

    def feature_width(self, X: Tensor) -> int:
        return self._layout[1]

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._layout = self._read_layout()

    # --- the features -------------------------------------------------------------------------------------
    def padded_grid(self) -> tuple[Tensor, tuple[int, ...]]:
        """The d 1-D grids padded into one [d, grid_size] tensor (float64; row i holds xg[i] in its first mbar_i
        entries) and the sizes mbar_i."""
        sizes, _ = self._layout
        if not all(size > 0 for size in sizes):
            raise RuntimeError("The grief model has no grid yet: train it with gpscale.train.fit, or call "
                               "initialise_from_data(X, y) with the training data first.")
        return self.grid.to(CORE), sizes

    def grids(self) -> list[Tensor]:
        """The d 1-D grids xg[i] [mbar_i] (float64)."""
        grid, sizes = self.padded_grid()
        return [row[:size] for row, size in zip(grid, sizes)]

    def hyperparameters(self) -> tuple[Tensor, Tensor]:
        """Lengthscales [d] or [1] and s_f^2 [] (float64, differentiable)."""
        return self.kernel.lengthscale.to(CORE), self.kernel.outputscale.to(CORE)

    def spectrum(self) -> GridSpectrum:
        """Eigendecompose the d grid factors and select the top p eigenpairs, differentiably."""
        lengthscale, outputscale = self.hyperparameters()
        grid, sizes = self.padded_grid()
        K = grid_factors(grid, sizes, lengthscale, outputscale, self.jitter)
        lam, Q = factor_eigh(K, sizes)
        logl, idxs = top_eigenvalues(lam, sizes, self._layout[1])
        return GridSpectrum(Q=Q, idxs=idxs, logl=logl)

    def feature_state(self) -> dict[str, Tensor]:
        """The top-p eigenpairs at the current hyperparameters as the cache holds them: the d factors Q^(i)
        zero-padded into one [d, mbar, mbar] tensor (so that a saved model loads into a fresh one), the selected
        Kronecker indices [p, d] and their log-eigenvalues [p]; differentiable. The posterior is tied to these
        eigenvectors, signs included."""
        spectrum = self.spectrum()
        return {"Q": spectrum.Q, "idxs": spectrum.idxs, "logl": spectrum.logl}

    def feature_map(self, state: dict[str, Tensor]) -> Features:
        """``x -> phi(x)``: X [c, d] -> Phi [c, p] (float64) for the eigenpairs of ``state`` (steps 4-5)."""
        grid, sizes = self.padded_grid()
        lengthscale, outputscale = self.hyperparameters()

        def phi(X: Tensor) -> Tensor:
            Kxu = cross_factors(X.to(CORE), grid, sizes, lengthscale, outputscale)
            return grief_features(Kxu, state["Q"], state["idxs"], state["logl"])

        return Features(phi)

    @torch.no_grad()
    def preconditioner(self, X: Tensor) -> Callable[[Tensor], Tensor]:
        """``v -> (Phi Phi^T + sigma^2 I)^{-1} v`` [n] at the current hyperparameters: the paper's preconditioner
        (its Section 4.1) for conjugate gradients on an exact GP's ``K_XX + sigma^2 I`` (pass it to
        :func:`gpscale.linalg.conjugate_gradients`). With m >> n grid points the Nyström eigenfunctions are
        accurate (the paper's Theorem 1), so the preconditioned system's spectrum clusters near 1. By Woodbury,

            (Phi Phi^T + sigma^2 I)^{-1} v = (v - Phi B^{-1} Phi^T v / sigma^2) / sigma^2,
            B = I + Phi^T Phi / sigma^2,

        O(n p^2 + p^3) once, then O(n p) per vector (v [n] or [n, k]); Phi [n, p] is held in memory, so it suits
        the moderate n where an exact K_XX is affordable."""
        Phi, s2 = self.phi(X), self.noise.to(CORE)
        L_B = cholesky(torch.eye(Phi.shape[1], dtype=CORE, device=Phi.device) + gram(Phi) / s2, what="I + A / sigma^2")

        def solve(v: Tensor) -> Tensor:
            V = v.to(CORE).reshape(v.shape[0], -1)  # [n, k]
            inner = torch.cholesky_solve(Phi.T @ V, L_B)  # B^{-1} Phi^T V [p, k]
            return ((V - Phi @ inner / s2) / s2).reshape(v.shape).to(v.dtype)

        return solve


def _check_options(*, n_eigen, grid_size, init_exact_points, init_iterations, jitter, init_noise, init_stretch,
                   kernel) -> None:
    check_options({"n_eigen": n_eigen, "grid_size": grid_size, "init_exact_points": init_exact_points,
                   "init_iterations": init_iterations, "jitter": jitter})
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

"""The GP-GRIEF paper's kernel-reconstruction figure (Evans & Nair 2018, Fig. 2), redrawn with gpscale's grid
eigenfunctions.

Data: 5000 points x ~ U(-sqrt 3, sqrt 3)^100 (unit variance per dimension), split at random into 2500 training and
2500 test points. Kernel: the unit-variance SE kernel ``k(x, z) = exp(-|x - z|^2 / (2 l^2))``. The paper does not
give l; the default l = sqrt(d) is an assumption (with l = 1 in d = 100 the kernel matrix is essentially the identity,
which no rank-p method can approximate). From the training inputs only, each method builds a rank-p factor L [5000, p]
of the kernel on all 5000 points, ``K~ = L L^T``, and the figure reports the relative Frobenius error (the paper does
not name its metric)

    (a) ||K_tt - K~_tt||_F / ||K_tt||_F  on the training block [2500, 2500],
    (b) ||K - K~||_F / ||K||_F           on the joint train/test matrix [5000, 5000],

against p, averaged over repeats (fresh points, features and samples each time). Methods:

- ``grief``: the GRIEF Nyström features ``Phi = K_XU Q S_p^T Lambda_p^{-1/2}`` on a grid of mbar = 100 points per
  dimension spanning the training inputs (m = 100^100 = 10^200 inducing points), via Algorithm 1 and Theorem 2
  (:mod:`gpscale.kernels.grid`);
- ``rff``: random Fourier features (Rahimi & Recht 2007), ``sqrt(2 / p) cos(omega^T x + b)`` with
  ``omega ~ N(0, I / l^2)`` and ``b ~ U(0, 2 pi)``: p features, rank p;
- ``nystrom``: randomised Nyström with p inducing points drawn uniformly without replacement from the training set,
  ``K_XZ K_ZZ^+ K_ZX``;
- ``optimal``: the best rank-p approximation of the target matrix itself (Eckart-Young, from its exact eigenvalues),
  a lower bound for every method.

Files written: ``grief_fig2_reconstruction.png`` (panels (a) and (b), mean +- std over repeats) and
``grief_fig2_reconstruction.json`` (settings, every error of every repeat, means, stds and seconds).
``python -m experiments.figures grief --out docs/figures`` draws it with the paper's settings; smaller ones are options.
"""
from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from gpscale.kernels import grid as grids

from . import plotting

__all__ = ["METHODS", "P_LIST", "figure2", "grief_factor", "nystrom_factor", "optimal_errors", "rff_factor",
           "relative_errors", "sample_inputs", "se_kernel"]

D, N, GRID_SIZE, REPEATS = 100, 5000, 100, 10
P_LIST = (10, 20, 50, 100, 200, 500, 1000)
METHODS = ("grief", "rff", "nystrom", "optimal")
LABELS = {"grief": "GRIEF (mbar = {grid_size}, m = {grid_size}^{d})", "rff": "random Fourier features",
          "nystrom": "randomised Nyström", "optimal": "optimal rank p"}
STYLES = {"grief": dict(color="tab:blue", marker="o"), "rff": dict(color="tab:orange", marker="s"),
          "nystrom": dict(color="tab:green", marker="^"), "optimal": dict(color="black", marker="")}
FILE_STEM = "grief_fig2_reconstruction"
DTYPE = torch.float64


# --- data and kernel ------------------------------------------------------------------------------------------------
def sample_inputs(n: int, d: int, generator: torch.Generator) -> Tensor:
    """x ~ U(-sqrt 3, sqrt 3)^d, unit variance per dimension: [n, d] float64."""
    return (2 * torch.rand(n, d, generator=generator, dtype=DTYPE) - 1) * math.sqrt(3)


def se_kernel(A: Tensor, B: Tensor, lengthscale: float) -> Tensor:
    """``exp(-|a - b|^2 / (2 l^2))`` [na, nb] for A [na, d], B [nb, d]."""
    return torch.exp(-0.5 * torch.cdist(A / lengthscale, B / lengthscale).square())


# --- rank-p factors: K~ = L L^T, L [n_all, p] -----------------------------------------------------------------------
def grief_factor(X_train: Tensor, X_all: Tensor, p: int, grid_size: int, lengthscale: float) -> Tensor:
    """GRIEF features Phi [n_all, p'] (p' = min(p, m)), columns ordered by eigenvalue, so that the first k columns
    are the features of p = k: a grid of ``grid_size`` points per dimension spanning X_train [n, d], the top p
    eigenpairs of K_UU by Algorithm 1 and Phi by Theorem 2, never forming anything of size m."""
    grid, sizes = grids.pad_grids(grids.grid_points(X_train, grid_size))
    ls, scale = torch.tensor([lengthscale], dtype=DTYPE), torch.tensor(1.0, dtype=DTYPE)
    lam, Q = grids.factor_eigh(grids.grid_factors(grid, sizes, ls, scale), sizes)
    logl, idxs = grids.top_eigenvalues(lam, sizes, p)
    return grids.grief_features(grids.cross_factors(X_all, grid, sizes, ls, scale), Q, idxs, logl)


def rff_factor(X_all: Tensor, p: int, lengthscale: float, generator: torch.Generator) -> Tensor:
    """Random Fourier features ``sqrt(2 / p) cos(X omega + b)`` [n_all, p] of the SE kernel (Rahimi & Recht)."""
    omega = torch.randn(X_all.shape[1], p, generator=generator, dtype=DTYPE) / lengthscale
    b = 2 * math.pi * torch.rand(p, generator=generator, dtype=DTYPE)
    return math.sqrt(2 / p) * torch.cos(X_all @ omega + b)


def nystrom_factor(Z: Tensor, X_all: Tensor, lengthscale: float, rcond: float = 1e-12) -> Tensor:
    """Nyström factor ``K_XZ V Lambda^{-1/2}`` [n_all, k] with ``K_ZZ = V Lambda V^T`` for inducing points
    Z [p, d]; eigenvalues below rcond * max are dropped (a pseudo-inverse, k <= p), so ``L L^T = K_XZ K_ZZ^+ K_ZX``."""
    lam, V = torch.linalg.eigh(se_kernel(Z, Z, lengthscale))
    keep = lam > rcond * lam.max()
    return se_kernel(X_all, Z, lengthscale) @ (V[:, keep] / lam[keep].sqrt())


# --- errors ---------------------------------------------------------------------------------------------------------
def relative_errors(K: Tensor, L: Tensor, n_train: int) -> tuple[float, float]:
    """Relative Frobenius errors of ``L L^T`` [n_all, n_all] against K on (a) the training block (the first
    n_train rows and columns) and (b) the whole matrix."""
    residual = torch.addmm(K, L, L.T, alpha=-1)
    train = residual[:n_train, :n_train].norm() / K[:n_train, :n_train].norm()
    return train.item(), (residual.norm() / K.norm()).item()


def optimal_errors(K: Tensor, ps: tuple[int, ...]) -> list[float]:
    """The relative Frobenius error of the best rank-p approximation of the PSD matrix K, for each p in ps:
    ``sqrt(sum_{i > p} lambda_i^2 / sum_i lambda_i^2)`` (Eckart-Young) from its eigenvalues, largest first."""
    squares = torch.linalg.eigvalsh(K).flip(0).square()
    tail = squares.sum() - torch.cumsum(squares, 0)  # tail[k - 1] = sum_{i > k} lambda_i^2
    return [math.sqrt(max(tail[p - 1].item(), 0.0) / squares.sum().item()) for p in ps]


def _one_repeat(repeat: int, *, n: int, d: int, ps: tuple[int, ...], grid_size: int, lengthscale: float,
                seed: int) -> dict[str, dict[str, list[float]]]:
    """Errors {target: {method: [error per p]}} of one draw of the points, features and inducing points."""
    generator = torch.Generator().manual_seed(seed * 100_003 + repeat)
    X = sample_inputs(n, d, generator)
    n_train = n // 2  # a random half: the points are exchangeable, so the first half is a random split
    K = se_kernel(X, X, lengthscale)
    errors = {"train": {}, "joint": {}}
    Phi = grief_factor(X[:n_train], X, max(ps), grid_size, lengthscale)
    inducing = torch.randperm(n_train, generator=generator)
    factors = {
        "grief": lambda p: Phi[:, :p],  # the top p of the top max(ps) eigenpairs
        "rff": lambda p: rff_factor(X, p, lengthscale, generator),
        "nystrom": lambda p: nystrom_factor(X[inducing[:p]], X, lengthscale),
    }
    for method, factor in factors.items():
        pairs = [relative_errors(K, factor(p), n_train) for p in ps]
        errors["train"][method], errors["joint"][method] = map(list, zip(*pairs))
    errors["train"]["optimal"] = optimal_errors(K[:n_train, :n_train], ps)
    errors["joint"]["optimal"] = optimal_errors(K, ps)
    return errors


# --- the figure -----------------------------------------------------------------------------------------------------
def figure2(out_dir: str | Path, *, n: int = N, d: int = D, repeats: int = REPEATS, ps: tuple[int, ...] = P_LIST,
            grid_size: int = GRID_SIZE, lengthscale: float | None = None, seed: int = 0,
            log: Callable[[str], None] = print) -> dict:
    """Run the reconstruction study, draw ``grief_fig2_reconstruction.png`` and write
    ``grief_fig2_reconstruction.json`` (returned as a dict) in ``out_dir``.

    Args:
        n: points in all, split half and half into training and test points (the paper's 5000).
        d: input dimension (100). repeats: independent draws averaged (10).
        ps: numbers of basis functions p, each at most n / 2 (Nyström draws p training points).
        grid_size: GRIEF's mbar (100). lengthscale: the SE kernel's, default sqrt(d) (an assumption).
        seed: seeds every draw (repeat r uses its own generator).
    """
    ps = tuple(sorted(set(int(p) for p in ps)))
    lengthscale = math.sqrt(d) if lengthscale is None else float(lengthscale)
    _check(n=n, d=d, repeats=repeats, ps=ps, grid_size=grid_size, lengthscale=lengthscale)
    out = plotting.out_dir(out_dir)
    runs, tic = [], time.perf_counter()
    for repeat in range(repeats):
        start = time.perf_counter()
        runs.append(_one_repeat(repeat, n=n, d=d, ps=ps, grid_size=grid_size, lengthscale=lengthscale, seed=seed))
        log(f"fig2 repeat {repeat + 1}/{repeats}: {time.perf_counter() - start:.1f} s; joint error at p = {ps[-1]}: "
            + ", ".join(f"{m} {runs[-1]['joint'][m][-1]:.4f}" for m in METHODS))
    result = {
        "settings": {"n": n, "n_train": n // 2, "d": d, "repeats": repeats, "p": list(ps), "grid_size": grid_size,
                     "lengthscale": lengthscale, "lengthscale_is_assumed": True, "seed": seed,
                     "metric": "relative Frobenius error ||K - K~||_F / ||K||_F"},
        "errors": {target: {method: _summary([run[target][method] for run in runs]) for method in METHODS}
                   for target in ("train", "joint")},
        "seconds": time.perf_counter() - tic,
    }
    _plot(result, out / f"{FILE_STEM}.png")
    (out / f"{FILE_STEM}.json").write_text(json.dumps(result, indent=1))
    return result


def _summary(values: list[list[float]]) -> dict[str, list]:
    """Mean and std (population, over repeats) per p, and every repeat's errors [repeats][p]."""
    array = np.array(values)
    return {"mean": array.mean(0).tolist(), "std": array.std(0).tolist(), "repeats": values}


def _check(*, n, d, repeats, ps, grid_size, lengthscale) -> None:
    if n < 4 or d < 1 or repeats < 1 or grid_size < 2:
        raise ValueError(f"Expected n >= 4, d >= 1, repeats >= 1 and grid_size >= 2. Got n={n}, d={d}, "
                         f"repeats={repeats}, grid_size={grid_size}.")
    if not ps or ps[0] < 1 or ps[-1] > n // 2:
        raise ValueError(f"Expected every p in 1..n/2 = {n // 2} (Nyström draws p of the training points). "
                         f"Got {list(ps)}.")
    if not lengthscale > 0:
        raise ValueError(f"Expected a positive lengthscale. Got {lengthscale!r}.")


def _plot(result: dict, path: Path) -> None:
    plt = plotting.pyplot()
    settings, ps = result["settings"], result["settings"]["p"]
    titles = {"train": f"(a) training covariance ({settings['n_train']} points)",
              "joint": f"(b) joint train/test covariance ({settings['n']} points)"}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, target in zip(axes, ("train", "joint")):
        for method in METHODS:
            summary = result["errors"][target][method]
            mean, std = np.array(summary["mean"]), np.array(summary["std"])
            ax.plot(ps, mean, label=LABELS[method].format(**settings), lw=1.5, ms=4, **STYLES[method])
            ax.fill_between(ps, np.maximum(mean - std, 1e-12), mean + std, color=STYLES[method]["color"], alpha=0.15)
        ax.set(xscale="log", yscale="log", xlabel="p (basis functions)", ylabel="relative Frobenius error",
               title=titles[target])
    axes[0].legend(fontsize=8)
    fig.suptitle(f"SE kernel, d = {settings['d']}, lengthscale {settings['lengthscale']:.3g} (assumed), "
                 f"mean over {settings['repeats']} repeats", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

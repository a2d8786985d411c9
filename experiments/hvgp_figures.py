"""The HVGP paper's figures (Sun, Shi, Wilson & Grosse 2021), redrawn with gpscale.

**Fig. 1, samples of the sub-processes** (:func:`samples_figure`): a 2-D RBF (one shared lengthscale, unit
variance) under the quarter turn ``G x = R x``, R = [[0, -1], [1, 0]] (P = 4, T = 3 real sub-kernels). On a
square grid symmetric about the origin (closed under G), one draw f ~ GP(0, k) is split into its real
sub-processes ``f_t(x) = sum_s W[t, s] f(G^s x)``: f_0 is invariant to quarter turns, f_1 changes sign
under half turns and f_2 under quarter turns, and f = f_0 + f_1 + f_2. The second row draws directly from each
sub-kernel's Gram matrix K_t (plus a small jitter, as K_t is singular on an orbit-closed grid), which works only
because each K_t is a valid covariance. Files: ``hvgp_samples.png``, ``hvgp_samples.json`` (the checks).

**Fig. 9, the 1-D toy** (:func:`toy_figure`): a Snelson-like set, 200 points of ``f(x) = sin(2x + 0.7) + 0.3 x``
at inputs uniform on [-3, 3] (centred, so x -> -x leaves their distribution invariant) with noise 0.2, fitted by
HVGP with ``group='negation'`` and 2 x 5 inducing points, and by SVGP with 5 and 10, all with an RBF and
full-batch Adam. The figure shows, as the paper, the prediction and its three parts: the Nyström residual
``k(x, x) - sum_t a_t^T a_t`` and each sub-GP ``mean_t = a_t^T m_t``, ``var_t = |S_t^T a_t|^2`` with
``a_t = L_t^{-1} k_t(Z_t, x)``; f_0 is the even part of f, ``sin(0.7) cos(2x)``, and f_1 the odd part,
``cos(0.7) sin(2x) + 0.3 x``. Files: ``hvgp_toy.png``, ``hvgp_toy.json`` (test RMSE and NLPD of the three models,
the sub-GPs' errors against the true parts, the checks).

**Fig. 6, the Nyström trace error** (:func:`nystrom_figure`): for n = 3000 inputs and a Matérn-3/2 with one
lengthscale, the median pairwise distance (fixed), the relative error ``tr(K - Q) / tr(K)`` with
``Q = sum_t K_tf K_t,uu^{-1} K_tu`` against M, for SVGP with M, 2M and 8M k-means inducing points and HVGP 8 x M
(3-way negation, every block starting from the same M k-means centres, as ``HVGP.initialise_from_data``) along the PCA directions
and along the raw axes. Inputs: correlated Gaussians in d = 6 with standard deviations 1 to 0.1 along a random
orthogonal basis, z-scored per column (so the principal axes are not the coordinate axes), and, when
``$GPSCALE_DATA`` holds it, 3000 training inputs of kin40k. Unlike the paper, Z is not optimised for the trace
(the official code does not either). Files: ``hvgp_nystrom.png``, ``hvgp_nystrom.json``.

``python -m experiments.figures hvgp-samples|hvgp-toy|hvgp-nystrom --out docs/figures`` draws them (see docs/hvgp.md).
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor

from gpscale.kernels import RBF, Matern, median_distance
from gpscale.kernels.harmonic import (
    GroupAction,
    OrthogonalAction,
    harmonic_kernels,
    pca_directions,
    subspace_negations,
)
from gpscale.linalg import cholesky, solve_lower
from gpscale.models.harmonic.hvgp import HVGP
from gpscale.models.variational.svgp import SVGP
from gpscale.train import fit

from .plotting import out_dir, pyplot

__all__ = ["SamplesSettings", "QUARTER_TURN", "symmetric_grid", "orbit_indices", "sub_processes", "samples_figure",
           "ToySettings", "toy_function", "toy_parts", "toy_data", "sub_gp_moments", "toy_figure",
           "NystromSettings", "rotated_gaussian", "relative_trace_error", "nystrom_figure"]

F64 = torch.float64
QUARTER_TURN = torch.tensor([[0.0, -1.0], [1.0, 0.0]], dtype=F64)


def _max_abs(A: Tensor) -> float:
    return A.abs().max().item()


# ---------------------------------------------------------------------------------------------------------------
# Fig. 1: samples of the sub-processes under quarter turns


@dataclass
class SamplesSettings:
    grid_size: int = 40  # points per side: n = 1600
    extent: float = 2.0  # the grid covers [-extent, extent]^2
    lengthscale: float = 0.5
    jitter: float = 1e-8  # added to each K_t before its Cholesky
    n_covariance_check: int = 400  # grid points on which Cov(f_t, f_t') is compared with K_t (or 0)
    seed: int = 0


def symmetric_grid(size: int, extent: float) -> Tensor:
    """The cell centres of a size x size grid on [-extent, extent]^2 [size^2, 2], row-major over (y, x). The
    coordinates are symmetric about 0, so the grid is closed under quarter turns and negations."""
    half = (torch.arange(size // 2, size, dtype=F64) + 0.5 - size / 2) * (2 * extent / size)  # >= 0
    c = torch.cat([-half.flip(0)[: size // 2], half])  # mirrored, so that -c is c reversed exactly
    gy, gx = torch.meshgrid(c, c, indexing="ij")
    return torch.stack([gx.reshape(-1), gy.reshape(-1)], dim=-1)


def orbit_indices(action: GroupAction, X: Tensor, atol: float = 1e-9) -> Tensor:
    """perm [S, n] with ``G^s X[i] = X[perm[s, i]]`` for X [n, d] closed under the group; ValueError if not."""
    orbit = action.orbit(X)  # [S, n, d]
    # the direct difference: the matrix-product form of cdist loses half the digits (errors of about 1e-8)
    distance = torch.cdist(orbit, X.expand(action.order, -1, -1), compute_mode="donot_use_mm_for_euclid_dist")
    distance, perm = distance.min(dim=-1)
    if distance.max() > atol:
        raise ValueError(f"The points are not closed under {action!r}: an image lies {distance.max():.2e} from "
                         "every point.")
    return perm


def sub_processes(f: Tensor, perm: Tensor, W: Tensor) -> Tensor:
    """``f_t(x_i) = sum_s W[t, s] f(G^s x_i)`` [T, n] from values f [n] on an orbit-closed set."""
    return torch.einsum("ts,sn->tn", W, f[perm])


def _equivariance_errors(f_t: Tensor, perm: Tensor) -> dict:
    """The three symmetries of Fig. 1 for the P = 4 sub-processes f_t [3, n]: perm[s] maps x to G^s x."""
    return {"f0_invariance": _max_abs(f_t[0, perm[1]] - f_t[0]),  # f_0(G x) = f_0(x)
            "f1_half_turn_sign": _max_abs(f_t[1, perm[2]] + f_t[1]),  # f_1(G^2 x) = -f_1(x)
            "f2_quarter_turn_sign": _max_abs(f_t[2, perm[1]] + f_t[2])}  # f_2(G x) = -f_2(x)


def _projection_covariance_errors(K: Tensor, perm: Tensor, W: Tensor, idx: Tensor, K_t: Tensor) -> dict:
    """Lemma D.3 on the points idx: ``Cov(f_t, f_t') = sum_{s,s'} W[t,s] W[t',s'] K[G^s x, G^s' x']`` equals K_t
    for t = t' and 0 otherwise. Only the invariance of k makes this hold."""
    T, S = W.shape
    rows = perm[:, idx]  # [S, c]: the images of the checked points
    cov = torch.zeros(T, T, len(idx), len(idx), dtype=K.dtype)
    for s in range(S):
        for s2 in range(S):
            cov += W[:, None, s, None, None] * W[None, :, s2, None, None] * K[rows[s]][:, rows[s2]]
    diagonal = torch.stack([cov[t, t] for t in range(T)])
    off = cov[~torch.eye(T, dtype=torch.bool)]
    return {"within": _max_abs(diagonal - K_t[:, idx][:, :, idx]), "across": _max_abs(off)}


def _draw(K: Tensor, jitter: float, g: torch.Generator) -> Tensor:
    """One draw N(0, K + jitter I) [n] (the Cholesky fails unless K is PSD to about -jitter)."""
    L = cholesky(K + jitter * torch.eye(K.shape[-1], dtype=K.dtype), max_tries=0, what="sub-kernel Gram matrix")
    return L @ torch.randn(K.shape[-1], generator=g, dtype=K.dtype)


@torch.no_grad()
def samples_figure(out: str | Path, settings: SamplesSettings | None = None) -> list[Path]:
    """Draw f and its sub-processes, and direct draws of each sub-kernel; write the figure and the checks."""
    s = settings or SamplesSettings()
    g = torch.Generator().manual_seed(s.seed)
    X = symmetric_grid(s.grid_size, s.extent)  # [n, 2]
    kernel = RBF(2, ard=False, lengthscale=s.lengthscale, outputscale=1.0).double()
    action = OrthogonalAction(QUARTER_TURN, 4)
    W = action.weights()  # [3, 4]
    perm = orbit_indices(action, X)  # [4, n]
    K = kernel(X, X)  # [n, n]
    K_raw = harmonic_kernels(kernel, action, X, X)  # [3, n, n]
    K_t = 0.5 * (K_raw + K_raw.mT)  # k_t is symmetric through the invariance of k, to round-off
    f = _draw(K, s.jitter, g)
    f_t = sub_processes(f, perm, W)  # [3, n]
    direct = torch.stack([_draw(K_t[t], s.jitter, g) for t in range(len(K_t))])  # [3, n]
    idx = torch.randperm(len(X), generator=g)[: s.n_covariance_check]
    eigenvalues = torch.linalg.eigvalsh(K_t)  # [3, n]
    checks = {
        "sum_of_sub_processes": _max_abs(f - f_t.sum(0)),
        **_equivariance_errors(f_t, perm),
        "projection_covariance": _projection_covariance_errors(K, perm, W, idx, K_t),
        "sum_of_sub_kernels": _max_abs(K_t.sum(0) - K),
        "sub_kernel_asymmetry": _max_abs(K_raw - K_raw.mT),
        "min_eigenvalue_over_max": (eigenvalues.min(-1).values / eigenvalues.max()).tolist(),
        # the ranks of the K_t add up to that of K: their RKHSs are orthogonal
        "rank_at_1e-10": (eigenvalues > 1e-10 * eigenvalues.max()).sum(-1).tolist(),
        "rank_of_K_at_1e-10": (torch.linalg.eigvalsh(K) > 1e-10 * eigenvalues.max()).sum().item(),
        "direct_draws": _equivariance_errors(direct, perm),
    }
    folder = out_dir(out)
    png, js = folder / "hvgp_samples.png", folder / "hvgp_samples.json"
    _plot_samples(png, s, torch.cat([f[None], f_t]), torch.cat([direct, direct.sum(0, keepdim=True)]))
    js.write_text(json.dumps({"settings": asdict(s), "n_points": len(X), "checks": checks}, indent=2))
    return [png, js]


def _plot_samples(png: Path, s: SamplesSettings, top: Tensor, bottom: Tensor) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(2, 4, figsize=(12, 6.8))
    titles = (["f ~ GP(0, k)", "f_0: invariant to 90°", "f_1: odd under 180°", "f_2: odd under 90°"],
              ["draw of GP(0, k_0)", "draw of GP(0, k_1)", "draw of GP(0, k_2)", "their sum: a draw of GP(0, k)"])
    box = [-s.extent, s.extent, -s.extent, s.extent]
    for row, (values, names) in enumerate(zip((top, bottom), titles)):
        for ax, v, name in zip(axes[row], values, names):
            scale = _max_abs(v)  # each panel its own: f_0 and f_2 are faint on f's scale, their symmetry hard to see
            image = v.reshape(s.grid_size, s.grid_size).numpy()
            ax.imshow(image, origin="lower", extent=box, cmap="RdBu_r", vmin=-scale, vmax=scale)
            ax.set_title(name, fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle(f"RBF (lengthscale {s.lengthscale}) under 90° rotations, P = 4. Top: one draw split into its real "
                 "sub-processes f_t = sum_s W[t, s] f(G^s x).\nBottom: direct draws from each sub-kernel's Gram "
                 f"matrix K_t + {s.jitter:g} I. Red positive, blue negative; each panel its own colour scale.",
                 fontsize=9)
    fig.tight_layout(h_pad=2.0)
    fig.savefig(png, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------------------
# Fig. 9: the 1-D toy, even and odd parts


@dataclass
class ToySettings:
    n_train: int = 200
    n_test: int = 500
    noise: float = 0.2  # standard deviation
    n_inducing: int = 5  # per sub-GP: HVGP 2 x 5, against SVGP 5 and 2 x 5
    epochs: int = 1000  # full-batch Adam steps
    lr: float = 0.05
    seed: int = 0


def toy_function(x: Tensor) -> Tensor:
    """``sin(2x + 0.7) + 0.3 x`` [n] at x [n]: neither even nor odd."""
    return torch.sin(2 * x + 0.7) + 0.3 * x


def toy_parts(x: Tensor) -> Tensor:
    """The even and the odd part of :func:`toy_function` [2, n]: ``sin(0.7) cos(2x)``, ``cos(0.7) sin(2x) + 0.3x``."""
    return torch.stack([math.sin(0.7) * torch.cos(2 * x), math.cos(0.7) * torch.sin(2 * x) + 0.3 * x])


def toy_data(n: int, noise: float, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """Inputs X [n, 1] uniform on [-3, 3], f [n] and y = f + noise [n] (float64)."""
    x = 6 * torch.rand(n, generator=generator, dtype=F64) - 3
    f = toy_function(x)
    return x[:, None], f, f + noise * torch.randn(n, generator=generator, dtype=F64)


@torch.no_grad()
def sub_gp_moments(model: HVGP, X: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Each block's part of a trained HVGP's q(f) at X [c, d]: the means ``a_t^T m_t`` [T, c], the variational
    variances ``|S_t^T a_t|^2`` [T, c], and the Nyström residual ``k(x, x) - sum_t a_t^T a_t`` [c] that belongs to
    no block; ``a_t = L_t^{-1} k_t(Z_t, x)``. Their sums are the model's mean and variance."""
    cache = model.cache
    A = solve_lower(cache["Lu"], model.features.Kuf(X))  # [T, m, c]
    mean = torch.einsum("tmc,tm->tc", A, cache["q_mu"])
    variance = ((cache["q_sqrt"].mT @ A) ** 2).sum(-2)
    residual = model.features.Kff_diag(X) - (A**2).sum((0, 1))
    return mean, variance, residual


def _toy_models(s: ToySettings) -> dict:
    kernel = dict(kernel="rbf", ard=False)
    m = s.n_inducing
    return {f"hvgp 2x{m}": HVGP(1, n_inducing=m, group="negation", **kernel),
            f"svgp {m}": SVGP(1, n_inducing=m, **kernel), f"svgp {2 * m}": SVGP(1, n_inducing=2 * m, **kernel)}


@torch.no_grad()
def _toy_scores(model, X: Tensor, y: Tensor, f: Tensor) -> dict:
    mean, var = model.predict(X)
    return {"rmse": ((mean - y) ** 2).mean().sqrt().item(), "rmse_f": ((mean - f) ** 2).mean().sqrt().item(),
            "nlpd": -model.likelihood.log_predictive_density(y, mean, var).mean().item()}


def toy_figure(out: str | Path, settings: ToySettings | None = None) -> list[Path]:
    """Fit HVGP 2 x m and SVGP m and 2m; score them on the test set; draw HVGP's prediction and its parts."""
    s = settings or ToySettings()
    g = torch.Generator().manual_seed(s.seed)
    X, _, y = toy_data(s.n_train, s.noise, g)
    X_test, f_test, y_test = toy_data(s.n_test, s.noise, g)
    results, models = {}, {}
    for name, model in _toy_models(s).items():
        model = model.double()
        tic = time.perf_counter()
        fit(model, X, y, epochs=s.epochs, batch_size=s.n_train, lr=s.lr, seed=s.seed, progress=False)
        results[name] = {**_toy_scores(model, X_test, y_test, f_test), "seconds": time.perf_counter() - tic,
                         "noise_variance": model.likelihood.noise.item(),
                         "lengthscale": model.kernel.lengthscale.item()}
        models[name] = model
    hvgp = models[f"hvgp 2x{s.n_inducing}"]
    half = torch.linspace(0, 3.5, 176, dtype=F64)
    x = torch.cat([-half.flip(0)[:-1], half])  # symmetric about 0, so that x -> -x is a flip
    with torch.no_grad():
        mean, var = hvgp.predict(x[:, None])
        part_mean, part_var, residual = sub_gp_moments(hvgp, x[:, None])
    truth = toy_parts(x)
    inside = x.abs() <= 3  # the data's range
    checks = {"sum_of_sub_gp_means": _max_abs(part_mean.sum(0) - mean),
              "sum_of_variances": _max_abs(part_var.sum(0) + residual.clamp_min(0) - var),
              "f0_even": _max_abs(part_mean[0] - part_mean[0].flip(0)),
              "f1_odd": _max_abs(part_mean[1] + part_mean[1].flip(0))}
    parts = {"even_part_rmse": ((part_mean[0] - truth[0])[inside] ** 2).mean().sqrt().item(),
             "odd_part_rmse": ((part_mean[1] - truth[1])[inside] ** 2).mean().sqrt().item()}
    folder = out_dir(out)
    png, js = folder / "hvgp_toy.png", folder / "hvgp_toy.json"
    _plot_toy(png, s, (X, y), x, (mean, var + hvgp.likelihood.noise.item()), (part_mean, part_var, residual),
              truth, hvgp.features.Z.detach()[..., 0], results)
    js.write_text(json.dumps({"settings": asdict(s), "results": results, "hvgp_parts": parts, "checks": checks},
                             indent=2))
    return [png, js]


def _plot_toy(png, s, data, x, predictive, parts, truth, Z, results) -> None:
    """Four panels as the paper's Fig. 9: the prediction of y, the Nyström residual, f_0 and f_1 (95% bands)."""
    plt = pyplot()
    (X, y), (mean, var), (part_mean, part_var, residual) = data, predictive, parts
    xs = x.numpy()
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.6), sharey=True)
    name = f"hvgp 2x{s.n_inducing}"
    bands = [(mean, var, f"{name}: y, RMSE {results[name]['rmse']:.3f}, NLPD {results[name]['nlpd']:.3f}"),
             (torch.zeros_like(residual), residual.clamp_min(0), "Nyström residual k - sum_t a_t^T a_t"),
             (part_mean[0], part_var[0], "sub-GP t = 0 (even part)"),
             (part_mean[1], part_var[1], "sub-GP t = 1 (odd part)")]
    for ax, (centre, variance, title) in zip(axes, bands):
        half_width = 1.96 * variance.sqrt()
        ax.plot(xs, centre.numpy(), c="tab:blue")
        ax.fill_between(xs, (centre - half_width).numpy(), (centre + half_width).numpy(), color="tab:blue",
                        alpha=0.2)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("x")
    axes[0].scatter(X[:, 0], y, s=4, c="0.5")
    axes[0].plot(xs, toy_function(x).numpy(), "k--", lw=1, label="f")
    axes[0].legend(fontsize=8)
    for t, ax in enumerate(axes[2:]):
        ax.plot(xs, truth[t].numpy(), "k--", lw=1, label="true part")
        low = y.min().item() - 0.3  # below the data
        ax.plot(Z[t].numpy(), [low] * Z.shape[1], "k^", ms=7, label="Z_t")
        ax.plot(-Z[t].numpy(), [low] * Z.shape[1], "k^", ms=7, mfc="none", label="-Z_t (orbit)")
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"HVGP with x -> -x, {s.n_inducing} inducing inputs per sub-GP (n = {s.n_train}, noise "
                 f"{s.noise}); bands: 95%", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------------------
# Fig. 6: the Nyström trace error


@dataclass
class NystromSettings:
    n: int = 3000
    d: int = 6  # of the synthetic inputs
    inducing: tuple[int, ...] = (8, 16, 32, 64, 128)  # M
    n_ways: int = 3  # HVGP: 2^3 = 8 blocks of M
    datasets: tuple[str, ...] = ("synthetic", "kin40k")  # kin40k only where $GPSCALE_DATA holds it
    jitter: float = 1e-6
    seed: int = 0


def rotated_gaussian(n: int, d: int, generator: torch.Generator) -> Tensor:
    """Correlated Gaussian inputs [n, d]: standard deviations 1 to 0.1 (geometric) along the columns of a random
    orthogonal matrix, then z-scored per column. Their distribution is invariant to negations along its principal
    directions, not along the coordinate axes."""
    Q = torch.linalg.qr(torch.randn(d, d, generator=generator, dtype=F64)).Q
    scales = 0.1 ** (torch.arange(d, dtype=F64) / max(d - 1, 1))
    X = (torch.randn(n, d, generator=generator, dtype=F64) * scales) @ Q.T
    return (X - X.mean(0)) / X.std(0)


@torch.no_grad()
def relative_trace_error(Kuu: Tensor, Kuf: Tensor, Kff_diag: Tensor, jitter: float) -> float:
    """``tr(K - Q) / tr(K)``, ``Q = sum_t K_tf K_t,uu^{-1} K_tu``, from Kuu [T, m, m], Kuf [T, m, n] and the
    diagonal of K [n] (tr Q is the squared norm of every block's ``L_t^{-1} K_t,uf``)."""
    eye = torch.eye(Kuu.shape[-1], dtype=Kuu.dtype)
    A = solve_lower(cholesky(Kuu + jitter * eye, what="Kuu"), Kuf)  # [T, m, n]
    return ((Kff_diag.sum() - (A**2).sum()) / Kff_diag.sum()).item()


def _inputs(name: str, s: NystromSettings, generator: torch.Generator) -> Tensor | None:
    """n inputs [n, d] of the set ``name``, or None where its file is not available."""
    if name == "synthetic":
        return rotated_gaussian(s.n, s.d, generator)
    from gpscale.data import load_dataset

    try:
        X = torch.as_tensor(load_dataset(name, seed=s.seed).X_train, dtype=F64)  # z-scored columns
    except FileNotFoundError:
        return None
    return X[torch.randperm(len(X), generator=generator)[: s.n]]


def _groups(X: Tensor, n_ways: int) -> dict[str, GroupAction]:
    """J-way negations along the PCA directions of X [n, d] (on x, the group that ``group='pca_negation'`` applies
    as coordinate negations of B^T x) and along the coordinate axes."""
    return {"PCA negation": subspace_negations(pca_directions(X), n_ways),
            "axis negation": subspace_negations(torch.eye(X.shape[1], dtype=F64), n_ways)}


def _covariance_change(X: Tensor, action: GroupAction) -> float:
    """``max_s ||cov(G^s X) - cov(X)||_F / ||cov(X)||_F``: zero where the group leaves the inputs' second moments
    alone, as Thm 4.2 (an invariant input distribution) requires."""
    C = torch.cov(X.T)
    return max(torch.linalg.norm(torch.cov(GX.T) - C).item() for GX in action.orbit(X)) / torch.linalg.norm(C).item()


def _method_errors(X: Tensor, kernel, M: int, s: NystromSettings) -> dict:
    """The relative trace error of each method with M [float], from the models' own initialisation (k-means; every
    HVGP block starts from the same M centres)."""
    d, y, T = X.shape[1], torch.zeros(len(X), dtype=F64), 2**s.n_ways
    models = {"svgp M": SVGP(d, n_inducing=M, kernel=kernel), "svgp 2M": SVGP(d, n_inducing=2 * M, kernel=kernel),
              f"svgp {T}M": SVGP(d, n_inducing=T * M, kernel=kernel)}
    models[f"hvgp {T}xM, PCA negation"] = HVGP(d, n_inducing=M, group="pca_negation", n_ways=s.n_ways, kernel=kernel)
    models[f"hvgp {T}xM, axis negation"] = HVGP(d, n_inducing=M, group=_groups(X, s.n_ways)["axis negation"],
                                                kernel=kernel)
    errors = {}
    for name, model in models.items():
        model = model.double()
        model.initialise_from_data(X, y, seed=s.seed)
        Kuu, Kuf = model.features.Kuu(), model.features.Kuf(X)  # SVGP: [m, m], [m, n]; HVGP: [T, m, m], [T, m, n]
        errors[name] = relative_trace_error(Kuu.reshape(-1, *Kuu.shape[-2:]), Kuf.reshape(-1, *Kuf.shape[-2:]),
                                            model.features.Kff_diag(X), s.jitter)
    return errors


def nystrom_figure(out: str | Path, settings: NystromSettings | None = None) -> list[Path]:
    """The trace error of every method against M on every available set; the figure and the numbers."""
    s = settings or NystromSettings()
    g = torch.Generator().manual_seed(s.seed)
    results, skipped = {}, []
    for name in s.datasets:
        X = _inputs(name, s, g)
        if X is None:
            skipped.append(name)
            continue
        lengthscale = median_distance(X, max_rows=len(X))
        kernel = Matern(X.shape[1], nu=1.5, ard=False, lengthscale=lengthscale, outputscale=1.0)
        tic = time.perf_counter()
        per_m = [_method_errors(X, kernel, M, s) for M in s.inducing]
        results[name] = {"n": len(X), "d": X.shape[1], "lengthscale": lengthscale, "M": list(s.inducing),
                         "relative_trace_error": {k: [e[k] for e in per_m] for k in per_m[0]},
                         "covariance_change": {k: _covariance_change(X, a) for k, a in _groups(X, s.n_ways).items()},
                         "seconds": time.perf_counter() - tic}
    folder = out_dir(out)
    png, js = folder / "hvgp_nystrom.png", folder / "hvgp_nystrom.json"
    _plot_nystrom(png, s, results)
    js.write_text(json.dumps({"settings": asdict(s), "results": results, "skipped (no data file)": skipped},
                             indent=2))
    return [png, js]


STYLES = [dict(c="tab:orange", marker="s"), dict(c="tab:red", marker="s"), dict(c="0.4", marker="s", ls=":"),
          dict(c="tab:blue", marker="o"), dict(c="tab:green", marker="o", ls="--")]  # in the order of _method_errors


def _plot_nystrom(png: Path, s: NystromSettings, results: dict) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, max(len(results), 1), figsize=(5.5 * max(len(results), 1), 4.2), squeeze=False)
    for ax, (name, r) in zip(axes[0], results.items()):
        for (method, errors), style in zip(r["relative_trace_error"].items(), STYLES):
            ax.plot(r["M"], errors, label=method, **style)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("M")
        ax.set_ylabel("tr(K - Q) / tr(K)")
        ax.set_title(f"{name} (n = {r['n']}, d = {r['d']}), Matérn-3/2, l = {r['lengthscale']:.2f}", fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)

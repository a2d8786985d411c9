"""The Deep Basis Kernel paper's 1-D synthetic figures (Zhu, Yuchi & Xie 2025, v1, Figs. 1 and 3), redrawn with
gpscale's models.

Data: x ~ U[-1, 1], y = f_gt(x) + N(0, 0.01), with the paper's smoothed step function f_gt (:func:`step_function`);
targets are z-scored with training statistics, so the models' zero prior mean fits, and metrics are on that scale
(as the paper's UCI numbers). Models, trained full batch with Adam as the paper's recipe is for synthetic data (10,000
iterations, lr 1e-3, noise variance starting at 1e-2 with floor 1e-6):

- ``gp``: the exact GP with an RBF kernel, lengthscale starting at sqrt(d) = 1 (the paper's baseline init);
- ``dbk-c``: exact DBK without the variance correction, r = 128 bases from a 2-layer tanh MLP of width 128;
- ``dbk``: the same with the correction (the default).

The paper's DKL panels are not drawn: gpscale has no DKL model.

Files written (names say which figure of the paper they redraw):

- ``dbk_fig1_posterior_kernel.png``: Fig. 1, one row per model: data, f_gt, predictive mean and 95% interval of y
  (left) and the learned kernel k(x1, x2) on a grid (right);
- ``dbk_fig1_bases.png``: why DBK-c is overconfident: the spectrum of the learned bases on the training inputs
  (the collapse toward one basis of Theorem 1) and the leading principal basis functions;
- ``dbk_fig1_summary.json``: per model, the learned noise variance (z-scored and original units), test MAE / RMSE /
  NLPD / 95% coverage on 1,000 fresh points, and for DBK the spectrum of its bases (effective rank, top share);
- ``dbk_fig3_scaling.png``: Fig. 3, test MAE, RMSE, NLPD and training time against n, mean +- std over seeds;
- ``dbk_fig3_scaling.json``: every run behind it.

``python -m experiments.figures dbk --out docs/figures`` draws both with the paper's settings; smaller ones are options
(:func:`figure1`, :func:`figure3`).
"""
from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from gpscale import metrics
from gpscale.models import get_model_class
from gpscale.models.base import GPModel
from gpscale.train import fit

from . import plotting

__all__ = ["MODELS", "Training", "build_model", "figure1", "figure3", "held_out_scores", "make_figures",
           "make_step_data", "principal_directions", "spectrum_summary", "step_function", "train_model"]

NOISE_STD = 0.1  # the paper's noise variance 0.01
MODELS = ("gp", "dbk-c", "dbk")
LABELS = {"gp": "GP (RBF)", "dbk-c": "DBK-c (no correction)", "dbk": "DBK (variance correction)"}
COLOURS = {"gp": "tab:green", "dbk-c": "tab:red", "dbk": "tab:blue"}
FIG1_N = 1_000  # not given by the paper; Fig. 1-style demos work at n = 500-2,000
FIG3_SIZES = (100, 1_000, 10_000, 100_000)  # the paper's range 10^2-10^5 by decades
FIG3_SEEDS = 10
FIG3_EXACT_MAX_N = 10_000  # the paper's exact GP ran out of memory beyond
N_TEST = 1_000


@dataclass(frozen=True)
class Training:
    """How every model is trained (synthetic data): ``iterations`` full-batch Adam steps at ``lr``;
    DBK with ``n_basis`` bases from a 2-layer tanh MLP of ``width`` units (divided by sqrt(r) with
    ``scale_basis``, not the paper's). ``dtype`` is that of the data, the networks and the GP (DBK's r x r algebra
    is float64 whatever it is)."""

    iterations: int = 10_000
    lr: float = 1e-3
    n_basis: int = 128
    width: int = 128
    scale_basis: bool = False
    dtype: str = "float64"
    device: str = "cpu"

    def __post_init__(self):
        for name in ("iterations", "n_basis", "width"):
            value = getattr(self, name)
            if int(value) != value or value < 1:
                raise ValueError(f"Expected {name} to be a positive integer. Got {value!r}.")
        if not self.lr > 0:
            raise ValueError(f"Expected lr to be positive. Got {self.lr!r}.")
        if self.dtype not in ("float64", "float32"):
            raise ValueError(f"dtype must be 'float64' or 'float32', got {self.dtype!r}.")

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


# --- data ---------------------------------------------------------------------------------------------------------
def step_function(x: Tensor) -> Tensor:
    """The paper's f_gt [n] at x [n], with s the logistic sigmoid:

        0.3 (1 - s(200 (x + 0.6))) + 0.9 (s(200 (x + 0.6)) - s(200 x)) - 0.6 (s(200 x) - s(200 (x - 0.4)))
        + 0.01 sin(50 sin(10 x)),

    about 0.3 on [-1, -0.6], 0.9 on [-0.6, 0], -0.6 on [0, 0.4] and 0 on [0.4, 1], plus a small oscillation.
    """
    s = torch.sigmoid
    steps = (0.3 * (1 - s(200 * (x + 0.6))) + 0.9 * (s(200 * (x + 0.6)) - s(200 * x))
             - 0.6 * (s(200 * x) - s(200 * (x - 0.4))))
    return steps + 0.01 * torch.sin(50 * torch.sin(10 * x))


def make_step_data(n: int, seed: int, n_test: int = N_TEST) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(x_train [n, 1], y_train [n], x_test [n_test, 1], y_test [n_test]) float64: x ~ U[-1, 1] and
    y = f_gt(x) + N(0, 0.1^2), in original units; one seed draws both sets."""
    generator = torch.Generator().manual_seed(int(seed))
    x = torch.rand(n + n_test, 1, generator=generator, dtype=torch.float64) * 2 - 1
    y = step_function(x[:, 0]) + NOISE_STD * torch.randn(n + n_test, generator=generator, dtype=torch.float64)
    return x[:n], y[:n], x[n:], y[n:]


# --- models -------------------------------------------------------------------------------------------------------
def build_model(name: str, training: Training) -> GPModel:
    """One of MODELS, with the paper's initialisation (noise variance 1e-2, floor 1e-6)."""
    noise = {"noise": 1e-2, "noise_floor": 1e-6}
    if name == "gp":
        model = get_model_class("exact")(1, kernel="rbf", lengthscale=1.0, **noise)
    elif name in ("dbk", "dbk-c"):
        model = get_model_class("dbk")(1, n_basis=training.n_basis, network="mlp", depth=2, width=training.width,
                                       activation="tanh", correction=name == "dbk",
                                       scale_basis=training.scale_basis, calibrate_noise=None, **noise)
    else:
        raise ValueError(f"Unknown model {name!r}; expected one of {MODELS}.")
    return model.to(dtype=training.torch_dtype, device=training.device)


@dataclass
class Trained:
    """A model trained on z-scored targets, with the statistics (y_mean, y_std) to map back to original units."""

    name: str
    model: GPModel
    y_mean: float
    y_std: float
    seconds: float

    def as_input(self, x: Tensor) -> Tensor:
        """x in the model's dtype and device."""
        like = next(self.model.parameters())
        return x.to(dtype=like.dtype, device=like.device)

    @torch.no_grad()
    def predictive(self, x: Tensor) -> tuple[np.ndarray, np.ndarray]:
        """Mean and variance [m] of y* (noise included) at x [m, 1], on the z-scored scale."""
        mean, var = self.model.likelihood.predictive(*self.model.predict(self.as_input(x)))
        return mean.double().cpu().numpy(), var.double().cpu().numpy()

    @torch.no_grad()
    def kernel(self, x: Tensor) -> np.ndarray:
        """The learned prior covariance k(x_i, x_j) [m, m] on the z-scored scale (for DBK the uncorrected
        Phi Phi^T: the correction only adds c(x) on the diagonal)."""
        x = self.as_input(x)
        return self.model.kernel(x, x).double().cpu().numpy()

    @torch.no_grad()
    def basis(self, x: Tensor) -> np.ndarray:
        """Phi [m, r] of a DBK at x [m, 1]."""
        return self.model.kernel.basis(self.as_input(x)).double().cpu().numpy()


def train_model(name: str, x: Tensor, y: Tensor, training: Training, seed: int) -> Trained:
    """Train model ``name`` on x [n, 1], y [n] (original units; z-scored here with their own statistics)."""
    y_mean, y_std = y.mean().item(), y.std(correction=0).item()
    model = build_model(name, training)
    as_model = {"dtype": training.torch_dtype, "device": training.device}
    tic = time.perf_counter()
    fit(model, x.to(**as_model), ((y - y_mean) / y_std).to(**as_model), epochs=training.iterations,
        lr=training.lr, seed=seed, progress=False)
    return Trained(name, model, y_mean, y_std, time.perf_counter() - tic)


def held_out_scores(trained: Trained, x_test: Tensor, y_test: Tensor) -> dict[str, float]:
    """MAE, RMSE, NLPD and 95% coverage of y_test [m] (original units, z-scored with the training statistics)."""
    y = ((y_test - trained.y_mean) / trained.y_std).numpy()
    mean, var = trained.predictive(x_test)
    return {"mae": metrics.mae(y, mean), "rmse": metrics.rmse(y, mean), "nlpd": metrics.nlpd(y, mean, var),
            "coverage": metrics.coverage(y, mean, var, 0.95)}


def principal_directions(Phi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues lam [r] (largest first) and eigenvectors V^T [r, r] (rows) of Phi^T Phi / n for basis rows
    Phi [n, r]: phi(x)^T v_k are the learned kernel's eigenfunctions on the training inputs, scaled by
    sqrt(lam_k)."""
    _, s, Vt = np.linalg.svd(Phi / math.sqrt(Phi.shape[0]), full_matrices=False)
    return s ** 2, Vt


def spectrum_summary(Phi: np.ndarray) -> dict:
    """The spectrum of the empirical kernel of basis rows Phi [n, r]: the eigenvalues of Phi^T Phi / n (largest
    first), the share of the largest, lam_1 / sum lam, and the effective rank (sum lam)^2 / sum lam^2, which is 1
    for a rank-1 kernel (Theorem 1's collapse) and r for r equal eigenvalues."""
    lam, _ = principal_directions(Phi)
    total = lam.sum()
    return {"eigenvalues": lam.tolist(), "top_share": float(lam[0] / total),
            "effective_rank": float(total ** 2 / (lam ** 2).sum())}


# --- Fig. 1 -------------------------------------------------------------------------------------------------------
def figure1(out_dir: str | Path, *, n: int = FIG1_N, seed: int = 0, n_test: int = N_TEST,
            training: Training = Training(), log: Callable[[str], None] = print) -> dict:
    """Train the three models on n points, draw ``dbk_fig1_posterior_kernel.png`` and ``dbk_fig1_bases.png``
    and write ``dbk_fig1_summary.json`` (returned as a dict) in ``out_dir``."""
    out = plotting.out_dir(out_dir)
    x, y, x_test, y_test = make_step_data(n, seed, n_test)
    fits, summary = {}, {"n": n, "seed": seed, "n_test": n_test, "training": asdict(training), "models": {}}
    for name in MODELS:
        fits[name] = trained = train_model(name, x, y, training, seed)
        noise = trained.model.noise.item()
        row = {"label": LABELS[name], "noise": noise, "noise_original_units": noise * trained.y_std ** 2,
               "seconds": trained.seconds,
               **held_out_scores(trained, x_test, y_test)}
        if name != "gp":
            row["spectrum"] = spectrum_summary(trained.basis(x))
        summary["models"][name] = row
        log(f"fig1 {name:<6} n={n}  noise {row['noise']:.3g}  rmse {row['rmse']:.4f}  nlpd {row['nlpd']:.3f}  "
            f"cov {row['coverage']:.3f}  {trained.seconds:.1f} s")
    plt = plotting.pyplot()
    _plot_posterior_kernel(plt, fits, x, y, out / "dbk_fig1_posterior_kernel.png")
    _plot_bases(plt, fits, x, out / "dbk_fig1_bases.png")
    (out / "dbk_fig1_summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def _plot_posterior_kernel(plt, fits: dict[str, Trained], x: Tensor, y: Tensor, path: Path) -> None:
    grid = torch.linspace(-1, 1, 500, dtype=torch.float64).unsqueeze(-1)
    coarse = torch.linspace(-1, 1, 150, dtype=torch.float64).unsqueeze(-1)
    fig, axes = plt.subplots(len(fits), 2, figsize=(10, 3.0 * len(fits)), gridspec_kw={"width_ratios": [1.6, 1]},
                             squeeze=False)
    for (ax_post, ax_kernel), (name, trained) in zip(axes, fits.items()):
        mean, var = trained.predictive(grid)
        mean, sd = trained.y_mean + trained.y_std * mean, trained.y_std * np.sqrt(var)  # original units
        g = grid[:, 0].numpy()
        ax_post.scatter(x[:, 0].numpy(), y.numpy(), s=3, c="0.6", alpha=0.5, label="data", rasterized=True)
        ax_post.plot(g, step_function(grid[:, 0]).numpy(), "k--", lw=1, label="f_gt")
        ax_post.plot(g, mean, color=COLOURS[name], lw=1.5, label="predictive mean")
        ax_post.fill_between(g, mean - 1.96 * sd, mean + 1.96 * sd, color=COLOURS[name], alpha=0.25,
                             label="95% interval of y")
        ax_post.set_title(f"{LABELS[name]}: noise variance {trained.model.noise.item() * trained.y_std ** 2:.2g}")
        ax_post.set_xlim(-1, 1)
        K = trained.kernel(coarse)
        vmax = np.abs(K).max()
        image = ax_kernel.imshow(K, extent=(-1, 1, -1, 1), origin="lower", cmap="RdBu_r", vmin=-vmax, vmax=vmax)
        ax_kernel.set_title("k(x1, x2)")
        ax_kernel.set_xlabel("x1")
        ax_kernel.set_ylabel("x2")
        fig.colorbar(image, ax=ax_kernel, shrink=0.85)
    axes[0, 0].legend(loc="lower left", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_bases(plt, fits: dict[str, Trained], x: Tensor, path: Path, n_functions: int = 4) -> None:
    """Per DBK: the eigenvalues of Phi^T Phi / n (left) and the leading principal basis functions
    phi(x)^T v_k, with v_k the right singular vectors of Phi at the training inputs (right)."""
    names = [name for name in fits if name != "gp"]
    grid = torch.linspace(-1, 1, 500, dtype=torch.float64).unsqueeze(-1)
    fig, axes = plt.subplots(len(names), 2, figsize=(10, 3.0 * len(names)), squeeze=False)
    for (ax_spectrum, ax_functions), name in zip(axes, names):
        trained = fits[name]
        Phi = trained.basis(x)
        lam, Vt = principal_directions(Phi)
        ax_spectrum.semilogy(np.arange(1, len(lam) + 1), lam / lam[0], "o-", ms=3, color=COLOURS[name])
        summary = spectrum_summary(Phi)
        ax_spectrum.set_title(f"{LABELS[name]}: eigenvalues / largest (top share {summary['top_share']:.3f}, "
                              f"eff. rank {summary['effective_rank']:.2f})", fontsize=9)
        ax_spectrum.set_xlabel("k")
        functions = trained.basis(grid) @ Vt[:n_functions].T  # [500, k]
        for k in range(functions.shape[1]):
            ax_functions.plot(grid[:, 0].numpy(), functions[:, k], lw=1.2, label=f"k = {k + 1}")
        ax_functions.set_title("leading principal basis functions phi(x)^T v_k", fontsize=9)
        ax_functions.set_xlim(-1, 1)
        ax_functions.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- Fig. 3 -------------------------------------------------------------------------------------------------------
def figure3(out_dir: str | Path, *, sizes: tuple[int, ...] = FIG3_SIZES, seeds: int = FIG3_SEEDS,
            n_test: int = N_TEST, exact_max_n: int = FIG3_EXACT_MAX_N, training: Training = Training(),
            log: Callable[[str], None] = print) -> dict:
    """Train every model for each n in ``sizes`` and seeds 0..seeds-1 (the exact GP only for n <= exact_max_n),
    score it on ``n_test`` fresh points, draw ``dbk_fig3_scaling.png`` and write ``dbk_fig3_scaling.json``
    (returned as a dict) in ``out_dir``. A run that fails (e.g. out of memory) is recorded with its error."""
    if not sizes or min(sizes) < 2 or seeds < 1:
        raise ValueError(f"Expected sizes >= 2 and seeds >= 1. Got sizes={sizes!r}, seeds={seeds!r}.")
    out = plotting.out_dir(out_dir)
    runs = []
    for n in sorted(sizes):
        for seed in range(seeds):
            x, y, x_test, y_test = make_step_data(n, seed, n_test)
            for name in MODELS:
                if name == "gp" and n > exact_max_n:
                    continue
                run = {"model": name, "n": n, "seed": seed}
                try:
                    trained = train_model(name, x, y, training, seed)
                    run.update(status="ok", seconds=trained.seconds, noise=trained.model.noise.item(),
                               **held_out_scores(trained, x_test, y_test))
                except (RuntimeError, ValueError) as err:  # NotPSDError, TrainingError, out of memory
                    run.update(status="error", error=f"{type(err).__name__}: {err}")
                runs.append(run)
                log(_run_line(run))
    result = {"sizes": sorted(sizes), "seeds": seeds, "n_test": n_test, "exact_max_n": exact_max_n,
              "training": asdict(training), "runs": runs}
    _plot_scaling(plotting.pyplot(), runs, out / "dbk_fig3_scaling.png")
    (out / "dbk_fig3_scaling.json").write_text(json.dumps(result, indent=1))
    return result


def _run_line(run: dict) -> str:
    head = f"fig3 {run['model']:<6} n={run['n']:<7} seed {run['seed']}"
    if run["status"] != "ok":
        return f"{head}  FAILED  {run['error']}"
    return (f"{head}  rmse {run['rmse']:.4f}  nlpd {run['nlpd']:.3f}  noise {run['noise']:.3g}  "
            f"{run['seconds']:.1f} s")


def _plot_scaling(plt, runs: list[dict], path: Path) -> None:
    panels = (("mae", "MAE"), ("rmse", "RMSE"), ("nlpd", "NLPD"), ("seconds", "training time (s)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.4))
    for name in MODELS:
        ok = [r for r in runs if r["model"] == name and r["status"] == "ok"]
        sizes = sorted({r["n"] for r in ok})
        if not sizes:
            continue
        for ax, (metric, title) in zip(axes, panels):
            values = [np.array([r[metric] for r in ok if r["n"] == n]) for n in sizes]
            mean, sd = np.array([v.mean() for v in values]), np.array([v.std() for v in values])
            ax.plot(sizes, mean, "o-", ms=3, color=COLOURS[name], label=LABELS[name])
            ax.fill_between(sizes, mean - sd, mean + sd, color=COLOURS[name], alpha=0.2)
    for ax, (metric, title) in zip(axes, panels):
        ax.set_xscale("log")
        if metric == "seconds":
            ax.set_yscale("log")
        ax.set_xlabel("n")
        ax.set_title(title)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- both -----------------------------------------------------------------------------------------------------------
def make_figures(out_dir: str | Path, *, only: str | None = None, n: int = FIG1_N,
                 sizes: tuple[int, ...] = FIG3_SIZES, seeds: int = FIG3_SEEDS, n_test: int = N_TEST,
                 exact_max_n: int = FIG3_EXACT_MAX_N, training: Training = Training(),
                 log: Callable[[str], None] = print) -> list[Path]:
    """Fig. 1 and Fig. 3 (or ``only='fig1'`` / ``'fig3'``) in ``out_dir``; returns the files written."""
    if only not in (None, "fig1", "fig3"):
        raise ValueError(f"only must be None, 'fig1' or 'fig3', got {only!r}.")
    out = plotting.out_dir(out_dir)
    written = []
    if only in (None, "fig1"):
        figure1(out, n=n, n_test=n_test, training=training, log=log)
        written += [out / f for f in ("dbk_fig1_posterior_kernel.png", "dbk_fig1_bases.png", "dbk_fig1_summary.json")]
    if only in (None, "fig3"):
        figure3(out, sizes=sizes, seeds=seeds, n_test=n_test, exact_max_n=exact_max_n, training=training, log=log)
        written += [out / f for f in ("dbk_fig3_scaling.png", "dbk_fig3_scaling.json")]
    return written

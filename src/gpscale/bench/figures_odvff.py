"""The ODVFF paper's classification example (Azzimonti et al., App. D.2, Fig. 4; spec shared/specs/odvff.md §7.6),
redrawn on a generated banana-shaped set: ODVFF against SVGP with the probit likelihood.

The paper's figure uses the 400-point banana set of the VFF repository and gives no settings or numbers. Here the
set is scikit-learn's two moons (``make_moons``, noise 0.2) with labels -1 / +1: 400 training points and 2000 test
points from the same generator. Both models use a Matérn-3/2 kernel:

- ``odvff``: the product (Kronecker) structure as VFF's banana experiment, F frequencies per dimension on a box
  one data range beyond the data ((2F + 1)^2 features), plus M_g mean inducing points;
- ``svgp``: M inducing points (k-means initialised, learned), the product Matérn-3/2 too.

Both train on minibatches of 100 with Adam (lr 0.05); ODVFF's q(beta) takes natural-gradient steps of 0.05.

Files written: ``odvff_banana.png`` (each model's p(y = +1 | x) with its 0.5 contour and the training points) and
``odvff_banana.json`` (settings, test accuracy and mean test log predictive density per model, seconds).
``gpscale figures odvff-banana --out docs/figures`` draws it.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ..kernels import ProductMatern
from ..models.svgp import SVGP
from ..models.vff import ODVFF
from ..train import fit
from .plotting import out_dir, pyplot

__all__ = ["BananaSettings", "banana", "banana_figure", "FILE_STEM"]

FILE_STEM = "odvff_banana"


@dataclass
class BananaSettings:
    n_train: int = 400
    n_test: int = 2000
    n_frequencies: int = 6
    n_mean_inducing: int = 16
    n_inducing: int = 16
    epochs: int = 300
    batch_size: int = 100
    lr: float = 0.05
    natgrad_step: float = 0.05
    seed: int = 0


def banana(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two interleaved moons [n, 2] with labels -1 / +1 (float64)."""
    from sklearn.datasets import make_moons

    X, labels = make_moons(n, noise=0.2, random_state=seed)
    return torch.tensor(X, dtype=torch.float64), torch.tensor(2.0 * labels - 1.0, dtype=torch.float64)


def _models(s: BananaSettings) -> dict:
    return {
        "odvff": ODVFF(2, n_frequencies=s.n_frequencies, n_mean_inducing=s.n_mean_inducing, structure="product",
                       kernel=ProductMatern(2, nu=1.5), likelihood="bernoulli", natgrad_step=s.natgrad_step),
        "svgp": SVGP(2, n_inducing=s.n_inducing, kernel=ProductMatern(2, nu=1.5), likelihood="bernoulli"),
    }


def banana_figure(out: str | Path, settings: BananaSettings | None = None) -> list[Path]:
    """Train both models, score them on the test set and draw their decision boundaries."""
    s = settings or BananaSettings()
    torch.manual_seed(s.seed)
    X, y = banana(s.n_train, s.seed)
    X_test, y_test = banana(s.n_test, s.seed + 1)
    lo, hi = X.min(0).values - 0.5, X.max(0).values + 0.5
    g1, g2 = torch.meshgrid(torch.linspace(lo[0], hi[0], 120, dtype=torch.float64),
                            torch.linspace(lo[1], hi[1], 120, dtype=torch.float64), indexing="xy")
    grid = torch.stack([g1.reshape(-1), g2.reshape(-1)], dim=1)
    results, maps = {}, {}
    for name, model in _models(s).items():
        model = model.double()
        tic = time.perf_counter()
        fit(model, X, y, epochs=s.epochs, batch_size=s.batch_size, lr=s.lr, seed=s.seed, progress=False)
        seconds = time.perf_counter() - tic
        mean, var = model.predict(X_test)
        p = model.likelihood.probability(mean, var)
        results[name] = {
            "test_accuracy": ((p > 0.5) == (y_test > 0)).double().mean().item(),
            "test_log_predictive_density": model.likelihood.log_predictive_density(y_test, mean, var).mean().item(),
            "seconds": seconds,
        }
        maps[name] = model.likelihood.probability(*model.predict(grid)).reshape(g1.shape).numpy()
    folder = out_dir(out)
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.3), sharey=True)
    for ax, (name, prob) in zip(axes, maps.items()):
        ax.contourf(g1.numpy(), g2.numpy(), prob, levels=np.linspace(0, 1, 11), cmap="RdBu_r", alpha=0.6)
        ax.contour(g1.numpy(), g2.numpy(), prob, levels=[0.5], colors="k", linewidths=1.5)
        for label, colour in ((1.0, "tab:red"), (-1.0, "tab:blue")):
            chosen = y == label
            ax.scatter(X[chosen, 0], X[chosen, 1], s=8, c=colour, edgecolors="none")
        r = results[name]
        ax.set_title(f"{name}: test accuracy {r['test_accuracy']:.3f}, log density "
                     f"{r['test_log_predictive_density']:.3f}", fontsize=9)
        ax.set_xlabel("x1")
    axes[0].set_ylabel("x2")
    fig.suptitle(f"Probit classification on two moons (n = {s.n_train}): ODVFF ({(2 * s.n_frequencies + 1) ** 2} "
                 f"Fourier features + {s.n_mean_inducing} mean inducing points) vs SVGP ({s.n_inducing} inducing "
                 "points)", fontsize=9)
    fig.tight_layout()
    png, js = folder / f"{FILE_STEM}.png", folder / f"{FILE_STEM}.json"
    fig.savefig(png, dpi=110)
    plt.close(fig)
    js.write_text(json.dumps({"settings": asdict(s), "results": results}, indent=2))
    return [png, js]

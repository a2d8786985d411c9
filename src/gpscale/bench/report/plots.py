"""The PNG plots of a report: accuracy bars, accuracy against training time, and calibration curves."""
from __future__ import annotations

from pathlib import Path

from ...io import write_atomically
from .summary import by_dataset, row_labels, unique

PLOTS = {"accuracy.png": "Accuracy", "pareto.png": "Accuracy against training time",
         "calibration.png": "Calibration"}


def _styles(labels: dict[int, str]) -> dict[str, dict]:
    """A colour and marker per label, the same in every plot."""
    markers = "osD^v<>pPX*h"
    return {label: dict(color=f"C{k % 10}", marker=markers[k % len(markers)])
            for k, label in enumerate(unique(labels.values()))}


def _plot_accuracy(plt, summary: list[dict], path: Path) -> None:
    """Grouped bars of mean RMSE (top) and NLPD (bottom) per dataset and method, with std error bars."""
    labels, datasets = row_labels(summary), by_dataset(summary)
    styles, names = _styles(labels), list(datasets)
    width = 0.8 / max(len(styles), 1)
    fig, axes = plt.subplots(2, 1, figsize=(max(6, 1.6 * len(names) + 3), 7), squeeze=False)
    for ax, metric, title in zip(axes[:, 0], ("rmse", "nlpd"), ("RMSE", "NLPD")):
        for k, label in enumerate(styles):
            points = [(x, row) for x, name in enumerate(names) for i, row in datasets[name]
                      if labels[i] == label and row[f"{metric}_mean"] is not None]
            if points:
                ax.bar([x - 0.4 + (k + 0.5) * width for x, _ in points], [r[f"{metric}_mean"] for _, r in points],
                       width, yerr=[r[f"{metric}_std"] for _, r in points], capsize=3, label=label,
                       color=styles[label]["color"])
        ax.set_xticks(range(len(names)), names)
        ax.set_ylabel(title)
        ax.axhline(0, color="black", linewidth=0.5)
    axes[0, 0].legend(fontsize="small", ncol=2)
    _save(plt, fig, path)


def _dataset_panels(plt, summary: list[dict], height: float):
    """A figure with one panel per dataset: ``(fig, [(ax, dataset, rows)], labels, styles)``."""
    labels, datasets = row_labels(summary), by_dataset(summary)
    fig, axes = plt.subplots(1, len(datasets), figsize=(4 * len(datasets) + 1, height), squeeze=False)
    panels = [(ax, name, rows) for ax, (name, rows) in zip(axes[0], datasets.items())]
    return fig, panels, labels, _styles(labels)


def _plot_pareto(plt, summary: list[dict], path: Path) -> None:
    """Mean RMSE against mean training seconds (log scale), one panel per dataset, one marker per method."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig, panels, labels, styles = _dataset_panels(plt, summary, 3.8)
    for ax, name, rows in panels:
        for i, row in rows:
            if row["rmse_mean"] is not None and row["train_seconds_mean"]:
                ax.plot(row["train_seconds_mean"], row["rmse_mean"], linestyle="none", label=labels[i],
                        **styles[labels[i]])
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda seconds, _: f"{seconds:g}"))  # 0.1, 1, 10 (not 10^1)
        ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels collide on short ranges
        ax.set(title=name, xlabel="training seconds", ylabel="RMSE")
        ax.legend(fontsize="small")
    _save(plt, fig, path)


def _plot_calibration(plt, summary: list[dict], path: Path) -> None:
    """Empirical against nominal coverage of the central intervals, one panel per dataset, with the diagonal."""
    fig, panels, labels, styles = _dataset_panels(plt, summary, 4)
    for ax, name, rows in panels:
        ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1)
        for i, row in rows:
            if row["calibration"]:
                ax.plot(row["calibration"]["levels"], row["calibration"]["empirical"], label=labels[i],
                        markersize=4, **styles[labels[i]])
        ax.set(title=name, xlabel="nominal coverage", ylabel="empirical coverage", xlim=(0, 1), ylim=(0, 1))
        ax.set_aspect("equal")
        ax.legend(fontsize="small")
    _save(plt, fig, path)


def _save(plt, fig, path: Path) -> None:
    fig.tight_layout()
    try:
        write_atomically(path, lambda f: fig.savefig(f, format=path.suffix[1:], dpi=120))
    finally:
        plt.close(fig)


def write_plots(summary: list[dict], out_dir: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for file, plot in zip(PLOTS, (_plot_accuracy, _plot_pareto, _plot_calibration)):
        plot(plt, summary, out_dir / file)

"""Benchmark reports: summaries of the stored runs, markdown tables beside the published numbers, PNG plots.

Means and standard deviations are over the successful runs of a (protocol, dataset, method) group, i.e. over
its splits and seeds; the standard deviation is the sample one (``ddof=1``), 0 for a single run. Speed is
compared with the GPyTorch peer of the same method (``sgpr`` with ``gpytorch-sgpr``, ...) as the ratio of
seconds per epoch measured in the same benchmark run. A paper that reports RMSE in the units of y (published
``rmse_original``, e.g. GP-GRIEF's Table 1) gets two more columns: our ``rmse_original`` beside the paper's. A paper
that reports total training seconds (published ``train_seconds``, e.g. the Deep Basis Kernel paper's Table 1) gets
a column of them beside our ``train s``. Runs trained to convergence get a column of their optimiser steps and how
many converged before the cap, and runs of ``method="auto"`` one naming the method it fitted. A protocol with a
``time_reference`` method gets one more table: every method's seconds per epoch on every dataset, each over the
reference's. Runs skipped because a peer's code is absent are listed with their notes, apart from failed runs.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..io import write_atomically
from .protocols import PROTOCOLS
from .store import ResultsStore

__all__ = ["METRICS", "summarise", "time_ratio", "mean_ranks", "markdown_table", "time_table", "read_runs",
           "write_report", "results_section", "print_table"]

METRICS = ("rmse", "nlpd", "coverage", "train_seconds", "seconds_per_epoch", "peak_memory_mb", "rmse_original",
           "accuracy", "seconds_per_step")
PEER_PREFIX = "gpytorch-"
DASH = "–"
ENVIRONMENT = ("machine", "cpu", "cores", "device", "dtype", "git_commit")
PLOTS = {"accuracy.png": "Accuracy", "pareto.png": "Accuracy against training time",
         "calibration.png": "Calibration"}


# --- summaries -------------------------------------------------------------------------------------------------

def summarise(runs: list[dict]) -> list[dict]:
    """One row per (protocol, dataset, method) of the successful runs of each protocol's newest version in
    ``runs``, in order of first appearance.

    A row has ``protocol``, ``dataset``, ``method``, ``n_splits`` (the number of runs), ``<metric>_mean`` and
    ``<metric>_std`` for each of :data:`METRICS` (``None`` when no run has the metric), ``calibration`` (the
    empirical coverages averaged over the runs, or ``None``) and ``published`` (the paper's numbers from the
    protocol registry; empty for an unknown protocol).
    """
    # a new protocol version changes its numbers, so runs of an older version of the same protocol are superseded
    latest: dict[str, int] = {}
    for run in runs:
        version = run.get("protocol_version") or 0
        latest[run["protocol"]] = max(latest.get(run["protocol"], version), version)
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for run in runs:
        if run.get("status") == "ok" and (run.get("protocol_version") or 0) == latest[run["protocol"]]:
            groups.setdefault((run["protocol"], run["dataset"], run["method"]), []).append(run)
    return [_summarise_group(key, group) for key, group in groups.items()]


def _summarise_group(key: tuple[str, str, str], group: list[dict]) -> dict:
    protocol, dataset, method = key
    row = dict(protocol=protocol, dataset=dataset, method=method, n_splits=len(group))
    for metric in METRICS:
        row[f"{metric}_mean"], row[f"{metric}_std"] = _mean_std([run.get(metric) for run in group])
    row["calibration"] = _mean_calibration(group)
    known = PROTOCOLS.get(protocol)
    row["published"] = dict(known.published.get((method, dataset), {})) if known else {}
    row["fitted_methods"] = _unique(run.get("fitted_method") for run in group)
    row["steps_mean"], _ = _mean_std([run.get("steps") for run in group if run.get("converged") is not None])
    row["converged_runs"] = sum(1 for run in group if run.get("converged"))
    return row


def _mean_std(values: list) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation of the values that are not missing (std 0 for one value)."""
    present = np.array([v for v in values if v is not None], dtype=float)
    if present.size == 0:
        return None, None
    std = float(np.std(present, ddof=1)) if present.size > 1 else 0.0
    return float(np.mean(present)), std


def _mean_calibration(group: list[dict]) -> dict | None:
    """The empirical coverages averaged over the runs with the same nominal levels as the first one."""
    curves = [run["calibration"] for run in group if run.get("calibration")]
    if not curves:
        return None
    levels = curves[0]["levels"]
    empirical = [c["empirical"] for c in curves if c["levels"] == levels]
    return {"levels": list(levels), "empirical": np.mean(np.array(empirical, dtype=float), axis=0).tolist()}


def time_ratio(rows: list[dict], row: dict) -> float | None:
    """Seconds per epoch of ``row`` over those of its GPyTorch peer (same protocol and dataset), or ``None``
    when the row is itself a peer, the peer did not run, or a time is missing."""
    if row["method"].startswith(PEER_PREFIX):
        return None
    peer = next((r for r in rows if r["protocol"] == row["protocol"] and r["dataset"] == row["dataset"]
                 and r["method"] == PEER_PREFIX + row["method"]), None)
    if peer is None or not row["seconds_per_epoch_mean"] or not peer["seconds_per_epoch_mean"]:
        return None
    return row["seconds_per_epoch_mean"] / peer["seconds_per_epoch_mean"]


# --- formatting ------------------------------------------------------------------------------------------------

def _number(value: float | None) -> str:
    """Four significant digits, whole numbers from 1000 on; a dash when missing."""
    if value is None:
        return DASH
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def _mean_pm_std(row: dict, metric: str) -> str:
    """``mean ± std``, or just the mean for a single run."""
    mean, std = row[f"{metric}_mean"], row[f"{metric}_std"]
    if mean is None or row["n_splits"] == 1:
        return _number(mean)
    return f"{_number(mean)} ± {_number(std)}"


def _published(published: dict, metric: str) -> str:
    """The paper's ``mean ± std`` of a metric, its mean alone when it gives no std, or a dash."""
    mean, std = published.get(metric), published.get(f"{metric}_std")
    return _number(mean) if std is None else f"{_number(mean)} ± {_number(std)}"


def _ratio(value: float | None) -> str:
    return DASH if value is None else f"{value:.3g}×"


def _best(rows: list[dict], metric: str) -> float | None:
    means = [r[f"{metric}_mean"] for r in rows if r[f"{metric}_mean"] is not None]
    return min(means) if means else None


def _bold_if(text: str, condition: bool) -> str:
    return f"**{text}**" if condition else text


# --- markdown --------------------------------------------------------------------------------------------------

TABLE_HEADER = ("method", "runs", "RMSE", "NLPD", "95% cov.", "train s", "s/epoch", "time vs GPyTorch", "peak MB",
                "paper RMSE", "paper NLPD", "paper s/epoch")
PAPER_TRAIN_SECONDS_HEADER = ("paper train s",)
CONVERGENCE_HEADER = ("steps (converged)",)
FITTED_HEADER = ("fitted",)
ORIGINAL_UNITS_HEADER = ("RMSE (y units)", "paper RMSE (y units)")
CLASSIFICATION_HEADER = ("accuracy",)
PAPER_CLASSIFICATION_HEADER = ("paper accuracy", "s/step", "paper s/step")


def markdown_table(summary_rows: list[dict], dataset: str) -> str:
    """A markdown table of the rows of one dataset (of one protocol): ``mean ± std`` of each metric, the lowest
    mean RMSE and NLPD in bold, the s/epoch ratio to the GPyTorch peer, and the paper's RMSE, NLPD and s/epoch
    (``mean ± std`` where the paper gives a std). When the paper gives total training seconds for some row
    (published ``train_seconds``), a column of them follows. When its RMSE of some row is in the units of y
    (published ``rmse_original``), two columns follow: our ``rmse_original`` (lowest in bold) and the paper's. For
    classification runs a column holds the test accuracy (the NLPD is then that of the labels), and when the paper
    gives accuracies (published ``accuracy``, ``seconds_per_step``: the HKD paper's Table 2) three more follow:
    the paper's accuracy, our seconds per optimiser step and the paper's."""
    rows = [r for r in summary_rows if r["dataset"] == dataset]
    paper_seconds = any("train_seconds" in r["published"] for r in rows)
    original = any("rmse_original" in r["published"] for r in rows)
    classification = any(r["accuracy_mean"] is not None for r in rows)
    paper_accuracy = any("accuracy" in r["published"] for r in rows)
    converging = any(r["steps_mean"] is not None for r in rows)
    fitted = any(r["fitted_methods"] for r in rows)
    scored = ("rmse", "nlpd", "rmse_original") if original else ("rmse", "nlpd")
    best = {metric: _best(rows, metric) for metric in scored}
    header = (TABLE_HEADER + (PAPER_TRAIN_SECONDS_HEADER if paper_seconds else ())
              + (ORIGINAL_UNITS_HEADER if original else ()) + (CLASSIFICATION_HEADER if classification else ())
              + (PAPER_CLASSIFICATION_HEADER if paper_accuracy else ())
              + (CONVERGENCE_HEADER if converging else ()) + (FITTED_HEADER if fitted else ()))
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        accuracy = {m: _bold_if(_mean_pm_std(row, m), row[f"{m}_mean"] is not None and row[f"{m}_mean"] == best[m])
                    for m in scored}
        cells = [row["method"], str(row["n_splits"]), accuracy["rmse"], accuracy["nlpd"],
                 _mean_pm_std(row, "coverage"), _mean_pm_std(row, "train_seconds"),
                 _mean_pm_std(row, "seconds_per_epoch"), _ratio(time_ratio(summary_rows, row)),
                 _mean_pm_std(row, "peak_memory_mb"),
                 *(_published(row["published"], m) for m in ("rmse", "nlpd", "seconds_per_epoch"))]
        if paper_seconds:
            cells.append(_published(row["published"], "train_seconds"))
        if original:
            cells += [accuracy["rmse_original"], _published(row["published"], "rmse_original")]
        if classification:
            cells.append(_mean_pm_std(row, "accuracy"))
        if paper_accuracy:
            cells += [_published(row["published"], "accuracy"), _mean_pm_std(row, "seconds_per_step"),
                      _published(row["published"], "seconds_per_step")]
        if converging:
            cells.append(DASH if row["steps_mean"] is None else
                         f"{row['steps_mean']:.0f} ({row['converged_runs']}/{row['n_splits']})")
        if fitted:
            cells.append(", ".join(row["fitted_methods"]) or DASH)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def time_table(summary_rows: list[dict], reference: str) -> str:
    """A markdown table of mean seconds per epoch, one row per method and one column per dataset (of one protocol),
    each cell with its ratio to the ``reference`` method's on that dataset (a dash where either time is missing)."""
    datasets = _unique(r["dataset"] for r in summary_rows)
    seconds = {(r["method"], r["dataset"]): r["seconds_per_epoch_mean"] for r in summary_rows}
    lines = ["| method | " + " | ".join(datasets) + " |", "|" + "---|" * (len(datasets) + 1)]
    for method in _unique(r["method"] for r in summary_rows):
        cells = []
        for dataset in datasets:
            ours, theirs = seconds.get((method, dataset)), seconds.get((reference, dataset))
            ratio = ours / theirs if ours and theirs else None
            cells.append(DASH if ours is None else f"{_number(ours)} ({_ratio(ratio)})")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _unique(values) -> list:
    """The distinct non-missing values in order of first appearance."""
    return list(dict.fromkeys(v for v in values if v is not None and v != ""))


def _environment(runs: list[dict]) -> list[str]:
    """Markdown bullet lines for the machine, software and dates the runs were made with."""
    lines = [f"- {name}: {', '.join(map(str, _unique(r.get(name) for r in runs)))}"
             for name in ENVIRONMENT if _unique(r.get(name) for r in runs)]
    dates = sorted(_unique(r.get("date") for r in runs))
    if dates:
        lines.append(f"- date: {dates[0]}" + (f" to {dates[-1]}" if len(dates) > 1 else ""))
    version_fields = sorted({k for r in runs for k in r if k.endswith("_version") and k != "protocol_version"})
    versions = [f"{k[:-len('_version')]} {', '.join(map(str, _unique(r.get(k) for r in runs)))}"
                for k in version_fields if _unique(r.get(k) for r in runs)]
    if versions:
        lines.append(f"- versions: {'; '.join(versions)}")
    return lines


def _protocol_section(name: str, runs: list[dict], summary: list[dict]) -> list[str]:
    """The heading, description and one table per dataset of one protocol."""
    known = PROTOCOLS.get(name)
    versions = ", ".join(str(v) for v in _unique(r.get("protocol_version") for r in runs))
    lines = [f"## Protocol `{name}` (version {versions})", ""]
    if known is not None:
        lines += [known.description, ""]
        if known.source:
            lines += [f"Published numbers: {known.source}", ""]
    rows = [r for r in summary if r["protocol"] == name]
    datasets = _unique(r["dataset"] for r in rows)
    if not datasets:
        lines += ["No successful runs.", ""]
    lines += _rank_lines(rows)
    if known is not None and known.time_reference and datasets:
        lines += [f"### Seconds per epoch (over {known.time_reference}'s)", "", time_table(rows, known.time_reference),
                  ""]
    for dataset in datasets:
        lines += [f"### {dataset}", "", markdown_table(rows, dataset), ""]
    return lines


def mean_ranks(summary_rows: list[dict], metric: str = "nlpd") -> tuple[dict[str, float], list[str]]:
    """The methods' mean rank by the mean of ``metric`` (1 = lowest) over the datasets on which every method of
    the rows has a value, as papers rank methods across a table; returns (method -> mean rank, those datasets).
    Ties share the mean of their ranks."""
    methods = _unique(r["method"] for r in summary_rows)
    values: dict[str, dict[str, float]] = {}
    for r in summary_rows:
        if r[f"{metric}_mean"] is not None:
            values.setdefault(r["dataset"], {})[r["method"]] = r[f"{metric}_mean"]
    complete = [d for d, by_method in values.items() if set(by_method) == set(methods)]
    ranks = {m: [] for m in methods}
    for d in complete:
        ordered = sorted(values[d].values())
        for m, v in values[d].items():
            first = ordered.index(v) + 1
            ranks[m].append(first + (ordered.count(v) - 1) / 2)
    return ({m: float(np.mean(r)) for m, r in ranks.items()} if complete else {}), complete


def _rank_lines(rows: list[dict]) -> list[str]:
    ranks, datasets = mean_ranks(rows)
    if len(datasets) < 2 or len(ranks) < 2:
        return []
    cells = ", ".join(f"{m} {r:.2f}" for m, r in sorted(ranks.items(), key=lambda item: item[1]))
    return [f"Mean rank by NLPD over the {len(datasets)} sets where every method ran ({', '.join(datasets)}): "
            f"{cells}.", ""]


def _run_notes(runs: list[dict]) -> list[str]:
    """A bullet per run with its error message or note."""
    return [f"- `{r['protocol']}` / {r['dataset']} / {r['method']}, split {r.get('split')}, seed {r.get('seed')}: "
            f"{(r.get('error') or 'unknown error').strip()}" for r in runs]


def _failures(runs: list[dict]) -> list[str]:
    """A bullet per failed run (neither successful nor skipped) with its error message."""
    return _run_notes([r for r in runs if r.get("status") not in ("ok", "skipped")]) or ["None."]


def _skipped(runs: list[dict]) -> list[str]:
    """The section of the runs skipped because a peer's code is absent, with their notes; none when there are
    none."""
    skipped = [r for r in runs if r.get("status") == "skipped"]
    return ["## Skipped runs", "", *_run_notes(skipped), ""] if skipped else []


def _markdown(runs: list[dict], summary: list[dict]) -> str:
    lines = ["# gpscale benchmark report", "", "Means ± standard deviations over splits and seeds; the lowest "
             "mean RMSE and NLPD in bold; *time vs GPyTorch* is the ratio of seconds per epoch to the GPyTorch "
             "peer's, measured in the same run.", "", "## Environment", "", *_environment(runs), ""]
    if not summary:
        lines += [f"**None of the {len(runs)} runs succeeded**: no scores and no plots. Their errors (and the notes "
                  "of skipped runs) follow.", ""]
    for name in _unique(r["protocol"] for r in runs) if summary else ():
        lines += _protocol_section(name, [r for r in runs if r["protocol"] == name], summary)
    if summary:
        lines += ["## Plots", ""] + [line for file, title in PLOTS.items() for line in (f"![{title}]({file})", "")]
    lines += [*_skipped(runs), "## Failed runs", "", *_failures(runs), ""]
    return "\n".join(lines)


# --- plots -----------------------------------------------------------------------------------------------------

def _labels(summary: list[dict]) -> dict[int, str]:
    """Plot label of each row (by index): the method, prefixed by the protocol when there are several."""
    several = len(_unique(r["protocol"] for r in summary)) > 1
    return {i: f"{r['protocol']}/{r['method']}" if several else r["method"] for i, r in enumerate(summary)}


def _by_dataset(summary: list[dict]) -> dict[str, list[tuple[int, dict]]]:
    datasets: dict[str, list[tuple[int, dict]]] = {}
    for i, row in enumerate(summary):
        datasets.setdefault(row["dataset"], []).append((i, row))
    return datasets


def _styles(labels: dict[int, str]) -> dict[str, dict]:
    """A colour and marker per label, the same in every plot."""
    markers = "osD^v<>pPX*h"
    return {label: dict(color=f"C{k % 10}", marker=markers[k % len(markers)])
            for k, label in enumerate(_unique(labels.values()))}


def _plot_accuracy(plt, summary: list[dict], path: Path) -> None:
    """Grouped bars of mean RMSE (top) and NLPD (bottom) per dataset and method, with std error bars."""
    labels, datasets = _labels(summary), _by_dataset(summary)
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
    labels, datasets = _labels(summary), _by_dataset(summary)
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


def _write_plots(summary: list[dict], out_dir: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for file, plot in zip(PLOTS, (_plot_accuracy, _plot_pareto, _plot_calibration)):
        plot(plt, summary, out_dir / file)


# --- entry points ----------------------------------------------------------------------------------------------

def read_runs(store_paths: str | Path | list, protocol: str | None = None) -> list[dict]:
    """The runs of one or several results files (e.g. parts of a protocol run on different machines), optionally
    of one protocol; an error if there are none."""
    paths = [Path(p) for p in (store_paths if isinstance(store_paths, (list, tuple)) else [store_paths])]
    runs = []
    for path in paths:
        if not path.is_file():
            raise ValueError(f"No results file at {path}.")
        runs += ResultsStore(path).runs(protocol)
    if not runs:
        raise ValueError(f"{', '.join(map(str, paths))} has no runs" + (f" of protocol {protocol!r}." if protocol
                                                                          else "."))
    return runs


def write_report(store_paths: str | Path | list, out_dir: str | Path, protocol: str | None = None) -> Path:
    """Write ``report.md`` and the plots ``accuracy.png``, ``pareto.png`` and ``calibration.png`` into
    ``out_dir`` from the runs in one or several results files, optionally of one protocol (:func:`read_runs`);
    returns the report's path. Each file is replaced whole (:func:`gpscale.io.write_atomically`), and the plots of
    an earlier report go only once the new report is written, so a failed write deletes nothing."""
    out_dir = Path(out_dir)
    runs = read_runs(store_paths, protocol)
    summary = summarise(runs)
    out_dir.mkdir(parents=True, exist_ok=True)
    if summary:  # runs that scored: a report of failures alone has nothing to plot
        _write_plots(summary, out_dir)
    report = out_dir / "report.md"
    write_atomically(report, lambda f: f.write(_markdown(runs, summary)), text=True)
    if not summary:  # plots of an earlier report would describe other runs
        for file in PLOTS:
            (out_dir / file).unlink(missing_ok=True)
    return report


def results_section(store_paths: str | Path | list, protocol: str | None = None) -> str:
    """The runs of results files as a section of a documentation page, what a method page's reproduced numbers
    are: for each protocol a table per dataset, beside the paper's published numbers where the protocol has them,
    then where the numbers come from (the commands that ran them, the commit, machine, dtype and dates), and the
    runs that failed."""
    runs = read_runs(store_paths, protocol)
    summary = summarise(runs)
    lines = []
    for name in _unique(r["protocol"] for r in runs):
        rows = [r for r in summary if r["protocol"] == name]
        versions = ", ".join(str(v) for v in _unique(r.get("protocol_version") for r in runs if r["protocol"] == name))
        lines += [f"Protocol `{name}` (version {versions}); means ± standard deviations over splits and seeds, "
                  "RMSE and NLPD on standardised y, the lowest mean RMSE and NLPD in bold:", ""]
        lines += _rank_lines(rows)
        for dataset in _unique(r["dataset"] for r in rows):
            lines += [f"**{dataset}**", "", _without_empty_columns(markdown_table(rows, dataset)), ""]
    commands = _unique(r.get("command") for r in runs)
    lines += ["Where these numbers come from:", "", *_environment(runs)]
    lines += [f"- command: `{command}`" for command in commands]
    failed = [r for r in runs if r.get("status") not in ("ok", "skipped")]
    if failed:
        lines += ["", "Runs that failed:", "", *_run_notes(failed)]
    return "\n".join(lines) + "\n"


def _without_empty_columns(table: str) -> str:
    """A markdown table without the columns that hold no value in any row (a page shows the columns its runs have;
    the full report keeps every column, so that reports compare)."""
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in table.splitlines()]
    keep = [j for j in range(len(rows[0])) if any(row[j] not in (DASH, "") for row in rows[2:])]
    return "\n".join("| " + " | ".join(row[j] for j in keep) + " |" if i != 1 else "|" + "---|" * len(keep)
                     for i, row in enumerate(rows))


def print_table(runs: list[dict]) -> str:
    """A compact plain-text table of the mean metrics, one line per dataset and method, for the terminal."""
    summary = summarise(runs)
    labels = _labels(summary)
    header = ("dataset", "method", "RMSE", "NLPD", "cov", "s/epoch", "train s", "vs GPyTorch")
    table = [header] + [
        (row["dataset"], labels[i], _number(row["rmse_mean"]), _number(row["nlpd_mean"]),
         _number(row["coverage_mean"]), _number(row["seconds_per_epoch_mean"]), _number(row["train_seconds_mean"]),
         _ratio(time_ratio(summary, row)))
        for rows in _by_dataset(summary).values() for i, row in rows]
    widths = [max(len(line[k]) for line in table) for k in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) if k < 2 else cell.rjust(w) for k, (cell, w)
                               in enumerate(zip(line, widths))).rstrip() for line in table)

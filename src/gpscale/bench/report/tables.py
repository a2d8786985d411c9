"""The markdown tables of a report, one per dataset of a protocol beside the paper's numbers, and the plain-text
table for the terminal."""
from __future__ import annotations

from .summary import by_dataset, row_labels, summarise, time_ratio, unique

DASH = "–"


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
    datasets = unique(r["dataset"] for r in summary_rows)
    seconds = {(r["method"], r["dataset"]): r["seconds_per_epoch_mean"] for r in summary_rows}
    lines = ["| method | " + " | ".join(datasets) + " |", "|" + "---|" * (len(datasets) + 1)]
    for method in unique(r["method"] for r in summary_rows):
        cells = []
        for dataset in datasets:
            ours, theirs = seconds.get((method, dataset)), seconds.get((reference, dataset))
            ratio = ours / theirs if ours and theirs else None
            cells.append(DASH if ours is None else f"{_number(ours)} ({_ratio(ratio)})")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def without_empty_columns(table: str) -> str:
    """A markdown table without the columns that hold no value in any row (a page shows the columns its runs have;
    the full report keeps every column, so that reports compare)."""
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in table.splitlines()]
    keep = [j for j in range(len(rows[0])) if any(row[j] not in (DASH, "") for row in rows[2:])]
    return "\n".join("| " + " | ".join(row[j] for j in keep) + " |" if i != 1 else "|" + "---|" * len(keep)
                     for i, row in enumerate(rows))


def print_table(runs: list[dict]) -> str:
    """A compact plain-text table of the mean metrics, one line per dataset and method, for the terminal."""
    summary = summarise(runs)
    labels = row_labels(summary)
    header = ("dataset", "method", "RMSE", "NLPD", "cov", "s/epoch", "train s", "vs GPyTorch")
    table = [header] + [
        (row["dataset"], labels[i], _number(row["rmse_mean"]), _number(row["nlpd_mean"]),
         _number(row["coverage_mean"]), _number(row["seconds_per_epoch_mean"]), _number(row["train_seconds_mean"]),
         _ratio(time_ratio(summary, row)))
        for rows in by_dataset(summary).values() for i, row in rows]
    widths = [max(len(line[k]) for line in table) for k in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) if k < 2 else cell.rjust(w) for k, (cell, w)
                               in enumerate(zip(line, widths))).rstrip() for line in table)

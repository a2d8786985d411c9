"""Summaries of the stored runs: one row per (protocol, dataset, method) with the means and sample standard
deviations of each metric, the ratio of its time to its GPyTorch peer's, and the methods' mean ranks."""
from __future__ import annotations

import numpy as np

from ..protocols import PROTOCOLS

METRICS = ("rmse", "nlpd", "coverage", "train_seconds", "seconds_per_epoch", "peak_memory_mb", "rmse_original",
           "accuracy", "seconds_per_step")
PEER_PREFIX = "gpytorch-"


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
    row["fitted_methods"] = unique(run.get("fitted_method") for run in group)
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


def mean_ranks(summary_rows: list[dict], metric: str = "nlpd") -> tuple[dict[str, float], list[str]]:
    """The methods' mean rank by the mean of ``metric`` (1 = lowest) over the datasets on which every method of
    the rows has a value, as papers rank methods across a table; returns (method -> mean rank, those datasets).
    Ties share the mean of their ranks."""
    methods = unique(r["method"] for r in summary_rows)
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


def unique(values) -> list:
    """The distinct non-missing values in order of first appearance."""
    return list(dict.fromkeys(v for v in values if v is not None and v != ""))


def row_labels(summary: list[dict]) -> dict[int, str]:
    """Plot label of each row (by index): the method, prefixed by the protocol when there are several."""
    several = len(unique(r["protocol"] for r in summary)) > 1
    return {i: f"{r['protocol']}/{r['method']}" if several else r["method"] for i, r in enumerate(summary)}


def by_dataset(summary: list[dict]) -> dict[str, list[tuple[int, dict]]]:
    datasets: dict[str, list[tuple[int, dict]]] = {}
    for i, row in enumerate(summary):
        datasets.setdefault(row["dataset"], []).append((i, row))
    return datasets

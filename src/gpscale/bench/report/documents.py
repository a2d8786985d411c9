"""The report documents: ``report.md`` with its plots, and the results section of a documentation page, from
the runs of one or several results files."""
from __future__ import annotations

from pathlib import Path

from ...io import write_atomically
from ..protocols import PROTOCOLS
from ..store import ResultsStore
from .plots import PLOTS, write_plots
from .summary import mean_ranks, summarise, unique
from .tables import markdown_table, time_table, without_empty_columns

ENVIRONMENT = ("machine", "cpu", "cores", "device", "dtype", "git_commit")


def _environment(runs: list[dict]) -> list[str]:
    """Markdown bullet lines for the machine, software and dates the runs were made with."""
    lines = [f"- {name}: {', '.join(map(str, unique(r.get(name) for r in runs)))}"
             for name in ENVIRONMENT if unique(r.get(name) for r in runs)]
    dates = sorted(unique(r.get("date") for r in runs))
    if dates:
        lines.append(f"- date: {dates[0]}" + (f" to {dates[-1]}" if len(dates) > 1 else ""))
    version_fields = sorted({k for r in runs for k in r if k.endswith("_version") and k != "protocol_version"})
    versions = [f"{k[:-len('_version')]} {', '.join(map(str, unique(r.get(k) for r in runs)))}"
                for k in version_fields if unique(r.get(k) for r in runs)]
    if versions:
        lines.append(f"- versions: {'; '.join(versions)}")
    return lines


def _protocol_section(name: str, runs: list[dict], summary: list[dict]) -> list[str]:
    """The heading, description and one table per dataset of one protocol."""
    known = PROTOCOLS.get(name)
    versions = ", ".join(str(v) for v in unique(r.get("protocol_version") for r in runs))
    lines = [f"## Protocol `{name}` (version {versions})", ""]
    if known is not None:
        lines += [known.description, ""]
        if known.source:
            lines += [f"Published numbers: {known.source}", ""]
    rows = [r for r in summary if r["protocol"] == name]
    datasets = unique(r["dataset"] for r in rows)
    if not datasets:
        lines += ["No successful runs.", ""]
    lines += _rank_lines(rows)
    if known is not None and known.time_reference and datasets:
        lines += [f"### Seconds per epoch (over {known.time_reference}'s)", "", time_table(rows, known.time_reference),
                  ""]
    for dataset in datasets:
        lines += [f"### {dataset}", "", markdown_table(rows, dataset), ""]
    return lines


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
    for name in unique(r["protocol"] for r in runs) if summary else ():
        lines += _protocol_section(name, [r for r in runs if r["protocol"] == name], summary)
    if summary:
        lines += ["## Plots", ""] + [line for file, title in PLOTS.items() for line in (f"![{title}]({file})", "")]
    lines += [*_skipped(runs), "## Failed runs", "", *_failures(runs), ""]
    return "\n".join(lines)


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
        write_plots(summary, out_dir)
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
    for name in unique(r["protocol"] for r in runs):
        rows = [r for r in summary if r["protocol"] == name]
        versions = ", ".join(str(v) for v in unique(r.get("protocol_version") for r in runs if r["protocol"] == name))
        lines += [f"Protocol `{name}` (version {versions}); means ± standard deviations over splits and seeds, "
                  "RMSE and NLPD on standardised y, the lowest mean RMSE and NLPD in bold:", ""]
        lines += _rank_lines(rows)
        for dataset in unique(r["dataset"] for r in rows):
            lines += [f"**{dataset}**", "", without_empty_columns(markdown_table(rows, dataset)), ""]
    commands = unique(r.get("command") for r in runs)
    lines += ["Where these numbers come from:", "", *_environment(runs)]
    lines += [f"- command: `{command}`" for command in commands]
    failed = [r for r in runs if r.get("status") not in ("ok", "skipped")]
    if failed:
        lines += ["", "Runs that failed:", "", *_run_notes(failed)]
    return "\n".join(lines) + "\n"

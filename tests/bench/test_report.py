"""The benchmark report: numbers in the tables equal the stored runs, bold best values, GPyTorch time ratios,
failed runs, published numbers, and valid PNG plots."""
import re

import numpy as np
import pytest

from gpscale.bench.protocols import PROTOCOLS, MethodSpec, Protocol, register_protocol
from gpscale.bench.report import (PLOTS, markdown_table, mean_ranks, print_table, results_section, summarise,
                                  write_report)
from gpscale.cli import main
from gpscale.bench.store import ResultsStore

PROTOCOL = "test-report"
PUBLISHED = {("sgpr", "pol"): {"rmse": 0.1234, "nlpd": -0.567, "seconds_per_epoch": 1.5,
                               "seconds_per_epoch_std": 0.25}}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
METHODS = ("sgpr", "gpytorch-sgpr", "svgp")
LEVELS = [0.1, 0.5, 0.9]


@pytest.fixture(scope="module")
def protocol():
    register_protocol(Protocol(name=PROTOCOL, version=3, description="A protocol made by a test.",
                               methods=tuple(MethodSpec(m) for m in METHODS), datasets={"pol": None, "elevators": None},
                               published=PUBLISHED, source="Test et al. (2024), Table 1"))
    yield PROTOCOL
    PROTOCOLS.pop(PROTOCOL)


def record(method, dataset, split, rng, **fields):
    """A successful run with random metrics, as the runner would write it."""
    return dict(protocol=PROTOCOL, protocol_version=3, method=method, options={"epochs": 5}, dataset=dataset,
                split=split, seed=0, n_train=900, n_test=100, d=4, status="ok", error=None,
                rmse=float(rng.uniform(0.1, 0.5)), nlpd=float(rng.uniform(-1, 1)), coverage=float(rng.uniform(0.9, 1)),
                calibration={"levels": LEVELS, "empirical": sorted(rng.uniform(0, 1, 3).tolist())},
                rmse_original=1.0, train_seconds=float(rng.uniform(1, 100)),
                seconds_per_epoch=float(rng.uniform(0.1, 2)), predict_seconds=0.1, epochs=5,
                peak_memory_mb=float(rng.uniform(10, 500)), dtype="float64", device="cpu",
                gpscale_version="0.1.0", torch_version="2.3.0", gpytorch_version="1.11", machine="testbox",
                cpu="Test CPU", cores=2, date=f"2024-05-0{split + 1}T10:00:00", git_commit="abc1234", **fields)


@pytest.fixture(scope="module")
def runs(protocol):
    """Two datasets x three methods x two splits; svgp's second split on elevators failed."""
    rng = np.random.default_rng(0)
    runs = [record(m, ds, split, rng) for ds in ("pol", "elevators") for m in METHODS for split in (0, 1)]
    failed = next(r for r in runs if (r["method"], r["dataset"], r["split"]) == ("svgp", "elevators", 1))
    failed.update(status="error", error="Cholesky failed: matrix not positive definite", rmse=None, nlpd=None,
                  coverage=None, calibration=None, train_seconds=None, seconds_per_epoch=None, peak_memory_mb=None)
    return runs


@pytest.fixture(scope="module")
def store(tmp_path_factory, runs):
    path = tmp_path_factory.mktemp("store") / "results.sqlite"
    results = ResultsStore(path)
    for run in runs:
        results.append(run)
    return path


@pytest.fixture(scope="module")
def report(store, tmp_path_factory):
    """The report of the store's protocol, written once for the tests that read it."""
    return write_report(store, tmp_path_factory.mktemp("report") / "out", protocol=PROTOCOL)


def ok_values(runs, dataset, method, metric):
    return np.array([r[metric] for r in runs if (r["dataset"], r["method"], r["status"]) == (dataset, method, "ok")])


def parse_tables(markdown):
    """{dataset: {method: {column: cell}}} from the report's ``### dataset`` tables."""
    tables = {}
    for dataset, body in re.findall(r"^### (\S+)\n\n((?:\|.*\n)+)", markdown, flags=re.M):
        lines = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in body.strip().splitlines()]
        header, rows = lines[0], lines[2:]
        tables[dataset] = {row[0]: dict(zip(header, row)) for row in rows}
    return tables


def parse_cell(cell):
    """(mean, std or None, bold) of a ``mean ± std`` cell."""
    bold = cell.startswith("**") and cell.endswith("**")
    parts = cell.strip("*").split(" ± ")
    return float(parts[0]), (float(parts[1]) if len(parts) > 1 else None), bold


def test_summarise_means_stds_and_published(runs):
    rows = {(r["dataset"], r["method"]): r for r in summarise(runs)}
    assert len(rows) == 6
    sgpr = rows[("pol", "sgpr")]
    values = ok_values(runs, "pol", "sgpr", "rmse")
    assert sgpr["n_splits"] == 2
    assert sgpr["rmse_mean"] == pytest.approx(values.mean())
    assert sgpr["rmse_std"] == pytest.approx(values.std(ddof=1))
    assert sgpr["published"] == PUBLISHED[("sgpr", "pol")]
    assert rows[("pol", "svgp")]["published"] == {}
    single = rows[("elevators", "svgp")]
    assert single["n_splits"] == 1 and single["nlpd_std"] == 0.0
    curves = [r["calibration"]["empirical"] for r in runs
              if (r["dataset"], r["method"]) == ("pol", "svgp") and r["status"] == "ok"]
    assert sgpr["calibration"]["levels"] == LEVELS
    assert rows[("pol", "svgp")]["calibration"]["empirical"] == pytest.approx(np.mean(curves, axis=0))


def test_summarise_tolerates_unknown_protocol(runs):
    rows = summarise([dict(r, protocol="not-registered") for r in runs])
    assert all(r["published"] == {} for r in rows)


def test_report_numbers_equal_the_stored_runs(report, runs):
    assert report.name == "report.md"
    tables = parse_tables(report.read_text(encoding="utf-8"))
    assert set(tables) == {"pol", "elevators"}
    columns = {"RMSE": "rmse", "NLPD": "nlpd", "95% cov.": "coverage", "train s": "train_seconds",
               "s/epoch": "seconds_per_epoch", "peak MB": "peak_memory_mb"}
    for dataset, table in tables.items():
        assert set(table) == set(METHODS)
        for method, cells in table.items():
            for column, metric in columns.items():
                values = ok_values(runs, dataset, method, metric)
                mean, std, _ = parse_cell(cells[column])
                assert mean == pytest.approx(values.mean(), rel=1e-3), (dataset, method, column)
                if len(values) == 1:
                    assert std is None
                else:
                    assert std == pytest.approx(values.std(ddof=1), rel=1e-3, abs=1e-9)


def test_report_bolds_the_best_rmse_and_nlpd(report, runs):
    tables = parse_tables(report.read_text(encoding="utf-8"))
    for dataset, table in tables.items():
        for column, metric in (("RMSE", "rmse"), ("NLPD", "nlpd")):
            best = min(METHODS, key=lambda m: ok_values(runs, dataset, m, metric).mean())
            bold = {m for m, cells in table.items() if parse_cell(cells[column])[2]}
            assert bold == {best}, (dataset, column)
        assert not any(parse_cell(cells["95% cov."])[2] for cells in table.values())


def test_report_time_ratio_against_gpytorch(report, runs):
    tables = parse_tables(report.read_text(encoding="utf-8"))
    for dataset, table in tables.items():
        expected = (ok_values(runs, dataset, "sgpr", "seconds_per_epoch").mean()
                    / ok_values(runs, dataset, "gpytorch-sgpr", "seconds_per_epoch").mean())
        assert float(table["sgpr"]["time vs GPyTorch"].rstrip("×")) == pytest.approx(expected, rel=5e-3)
        assert table["svgp"]["time vs GPyTorch"] == "–"  # no gpytorch-svgp ran
        assert table["gpytorch-sgpr"]["time vs GPyTorch"] == "–"


def test_report_paper_numbers_failures_and_context(report):
    text = report.read_text(encoding="utf-8")
    table = parse_tables(text)["pol"]
    assert float(table["sgpr"]["paper RMSE"]) == PUBLISHED[("sgpr", "pol")]["rmse"]
    assert float(table["sgpr"]["paper NLPD"]) == PUBLISHED[("sgpr", "pol")]["nlpd"]
    assert table["sgpr"]["paper s/epoch"] == "1.5 ± 0.25"
    assert table["sgpr"]["runs"] == "2"
    assert table["svgp"]["paper RMSE"] == "–"
    failures = text.split("## Failed runs")[1]
    assert "elevators / svgp, split 1" in failures
    assert "Cholesky failed: matrix not positive definite" in failures
    for expected in ("A protocol made by a test.", "Test et al. (2024), Table 1", "testbox", "Test CPU", "float64",
                     "abc1234", "torch 2.3.0", "2024-05-01T10:00:00 to 2024-05-02T10:00:00"):
        assert expected in text, expected
    for plot in ("accuracy.png", "pareto.png", "calibration.png"):
        assert f"]({plot})" in text


def test_report_writes_valid_pngs(report):
    for plot in ("accuracy.png", "pareto.png", "calibration.png"):
        data = (report.parent / plot).read_bytes()
        assert len(data) > 1000 and data.startswith(PNG_SIGNATURE), plot


def test_report_with_one_method_and_only_failures(tmp_path, protocol):
    rng = np.random.default_rng(1)
    path = tmp_path / "one.sqlite"
    results = ResultsStore(path)
    results.append(record("sgpr", "pol", 0, rng))
    results.append(dict(record("svgp", "kin40k", 0, rng), status="error", error="out of memory", rmse=None))
    text = write_report(path, tmp_path / "out").read_text(encoding="utf-8")
    table = parse_tables(text)["pol"]
    assert list(table) == ["sgpr"] and parse_cell(table["sgpr"]["RMSE"])[1:] == (None, True)
    assert "kin40k / svgp, split 0, seed 0: out of memory" in text
    assert all((tmp_path / "out" / p).read_bytes().startswith(PNG_SIGNATURE)
               for p in ("accuracy.png", "pareto.png", "calibration.png"))


def test_a_report_of_runs_that_all_failed_says_so_with_their_errors_and_drops_stale_plots(tmp_path, protocol):
    rng = np.random.default_rng(2)
    path, out = tmp_path / "failed.sqlite", tmp_path / "out"
    out.mkdir()
    (out / "accuracy.png").write_bytes(PNG_SIGNATURE)  # from an earlier report of other runs
    results = ResultsStore(path)
    for method, error in (("sgpr", "ValueError: n_inducing must be >= 1"), ("svgp", "MemoryError: planted")):
        results.append(dict(record(method, "pol", 0, rng), status="error", error=error, rmse=None, nlpd=None))
    text = write_report(path, out).read_text(encoding="utf-8")
    assert "**None of the 2 runs succeeded**" in text and "## Plots" not in text
    assert "pol / sgpr, split 0, seed 0: ValueError: n_inducing must be >= 1" in text
    assert "pol / svgp, split 0, seed 0: MemoryError: planted" in text
    assert sorted(p.name for p in out.iterdir()) == ["report.md"]


def test_report_rejects_a_missing_or_empty_store(tmp_path):
    with pytest.raises(ValueError, match="No results file"):
        write_report(tmp_path / "missing.sqlite", tmp_path)
    ResultsStore(tmp_path / "empty.sqlite")
    with pytest.raises(ValueError, match="no runs"):
        write_report(tmp_path / "empty.sqlite", tmp_path)


def test_summaries_use_only_the_newest_version_of_a_protocol(runs):
    newest = max(r["protocol_version"] for r in runs)
    older = [{**r, "protocol_version": newest - 1, "rmse": 99.0} for r in runs]
    assert summarise(older + runs) == summarise(runs)  # v(newest - 1)'s runs are superseded, not averaged in


def test_markdown_table_single_dataset(runs):
    table = markdown_table(summarise(runs), "elevators")
    lines = table.splitlines()
    assert lines[0].startswith("| method | runs | RMSE | NLPD | 95% cov. | train s | s/epoch | time vs GPyTorch |")
    assert len(lines) == 2 + 3 and all("pol" not in line for line in lines)


def test_print_table(runs):
    text = print_table(runs)
    lines = text.splitlines()
    assert len(lines) == 1 + 6
    assert lines[0].split()[:3] == ["dataset", "method", "RMSE"]
    sgpr = next(line for line in lines if line.split()[:2] == ["pol", "sgpr"])
    expected_rmse = ok_values(runs, "pol", "sgpr", "rmse").mean()
    assert float(sgpr.split()[2]) == pytest.approx(expected_rmse, rel=1e-3)
    ratio = (ok_values(runs, "pol", "sgpr", "seconds_per_epoch").mean()
             / ok_values(runs, "pol", "gpytorch-sgpr", "seconds_per_epoch").mean())
    assert float(sgpr.split()[-1].rstrip("×")) == pytest.approx(ratio, rel=5e-3)


def test_papers_rmse_in_units_of_y_gets_our_rmse_original_beside_it(tmp_path):
    """A published ``rmse_original`` (GP-GRIEF's Table 1 is in the units of y) adds our rmse_original and the
    paper's as two columns; tables of other protocols keep their columns."""
    name = "test-report-original"
    published = {("sgpr", "pol"): {"rmse_original": 2.5, "rmse_original_std": 0.5}}
    register_protocol(Protocol(name=name, version=1, description="RMSE in the units of y.",
                               methods=(MethodSpec("sgpr"), MethodSpec("svgp")), datasets={"pol": None},
                               published=published))
    try:
        rng = np.random.default_rng(2)
        runs = [dict(record(m, "pol", split, rng), protocol=name, protocol_version=1,
                     rmse_original=float(rng.uniform(1, 4))) for m in ("sgpr", "svgp") for split in (0, 1)]
        path = tmp_path / "original.sqlite"
        results = ResultsStore(path)
        for run in runs:
            results.append(run)
        table = parse_tables(write_report(path, tmp_path / "out").read_text(encoding="utf-8"))["pol"]
    finally:
        PROTOCOLS.pop(name)
    for method in ("sgpr", "svgp"):
        values = np.array([r["rmse_original"] for r in runs if r["method"] == method])
        mean, std, bold = parse_cell(table[method]["RMSE (y units)"])
        assert mean == pytest.approx(values.mean(), rel=1e-3) and std == pytest.approx(values.std(ddof=1), rel=1e-3)
        best = min(("sgpr", "svgp"), key=lambda m: np.mean([r["rmse_original"] for r in runs if r["method"] == m]))
        assert bold == (method == best)
    assert table["sgpr"]["paper RMSE (y units)"] == "2.5 ± 0.5" and table["svgp"]["paper RMSE (y units)"] == "–"
    assert table["sgpr"]["paper RMSE"] == "–"  # the paper gives no RMSE on standardised y


def test_papers_training_seconds_get_a_column_beside_ours(runs):
    """A published ``train_seconds`` (the Deep Basis Kernel paper's Table 1) adds the paper's training seconds as
    one column after the paper's s/epoch; a row the paper does not give gets a dash."""
    name = "test-report-seconds"
    published = {("sgpr", "pol"): {"rmse": 0.2, "train_seconds": 88.8, "train_seconds_std": 0.4}}
    register_protocol(Protocol(name=name, version=3, description="Total training seconds.",
                               methods=(MethodSpec("sgpr"), MethodSpec("svgp")), datasets={"pol": None},
                               published=published))
    try:
        table = markdown_table(summarise([dict(r, protocol=name) for r in runs]), "pol")
    finally:
        PROTOCOLS.pop(name)
    header, _, *lines = table.splitlines()
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert columns[-2:] == ["paper s/epoch", "paper train s"]
    cells = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")] for line in lines}
    assert cells["sgpr"][-1] == "88.8 ± 0.4" and cells["svgp"][-1] == "–"


def test_runs_trained_to_convergence_show_their_steps_and_auto_runs_the_method_they_fitted(runs):
    converged = [dict(r, steps=100 + 10 * i, converged=int(i != 1), fitted_method="sgpr" if r["method"] == "sgpr"
                      else None) for i, r in enumerate(runs)]
    header, _, *lines = markdown_table(summarise(converged), "pol").splitlines()
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert columns[-2:] == ["steps (converged)", "fitted"]
    cells = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")] for line in lines}
    for method in ("sgpr", "svgp"):
        mine = [r for r in converged if r["method"] == method and r["dataset"] == "pol" and r["status"] == "ok"]
        steps = np.mean([r["steps"] for r in mine])
        assert cells[method][-2] == f"{steps:.0f} ({sum(r['converged'] for r in mine)}/{len(mine)})"
    assert cells["sgpr"][-1] == "sgpr" and cells["svgp"][-1] == "–"


def test_tables_without_published_original_units_or_seconds_have_no_extra_columns(report):
    header = re.search(r"^### pol\n\n(\|.*)\n", report.read_text(encoding="utf-8"), flags=re.M).group(1)
    assert "RMSE (y units)" not in header and "paper train s" not in header and header.count("|") == 13


def test_mean_ranks_use_the_sets_where_every_method_ran_and_share_ties():
    def row(dataset, method, nlpd):
        return {"dataset": dataset, "method": method, "nlpd_mean": nlpd}

    rows = [row("a", "x", 0.1), row("a", "y", 0.2), row("a", "z", 0.3),
            row("b", "x", 0.5), row("b", "y", 0.4), row("b", "z", 0.5),  # x and z tie for 2nd and 3rd
            row("c", "x", 9.0), row("c", "y", 0.0)]  # z did not run on c: c is left out
    ranks, datasets = mean_ranks(rows)
    assert datasets == ["a", "b"]
    assert ranks == {"x": (1 + 2.5) / 2, "y": (2 + 1) / 2, "z": (3 + 2.5) / 2}


def test_a_time_reference_adds_seconds_per_epoch_over_the_references_and_skipped_runs_are_listed_apart(tmp_path):
    """A protocol with ``time_reference`` gets a table of every method's s/epoch on every dataset with its ratio to
    the reference's; a peer that predicts a mean only shows dashes for NLPD and coverage; a skipped run is listed
    with its note under "Skipped runs", not among the failed."""
    name = "test-report-times"
    methods = ("softki", "softki-official", "svgp")
    register_protocol(Protocol(name=name, version=1, description="Side by side.",
                               methods=tuple(MethodSpec(m) for m in methods), datasets={"pol": None, "kin40k": None},
                               time_reference="softki"))
    rng = np.random.default_rng(3)
    runs = [dict(record(m, ds, 0, rng), protocol=name, protocol_version=1) for ds in ("pol", "kin40k") for m in methods]
    mean_only = next(r for r in runs if (r["method"], r["dataset"]) == ("softki-official", "pol"))
    mean_only.update(nlpd=None, coverage=None, calibration=None)
    skipped = next(r for r in runs if (r["method"], r["dataset"]) == ("softki-official", "kin40k"))
    skipped.update(status="skipped", error="softki-official: not found; set GPSCALE_PEERS", rmse=None, nlpd=None,
                   seconds_per_epoch=None)
    path = tmp_path / "times.sqlite"
    results = ResultsStore(path)
    for run in runs:
        results.append(run)
    try:
        text = write_report(path, tmp_path / "out").read_text(encoding="utf-8")
    finally:
        PROTOCOLS.pop(name)
    table = text.split("### Seconds per epoch (over softki's)\n\n")[1].split("\n\n")[0].splitlines()
    assert table[0] == "| method | pol | kin40k |"
    rows = {line.split(" | ")[0].strip("| "): [c.strip(" |") for c in line.split(" | ")[1:]] for line in table[2:]}
    assert list(rows) == list(methods)
    seconds = {(r["method"], r["dataset"]): r["seconds_per_epoch"] for r in runs}
    for method in methods:
        for dataset, cell in zip(("pol", "kin40k"), rows[method]):
            if (method, dataset) == ("softki-official", "kin40k"):
                assert cell == "–"
                continue
            value, ratio = re.fullmatch(r"(\S+) \((\S+)×\)", cell).groups()
            assert float(value) == pytest.approx(seconds[method, dataset], rel=1e-3)
            assert float(ratio) == pytest.approx(seconds[method, dataset] / seconds["softki", dataset], rel=5e-3)
    pol = parse_tables(text)["pol"]["softki-official"]
    assert pol["NLPD"] == "–" and pol["95% cov."] == "–" and float(pol["RMSE"]) > 0
    skipped_section, failed_section = text.split("## Skipped runs")[1].split("## Failed runs")
    assert "kin40k / softki-official, split 0, seed 0: softki-official: not found; set GPSCALE_PEERS" in skipped_section
    assert failed_section.strip() == "None."


def test_a_classification_table_prints_the_papers_accuracy_and_seconds_per_step_beside_ours():
    """hvgp-conv-fmnist-short publishes the HKD paper's accuracy, NLL and seconds per iteration (its Table 2): the
    table gets our accuracy, the paper's, and both seconds per step, row by row."""
    runs = [{"protocol": "hvgp-conv-fmnist-short", "protocol_version": PROTOCOLS["hvgp-conv-fmnist-short"].version,
             "status": "ok", "dataset": "fashion_mnist", "method": method, "accuracy": accuracy, "nlpd": 1.2,
             "seconds_per_step": seconds}
            for method, accuracy, seconds in (("conv-M", 0.7368, 0.2), ("svgp-512", 0.8307, 0.08))]
    lines = markdown_table(summarise(runs), "fashion_mnist").splitlines()
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header[-3:] == ["paper accuracy", "s/step", "paper s/step"]
    cells = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")] for line in lines[2:]}
    column = {name: header.index(name) for name in ("accuracy", "paper accuracy", "s/step", "paper s/step")}
    assert [cells["conv-M"][column[name]] for name in column] == ["0.7368", "0.657 ± 0.0006", "0.2", "0.21"]
    assert [cells["svgp-512"][column[name]] for name in column] == ["0.8307", "–", "0.08", "–"]


def test_a_page_section_has_each_table_and_where_its_numbers_come_from(store, runs, tmp_path):
    """What a documentation page shows: the tables of the report (the same numbers), then the machine, commit,
    dates and commands of the runs, then the failed runs."""
    section = results_section(store)
    page_tables = parse_tables(re.sub(r"^\*\*(\S+)\*\*$", r"### \1", section, flags=re.M))
    report_tables = parse_tables(write_report(store, tmp_path / "report").read_text(encoding="utf-8"))
    assert set(page_tables) == {"pol", "elevators"}
    for dataset, table in page_tables.items():
        assert set(table) == set(report_tables[dataset])
        for method, row in table.items():  # the report's cells, less the columns no run has a value in
            assert row == {column: cell for column, cell in report_tables[dataset][method].items() if column in row}
            assert {"RMSE", "NLPD", "95% cov."} <= set(row)
        dropped = set(next(iter(report_tables[dataset].values()))) - set(next(iter(table.values())))
        assert all(cell == "–" for row in report_tables[dataset].values() for column, cell in row.items()
                   if column in dropped)
    assert "paper RMSE" in page_tables["pol"]["sgpr"]  # the paper's numbers where it has them
    sparse = [dict(run, protocol="not-registered") for run in runs]  # no published numbers: no paper columns
    unregistered = tmp_path / "unregistered.sqlite"
    results = ResultsStore(unregistered)
    for run in sparse:
        results.append(run)
    assert "paper RMSE" not in results_section(unregistered) and "| RMSE |" in results_section(unregistered)
    assert "- git_commit: abc1234" in section and "- machine: testbox" in section
    assert "- date: 2024-05-01T10:00:00 to 2024-05-02T10:00:00" in section
    assert "Cholesky failed" in section and "command" not in section  # these runs record none
    commanded = tmp_path / "commanded.sqlite"
    results = ResultsStore(commanded)
    for run in runs:
        results.append({**run, "command": f"gpscale bench --protocol {PROTOCOL} --splits {run['split']}"})
    assert results_section(commanded).count("- command: `gpscale bench") == 2


def test_cli_report_section_prints_it_and_a_report_needs_a_folder(store, capsys):
    assert main(["report", str(store), "--section"]) == 0
    assert capsys.readouterr().out == results_section(store)
    assert main(["report", str(store)]) == 2
    assert "--output" in capsys.readouterr().err


@pytest.mark.parametrize("failing", ["accuracy.png", "report.md"])
def test_a_full_disk_while_writing_a_report_keeps_the_earlier_one_and_says_where_and_what_to_do(
        tmp_path, store, full_disk, capsys, failing):
    import matplotlib.pyplot  # noqa: F401 - imported (and its caches written) before the disk fills

    out = tmp_path / "out"
    out.mkdir()
    earlier = {"report.md": b"# An earlier report\n", **{p: PNG_SIGNATURE + p.encode() for p in PLOTS}}
    for name, content in earlier.items():
        (out / name).write_bytes(content)
    dry = write_report(store, tmp_path / "dry", protocol=PROTOCOL).parent  # the plots of these runs, to size the disk
    plots = sum((dry / p).stat().st_size for p in PLOTS)
    full_disk(0 if failing == "accuracy.png" else plots + 100)
    assert main(["report", str(store), "-o", str(out), "--protocol", PROTOCOL]) == 2
    kept = earlier if failing == "accuracy.png" else {"report.md": earlier["report.md"]}
    assert {name: (out / name).read_bytes() for name in kept} == kept
    assert sorted(p.name for p in out.iterdir()) == sorted(earlier)  # no temporary file
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"gpscale: error: [Errno 28] could not write {out / failing} (No "
                                               f"space left on device); the earlier {failing} is left as it was.")

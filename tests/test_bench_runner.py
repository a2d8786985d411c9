import sqlite3
from dataclasses import replace

import pytest

from gpscale.bench.protocols import MethodSpec, Protocol, get_protocol
from gpscale.bench.report import write_report
from gpscale.bench.runner import run_protocol
from gpscale.bench.store import ResultsStore
from gpscale.cli import main

TINY = Protocol(
    name="tiny-test",
    version=1,
    description="a tiny protocol for tests",
    methods=(
        MethodSpec("sgpr", dict(n_inducing=16, epochs=3, lr=0.1)),
        MethodSpec("sgpr", dict(n_inducing=16, epochs=3, lr=0.1, no_such_option=1), label="broken"),
        MethodSpec("svgp", dict(n_inducing=16, epochs=2, batch_size=64, lr=0.05)),
        MethodSpec("gpytorch-sgpr", dict(n_inducing=16, epochs=3, lr=0.1)),
        MethodSpec("exact", dict(epochs=3, lr=0.1), max_n=100),
    ),
    datasets={"friedman1": None, "gp_sample": (1,)},
    splits=(0, 1),
    dataset_options={"friedman1": {"n": 300}, "gp_sample": {"n": 200}},
)


@pytest.fixture
def results(tmp_path):
    lines = []
    path = run_protocol(TINY, out_dir=tmp_path, progress=False, log=lines.append)
    return path, lines


def test_every_combination_runs_in_order_and_failures_are_recorded(results):
    path, lines = results
    runs = ResultsStore(path).runs()
    combos = [(r["dataset"], r["split"], r["method"]) for r in runs]
    methods = ["sgpr", "broken", "svgp", "gpytorch-sgpr"]  # exact skipped: n_train > max_n
    assert combos == [("friedman1", s, m) for s in (0, 1) for m in methods] + [("gp_sample", 1, m) for m in methods]
    broken = [r for r in runs if r["method"] == "broken"]
    assert all(r["status"] == "error" and "no_such_option" in r["error"] for r in broken)
    ok = [r for r in runs if r["method"] != "broken"]
    assert all(r["status"] == "ok" for r in ok)
    for r in ok:
        assert r["rmse"] > 0 and r["nlpd"] is not None and 0 <= r["coverage"] <= 1
        assert r["train_seconds"] > 0 and r["seconds_per_epoch"] > 0 and r["peak_memory_mb"] is not None
        assert r["n_train"] == 270 or r["n_train"] == 180
        assert r["torch_version"] and r["cores"] and r["date"] and len(r["calibration"]["levels"]) == 11
    assert len(lines) == len(runs) and "FAILED" in lines[1]


def test_resume_skips_finished_runs_but_retries_failures(results):
    path, _ = results
    before = len(ResultsStore(path).runs())
    lines = []
    run_protocol(TINY, out_dir=path.parent, progress=False, resume=True, log=lines.append)
    runs = ResultsStore(path).runs()
    assert len(runs) == before + 3  # only the three failed runs ran again
    assert sum("done already" in line for line in lines) == 9


def test_report_numbers_equal_the_stored_ones(results, tmp_path):
    path, _ = results
    report = write_report(path, tmp_path / "report").read_text()
    runs = [r for r in ResultsStore(path).runs() if r["dataset"] == "gp_sample" and r["status"] == "ok"]
    for r in runs:  # one split: the table shows the stored value itself, to 4 significant digits
        assert f"| {r['method']} | " in report
        assert f"{r['rmse']:.4g}" in report and f"{r['nlpd']:.4g}" in report
    assert "no_such_option" in report


def test_subset_selection_and_unknown_names(tmp_path):
    lines = []
    path = run_protocol(TINY, out_dir=tmp_path, methods=["svgp"], datasets=["gp_sample"], progress=False,
                        log=lines.append)
    assert [(r["method"], r["dataset"]) for r in ResultsStore(path).runs()] == [("svgp", "gp_sample")]
    with pytest.raises(ValueError, match="Unknown method"):
        run_protocol(TINY, out_dir=tmp_path, methods=["nope"], progress=False)


def test_store_rejects_a_foreign_file_and_another_schema(tmp_path):
    bad = tmp_path / "bad.sqlite"
    bad.write_text("not a database at all, just text that is long enough to be read as a header" * 20)
    with pytest.raises(ValueError, match="not a gpscale results file"):
        ResultsStore(bad)
    other = tmp_path / "other.sqlite"
    ResultsStore(other)
    with sqlite3.connect(other) as db:
        db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(ValueError, match="schema 99"):
        ResultsStore(other)


def test_datasets_missing_from_the_data_folder_are_skipped_with_a_note(tmp_path, monkeypatch):
    monkeypatch.delenv("GPSCALE_DATA", raising=False)
    protocol = replace(TINY, methods=TINY.methods[:1], datasets={"pol": None, "friedman1": (0,)},
                       requires_data=("pol",))
    lines = []
    path = run_protocol(protocol, out_dir=tmp_path, progress=False, log=lines.append)
    assert lines[0].startswith("skip pol: not in the data folder")
    assert [r["dataset"] for r in ResultsStore(path).runs()] == ["friedman1"]


def test_the_quick_protocol_has_a_generated_dataset_that_needs_no_data_folder():
    quick = get_protocol("quick")
    assert "friedman1" in quick.datasets and "friedman1" not in quick.requires_data
    assert quick.dataset_options["friedman1"]["n"] == 40_000


def test_cli_lists_protocols(capsys):
    assert main(["bench", "--list"]) == 0
    out = capsys.readouterr().out
    assert "quick" in out and "baselines" in out

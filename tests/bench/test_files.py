"""The ``files`` protocol: generated tables through the command line as a user runs it, each command measured in
its own process."""
import json

from gpscale.bench.files import NOISE_STD
from gpscale.cli import main


def test_the_files_protocol_fits_and_predicts_from_a_file_and_records_what_it_measured(tmp_path, capsys):
    assert main(["bench", "--protocol", "files", "--out", str(tmp_path), "--data-option", "rows=600",
                 "--data-option", "test_rows=300", "--data-option", "formats=csv"]) == 0
    assert "| csv |" in capsys.readouterr().out
    (record,) = json.loads((tmp_path / "files.json").read_text())
    assert record["rows"] == 600 and record["test_rows"] == 300 and record["method"] == "exact"
    assert NOISE_STD < record["rmse"] < 1.5 * NOISE_STD  # Friedman #1's function learnt, up to the noise
    assert 0.85 <= record["coverage"] <= 1.0
    assert 0.05 < record["fit_peak_gb"] < 8 and record["fit_seconds"] > record["training_seconds"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["files.json", "files.md"]  # the tables are removed


def test_the_protocol_is_listed(capsys):
    assert main(["bench", "--list"]) == 0
    assert any(line.startswith("files ") for line in capsys.readouterr().out.splitlines())


def test_a_wrong_option_or_format_is_named(tmp_path, capsys):
    assert main(["bench", "--protocol", "files", "--out", str(tmp_path), "--data-option", "rowz=10"]) == 2
    assert "takes --data-option formats, keep, rows, seed, test_rows; got rowz" in capsys.readouterr().err
    assert main(["bench", "--protocol", "files", "--out", str(tmp_path), "--data-option", "formats=feather"]) == 2
    assert "writes parquet and csv, not feather" in capsys.readouterr().err

"""The ``files`` protocol: the library's top end as a user with a file meets it. ``gpscale bench --protocol files``.

Generated Friedman #1 (10 inputs, 5 of them irrelevant, Gaussian noise of standard deviation 1: the noise floor of
the RMSE) is written as float32 Parquet and as CSV, ``rows`` training rows and ``test_rows`` test rows. For each
format the command line runs as a user runs it, each command in its own process:

    gpscale fit train.<format> --target y -o model.gps      (the defaults: method="auto")
    gpscale predict model.gps test.parquet -o predictions.parquet

and the protocol records, per format: the time of one streamed pass reading the training file, the fit's wall time
(reading, scaling, staging the rows on disk, training, the posterior), the prediction's wall time, each command's
peak resident memory (the kernel's high-water mark of the command's process, ``ru_maxrss``), the method the defaults
chose, and the test RMSE, NLPD and 95% coverage of the predictions against the noisy test targets.

``--data-option rows=10000000 test_rows=1000000`` sets the sizes (default: 100,000 and 10,000, a run of a minute);
``--data-option formats=parquet`` runs one format. The files are written under ``--out`` and removed at the end
unless ``keep=1``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from ..data import make_friedman1
from ..io import write_atomically
from ..metrics import coverage, nlpd, rmse

__all__ = ["FILES_DESCRIPTION", "FILES_PROTOCOL", "run_files"]

FILES_PROTOCOL = "files"
FILES_DESCRIPTION = ("Friedman #1 (10 inputs, noise sd 1) as float32 Parquet and CSV files through `gpscale fit` "
                     "and `gpscale predict` with the defaults: read, fit and predict time, peak memory, RMSE, NLPD, "
                     "coverage (--data-option rows=N test_rows=M)")
NOISE_STD = 1.0
WRITE_BLOCK = 1 << 20  # rows generated and written at a time
FORMATS = ("parquet", "csv")


def run_files(out: str | Path, rows: int = 100_000, test_rows: int = 10_000, formats: str = "parquet,csv",
              keep: bool = False, seed: int = 0) -> Path:
    """Run the protocol (module docstring); returns the path of its report (``files.md``, beside ``files.json``).
    The generated tables are removed at the end, however it ends, unless ``keep``."""
    kinds = formats.split(",")
    unknown = sorted(set(kinds) - set(FORMATS))
    if unknown:
        raise ValueError(f"formats={formats!r}: the files protocol writes {' and '.join(FORMATS)}, not "
                         f"{', '.join(unknown)}.")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    names = [f"x{j}" for j in range(10)]
    test = out / "test.parquet"
    written = [test]
    records = []
    try:
        _write(test, names, test_rows, seed + 1, "parquet")
        for kind in kinds:
            train = out / f"train.{kind}"
            written.append(train)
            _write(train, names, rows, seed, kind)
            records.append(_run_one(train, test, out, rows))
            if not keep:
                train.unlink()
    finally:
        if not keep:
            for path in written + [out / "model.gps", out / "predictions.parquet"]:
                path.unlink(missing_ok=True)
    (out / "files.json").write_text(json.dumps(records, indent=2))
    page = out / "files.md"
    report = _report(records, rows, test_rows)
    write_atomically(page, lambda f: f.write(report), text=True)
    return page


def _write(path: Path, names: list[str], n: int, seed: int, kind: str) -> None:
    """n rows of Friedman #1 (float32 features, and y) written a block at a time."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    schema = pa.schema([(name, pa.float32()) for name in names] + [("y", pa.float64())])
    writer = pq.ParquetWriter(path, schema) if kind == "parquet" else pacsv.CSVWriter(path, schema)
    with writer:
        for start in range(0, n, WRITE_BLOCK):
            X, y = make_friedman1(min(WRITE_BLOCK, n - start), rng, noise_std=NOISE_STD, d=len(names))
            columns = [pa.array(X[:, j].astype(np.float32)) for j in range(len(names))] + [pa.array(y)]
            writer.write_table(pa.Table.from_arrays(columns, schema=schema))


def _run_one(train: Path, test: Path, out: Path, rows: int) -> dict:
    from ..sources import Table

    tic = time.perf_counter()
    read_rows = sum(len(X) for X, _ in Table(train, target="y").blocks())
    read_seconds = time.perf_counter() - tic
    assert read_rows == rows, (read_rows, rows)
    model, predictions = out / "model.gps", out / "predictions.parquet"
    fit = _timed([sys.executable, "-m", "gpscale", "fit", str(train), "--target", "y", "-o", str(model), "--quiet"])
    predict = _timed([sys.executable, "-m", "gpscale", "predict", str(model), str(test), "-o", str(predictions),
                      "--quiet"])
    from ..estimator import load

    fitted = load(model)
    import pyarrow.parquet as pq

    y = pq.read_table(test, columns=["y"]).column(0).to_numpy()
    got = pq.read_table(predictions)
    mean, std = got.column("mean").to_numpy(), got.column("std").to_numpy()
    record = {"format": train.suffix[1:], "rows": rows, "test_rows": len(y), "file_mb": train.stat().st_size / 1e6,
              "read_seconds": read_seconds, "fit_seconds": fit["seconds"], "fit_peak_gb": fit["peak_gb"],
              "training_seconds": fitted.training_["seconds"], "method": fitted.method_,
              "steps": fitted.training_["steps"], "predict_seconds": predict["seconds"],
              "predict_peak_gb": predict["peak_gb"], **_scores(y, mean, std)}
    model.unlink()
    predictions.unlink()
    return record


# Runs a command in a process forked from this small one and writes the command's peak resident memory (KB) to the
# file named by its first argument. Linux counts into a child's ru_maxrss the memory its parent had at the fork (the
# copied page tables, recorded at exec), so a child of the benchmark itself, which has read the training file, would
# report the benchmark's memory instead of its own.
_LAUNCHER = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
open(sys.argv[1], "w").write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def _timed(command: list[str]) -> dict:
    """Run ``command`` (its first element an executable's path); its wall seconds and its peak resident memory in
    GB (its ``ru_maxrss``, taken by a small launcher process, see ``_LAUNCHER``)."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        peak = Path(folder) / "peak"
        tic = time.perf_counter()
        done = subprocess.run([sys.executable, "-S", "-c", _LAUNCHER, str(peak), *command], capture_output=True,
                              text=True, check=False, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        seconds = time.perf_counter() - tic
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
        return {"seconds": seconds, "peak_gb": int(peak.read_text()) * 1024 / 1e9}  # Linux reports kilobytes


def _scores(y: np.ndarray, mean: np.ndarray, std: np.ndarray) -> dict:
    var = std**2
    return {"rmse": rmse(y, mean), "nlpd": nlpd(y, mean, var), "coverage": coverage(y, mean, var),
            "noise_floor_rmse": NOISE_STD}


def _report(records: list[dict], rows: int, test_rows: int) -> str:
    lines = [f"# files: {rows:,} training rows, {test_rows:,} test rows", "",
             ("Friedman #1, 10 float32 inputs, noise sd 1 (the RMSE's floor). `gpscale fit FILE --target y` with the "
              "defaults, then `gpscale predict` to Parquet, each in its own process; peak memory is the process's "
              "resident high-water mark."), "",
             ("| format | file MB | read s | fit s | fit peak GB | method | steps | predict s | predict peak GB | "
              "RMSE | NLPD | coverage |"), "|" + "---|" * 12]
    for r in records:
        lines.append(f"| {r['format']} | {r['file_mb']:.0f} | {r['read_seconds']:.1f} | {r['fit_seconds']:.0f} | "
                     f"{_gb(r['fit_peak_gb'])} | {r['method']} | {r['steps']} | {r['predict_seconds']:.1f} | "
                     f"{_gb(r['predict_peak_gb'])} | {r['rmse']:.4f} | {r['nlpd']:.4f} | {r['coverage']:.3f} |")
    return "\n".join(lines) + "\n"


def _gb(value: float) -> str:
    return f"{value:.2f}"

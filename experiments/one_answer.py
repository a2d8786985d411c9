"""How far a data-parallel fit at the library's defaults is from the one-process fit, beside how far a harmless
change moves the one-process fit: ``python -m experiments.one_answer --n 4000``.

n training rows of x ~ U[-2, 2]^4, y = sin(2 x_1) + x_2^2 / 2 - x_3 x_4 + N(0, 0.1^2), and 1,000 test rows; for each
method, ``gpscale fit`` with its defaults (dtype, training to convergence) run as a user runs it: in one process on
one thread, under ``torchrun`` in two processes of one thread each (``--distributed``), and in one process on two
threads. Prints one JSON record: for each method the largest difference of the predictive mean and of the std
between the one-process fit and each of the others, and the smallest predictive std. docs/distributed.md quotes it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

RUNS = {"one process": (1, 1), "two processes": (2, 1), "two threads": (1, 2)}  # processes, threads each


def write_data(folder: Path, n: int, seed: int = 0) -> tuple[Path, Path]:
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, (n + 1000, 4))
    y = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] ** 2 - X[:, 2] * X[:, 3] + 0.1 * rng.standard_normal(len(X))
    train, test = folder / "train.csv", folder / "test.csv"
    np.savetxt(train, np.c_[X[:n], y[:n]], delimiter=",", header="x1,x2,x3,x4,y", comments="")
    np.savetxt(test, X[n:], delimiter=",", header="x1,x2,x3,x4", comments="")
    return train, test


def fit_and_predict(method: str, processes: int, threads: int, train: Path, test: Path, folder: Path) -> np.ndarray:
    """The (mean, std) columns [1000, 2] of ``gpscale predict`` with the model ``gpscale fit`` trained."""
    tag = f"{method}-{processes}x{threads}"
    model, predictions = folder / f"{tag}.gps", folder / f"{tag}.csv"
    fit = ["-m", "gpscale", "fit", str(train), "--target", "y", "--method", method, "--quiet", "-o", str(model)]
    if processes > 1:
        fit = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes), *fit,
               "--distributed"]
    environment = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    subprocess.run([sys.executable, *fit], env=environment, check=True, capture_output=True)
    subprocess.run([sys.executable, "-m", "gpscale", "predict", str(model), str(test), "-o", str(predictions)],
                   env=environment, check=True, capture_output=True)
    return np.loadtxt(predictions, delimiter=",", skiprows=1)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4000)
    parser.add_argument("--methods", default="svgp,softki,sgpr")
    args = parser.parse_args(argv)
    record = {"n": args.n, "methods": {}}
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        train, test = write_data(folder, args.n)
        for method in args.methods.split(","):
            runs = {label: fit_and_predict(method, *shape, train, test, folder) for label, shape in RUNS.items()}
            one = runs["one process"]
            record["methods"][method] = {
                "smallest_std": float(one[:, 1].min()),
                **{label: {"mean": float(np.abs(run[:, 0] - one[:, 0]).max()),
                           "std": float(np.abs(run[:, 1] - one[:, 1]).max())}
                   for label, run in runs.items() if label != "one process"}}
    print(json.dumps(record, indent=1))
    return record


if __name__ == "__main__":
    main()

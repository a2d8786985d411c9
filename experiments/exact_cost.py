"""What the exact GP's iterative solver costs against its Cholesky factor, on one machine:
``python -m experiments.exact_cost --dataset kin40k --n 10000`` (``--dataset friedman1`` needs no data folder).

The first n training rows of split 0 (Friedman #1: n generated rows), hyperparameters from the exact evidence of
``--evidence-rows`` of them, then the posterior of all n by the Cholesky factor (seconds, prediction seconds for the
first 1,000 test rows) and by conjugate gradients with the rank-100 pivoted-Cholesky preconditioner: the seconds of
one product with K, the iterations and seconds to each tolerance with alpha's relative error against the factor's,
the same without a preconditioner at 1e-6, and the Lanczos variance cache's error at two ranks. Prints one JSON
record; docs/exact.md quotes its numbers.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from gpscale.data import load_dataset
from gpscale.iterative import Preconditioner, cg
from gpscale.models.exact.blocked_kernel import BlockedKernel
from gpscale.models.exact.gp import ExactGP
from gpscale.train import fit


def timed(work):
    tic = time.perf_counter()
    value = work()
    return value, time.perf_counter() - tic


def measure(dataset: str, n: int, evidence_rows: int, tolerances=(1e-4, 1e-6, 1e-8), ranks=(64, 256)) -> dict:
    ds = load_dataset(dataset, n=int(n / 0.9) + 1) if dataset == "friedman1" else load_dataset(dataset, split=0)
    X, y = torch.tensor(ds.X_train[:n]), torch.tensor(ds.y_train[:n])
    Xs = torch.tensor(ds.X_test[:1000])
    model = ExactGP(X.shape[1], evidence_rows=evidence_rows, inference="cholesky").double()
    model.start_lengthscale_at_median()
    fit(model, X, y, progress=False)
    record = {"dataset": dataset, "n": X.shape[0], "noise": model.noise.item(),
              "cholesky_seconds": timed(lambda: model.fit_posterior(X, y))[1]}
    (mean, var), record["predict_seconds"] = timed(lambda: model.predict(Xs))
    op, noise = BlockedKernel(model.kernel, X), model.noise.detach()
    P, record["preconditioner_seconds"] = timed(lambda: Preconditioner.from_operator(op, noise, 100))
    record["product_seconds"] = timed(lambda: op.matmul(torch.ones(X.shape[0], 1, dtype=X.dtype)))[1]
    alpha = model.cache["alpha"]
    record["cg"] = []
    for tol in tolerances:
        run, seconds = timed(lambda: cg(op, noise, y.unsqueeze(-1), preconditioner=P, tol=tol, max_iterations=5000))
        error = ((run.solution[:, 0] - alpha).norm() / alpha.norm()).item()
        record["cg"].append({"tol": tol, "iterations": run.iterations, "seconds": seconds, "alpha_error": error})
    run, seconds = timed(lambda: cg(op, noise, y.unsqueeze(-1), tol=1e-6, max_iterations=5000))
    record["cg_unpreconditioned"] = {"tol": 1e-6, "iterations": run.iterations, "seconds": seconds}
    model.inference, model.cg_tolerance, record["lanczos"] = "iterative", 1e-6, []
    for rank in ranks:
        model.variance_rank = rank
        seconds = timed(lambda: model.fit_posterior(X, y))[1]
        mean_it, var_it = model.predict(Xs)
        error = (var_it - var) / var
        record["lanczos"].append({"rank": rank, "posterior_seconds": seconds,
                                  "mean_error": ((mean_it - mean).abs().max() / mean.abs().max()).item(),
                                  "variance_error_median": error.median().item(),
                                  "variance_error_max": error.max().item()})
    return record


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="friedman1")
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--evidence-rows", type=int, default=1000)
    args = parser.parse_args(argv)
    record = measure(args.dataset, args.n, args.evidence_rows)
    print(json.dumps(record, indent=1))
    return record


if __name__ == "__main__":
    main()

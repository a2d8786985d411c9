"""The ``gpscale`` command: fit and predict from table files (CSV, TSV, Parquet, Feather, .npy, .npz: see
:mod:`gpscale.tables`), run benchmarks, list and download datasets.

Every error a user can cause (bad usage, options, data or files) is one line on stderr, ``gpscale: error: ...``, with
exit status 2, as argparse's own usage errors. An interrupt (Ctrl-C) exits 130; SIGTERM and SIGUSR1 (a scheduler's
notice) exit 128 + the signal's number (143, 138), each with a line saying what was saved and how to continue. A
``gpscale fit --checkpoint`` stops at the next step boundary with its state saved there.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import numpy as np

from .distributed import leave_job
from .preemption import Stopped, stop_signals

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    args.command = shlex.join(["gpscale", *argv])  # recorded with every benchmark run
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    try:
        with stop_signals():  # SIGTERM and SIGUSR1 end the command as Ctrl-C does, with a message
            code = args.run(args) or 0
    except BrokenPipeError:  # output piped into e.g. `head`
        code = 0
    except KeyboardInterrupt as stop:
        print(f"gpscale{_process()}: {_stop_message(stop, args)}", file=sys.stderr)
        code = stop.exit_status if isinstance(stop, Stopped) else 130
    except (ValueError, OSError, RuntimeError, MemoryError) as err:  # MemoryError: the memory guard's refusals
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"gpscale{_process()}: error: {message}", file=sys.stderr)
        code = 2
    return leave_job(code)  # a data-parallel command's processes end at once, whatever the outcome


def _process() -> str:
    """`` (process R)`` in a data-parallel job's processes but the first, whose messages then say whose they are."""
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    return f" (process {rank})" if rank else ""


def _stop_message(stop: KeyboardInterrupt, args) -> str:
    """What an interrupted command tells its user: what stopped it, and where its training state is."""
    what = f"stopped by {stop.signal_name}" if isinstance(stop, Stopped) else "interrupted"
    checkpoint = getattr(args, "checkpoint", None)
    again = "run the same command" + ("" if getattr(args, "resume", True) else " with --resume")
    if isinstance(stop, Stopped) and stop.checkpoint is not None:
        return (f"{what}; the training state after {stop.step} steps is saved in {stop.checkpoint}: {again} to "
                "continue from it")
    if checkpoint is not None and Path(checkpoint).exists():
        return f"{what}; the last finished epoch is in {checkpoint}: {again} to continue from it"
    if args.run is _fit:
        return f"{what}; nothing was saved (pass --checkpoint FILE to be able to resume a stopped fit)"
    return what


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpscale", description="Scalable Gaussian-process regression.")
    sub = parser.add_subparsers(title="commands")

    p = sub.add_parser("fit", help="train a model on a table file and save it")
    p.add_argument("data", type=Path,
                   help="a table: CSV or TSV with a header row, Parquet, Feather (Arrow IPC), .npy or .npz, by its "
                        "extension; every column but the target is a feature")
    p.add_argument("--target", required=True, help="name of the target column")
    p.add_argument("--method", default="auto",
                   help="auto (default: chosen by the data's size, see docs/choosing.md), exact, sgpr, svgp, ...")
    p.add_argument("--classify", action="store_true",
                   help="the target holds class labels: a GPClassifier (probit for two classes, robust-max for "
                        "more) with a variational method")
    p.add_argument("-o", "--output", type=Path, required=True, help="model file to write (e.g. model.gps)")
    # every default below is the estimator's (None: the method's, declared on its model class), so the command line
    # and the Python API fit the same model
    p.add_argument("--n-inducing", type=int, default=None, help="default: the method's")
    p.add_argument("--epochs", type=int, default=None,
                   help="passes over the data with Adam (default: train until the objective has converged)")
    p.add_argument("--max-steps", type=int, default=None,
                   help="the cap of training to convergence, in optimiser steps (default: the method's)")
    p.add_argument("--batch-size", type=int, default=None, help="default: the method's (1024)")
    p.add_argument("--lr", type=float, default=None, help="Adam's learning rate (default: the method's)")
    p.add_argument("--optimizer", default=None, choices=["adam", "lbfgs"],
                   help="default: lbfgs for full-batch methods trained to convergence, else adam")
    p.add_argument("--kernel", default=None, help="default: the method's (rbf; matern32 for vff)")
    p.add_argument("--val-fraction", type=float, default=None,
                   help="default: the method's (0 but for dbk and softki: 0.1 when training to convergence)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="auto", choices=["auto", "float64", "float32"],
                   help="default: auto, float32 for the methods where it measured as accurate and faster "
                        "(svgp, softki, hvgp, odvgp, odvff, svdbk, dbk, conv-*), float64 for the others")
    p.add_argument("--device", default="cpu")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a method option, repeatable (e.g. --option solver=qr)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--distributed", action="store_true",
                   help="data-parallel under torchrun: each process reads and trains on its block of the rows; "
                        "rank 0 writes the model (see docs/distributed.md)")
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="write the training state here after every epoch (full-batch methods then train with "
                        "Adam: L-BFGS keeps no state to resume)")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint if it exists")
    p.set_defaults(run=_fit)

    p = sub.add_parser("predict", help="predict with a saved model; writes mean and std columns")
    p.add_argument("model", type=Path)
    p.add_argument("data", type=Path, help="a table file (as for fit) holding the model's feature columns")
    p.add_argument("-o", "--output", type=Path, required=True,
                   help="the predictions, written a chunk of rows at a time: CSV, TSV or Parquet, by its extension")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=_predict)

    p = sub.add_parser("bench", help="run a benchmark protocol; results go to OUT/results.sqlite and a report")
    p.add_argument("--protocol", default="quick", help="quick, baselines, ... (default: quick)")
    p.add_argument("--methods", type=_names, default=None, help="comma-separated subset of the protocol's methods")
    p.add_argument("--datasets", type=_names, default=None, help="comma-separated subset of its datasets")
    p.add_argument("--splits", type=_ints, default=None, help="comma-separated splits (default: the protocol's)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default: results/PROTOCOL)")
    p.add_argument("--resume", action="store_true", help="skip runs already in the results file")
    p.add_argument("--data-dir", default=None, help="data folder (default: $GPSCALE_DATA)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="replace a method option for every method run, repeatable (e.g. --option epochs=2; "
                        "comma-separated values give a sequence: --option init_stretch=1,4); the results record the "
                        "options that ran")
    p.add_argument("--data-option", action="append", default=[], metavar="KEY=VALUE",
                   help="replace a data-loading option on every data set, repeatable (e.g. --data-option "
                        "x_scaling=standard; the options of gpscale.data.load_dataset); the results record them")
    p.add_argument("--distributed", action="store_true",
                   help="data-parallel under torchrun: each process trains on its block of the training rows; "
                        "rank 0 scores, stores and reports")
    p.add_argument("--list", action="store_true", help="list the protocols and exit")
    p.set_defaults(run=_bench)

    p = sub.add_parser("step-time", help="CPU seconds per training step of a minibatch method on random data")
    p.add_argument("method", help="odvff, odvgp, svgp, ...")
    p.add_argument("--d", type=int, required=True, help="input dimensions")
    p.add_argument("--batch-size", type=int, default=400)
    p.add_argument("--steps", type=int, default=5, help="steps timed, after one warm-up step")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a method option, repeatable (e.g. --option n_frequencies=50)")
    p.set_defaults(run=_step_time)

    p = sub.add_parser("report", help="write a markdown report with plots from a results file")
    p.add_argument("results", type=Path, nargs="+", help="results.sqlite file(s) written by `gpscale bench`")
    p.add_argument("-o", "--output", type=Path, default=None, help="output folder")
    p.add_argument("--protocol", default=None, help="only this protocol's runs")
    p.add_argument("--section", action="store_true",
                   help="print the runs' tables and provenance as markdown (what the documentation's pages show) "
                        "instead of writing a report")
    p.set_defaults(run=_report)

    p = sub.add_parser("data", help="list or download benchmark datasets")
    data_sub = p.add_subparsers(title="data commands")
    q = data_sub.add_parser("list", help="datasets known to gpscale and whether they are on disk")
    q.add_argument("--data-dir", type=Path, default=None)
    q.set_defaults(run=_data_list)
    q = data_sub.add_parser("download", help="fetch a UCI dataset from its upstream repository")
    q.add_argument("name")
    q.add_argument("--data-dir", type=Path, default=None, help="destination (default: $GPSCALE_DATA)")
    q.add_argument("--base-url", default=None, help=argparse.SUPPRESS)
    q.set_defaults(run=_data_download)
    return parser


def _fit(args) -> None:
    from .distributed import LOCAL, TorchComm, process_device
    from .estimator import GPClassifier, GPRegressor
    from .io import check_writable
    from .sources import Table

    options = _parse_options(args.option, typed=True)
    check_writable(args.output)  # before training, not after
    comm, device = LOCAL, args.device
    if args.distributed:
        comm, device = TorchComm.from_env(device), process_device(device)
    table = Table(args.data, target=args.target)
    common = dict(method=args.method, n_inducing=args.n_inducing, epochs=args.epochs, max_steps=args.max_steps,
                  batch_size=args.batch_size, lr=args.lr, kernel=args.kernel, val_fraction=args.val_fraction,
                  seed=args.seed, dtype=args.dtype, device=device, progress=not args.quiet,
                  distributed=args.distributed, checkpoint=args.checkpoint, resume=args.resume, **options)
    if args.classify:
        if args.optimizer not in (None, "adam"):
            raise ValueError("--classify trains with Adam on minibatches; drop --optimizer.")
        reg = GPClassifier(**common)
    else:
        reg = GPRegressor(optimizer=args.optimizer, **common)
    reg.fit(table)
    reg.save(args.output, metadata={"feature_names": table.features, "target": args.target})
    if comm.rank == 0:
        where = f" ({comm.world_size} processes)" if comm.world_size > 1 else ""
        print(f"fitted {reg.method_} on {reg.training_['rows']} rows x {len(table.features)} features in "
              f"{reg.training_seconds_:.1f} s{where}; saved {args.output}")


def _predict(args) -> None:
    from .estimator import GPClassifier, load, named_blocks
    from .io import check_writable
    from .sources import Table
    from .tables import check_output_format, write_table
    from .train import progress_bar

    check_writable(args.output)
    check_output_format(args.output)
    reg = load(args.model)
    table = Table(args.data)
    names = reg.metadata_.get("feature_names")  # other columns are not read
    if isinstance(reg, GPClassifier):  # the most probable label, then each class's probability
        header = ["label", *(f"p_{c}" for c in reg.classes_.tolist())]
    else:
        header = ["mean", "std"]

    def predictions(part: np.ndarray) -> list[np.ndarray]:
        if isinstance(reg, GPClassifier):
            proba = reg.predict_proba(part)
            return [reg.classes_[proba.argmax(1)].astype(str), *proba.T]
        return list(reg.predict(part, return_std=True))

    bar = progress_bar(desc="predict", unit="row", enabled=not args.quiet, delay=2.0)

    def chunks():
        for X, _ in table.blocks(features=names, rows=PREDICT_CHUNK_ROWS, target=False):
            with named_blocks():
                yield predictions(X)
            bar.update(len(X))

    with bar:
        rows = write_table(args.output, header, chunks())
    print(f"wrote {rows} predictions to {args.output}")


# rows read, predicted and written at a time by ``gpscale predict`` from a columnar file (a CSV's blocks are
# pyarrow's); a row's prediction does not depend on the other rows of its block (GPModel.in_chunks)
PREDICT_CHUNK_ROWS = 65_536


def _bench(args) -> None:
    import inspect
    import time

    from .distributed import LOCAL, TorchComm, process_device
    from .bench.files import FILES_DESCRIPTION, FILES_PROTOCOL, run_files
    from .bench.floor import FLOOR_DESCRIPTION, FLOOR_PROTOCOL, run_floor
    from .bench.protocols import PROTOCOLS, get_protocol
    from .bench.report import print_table, write_report
    from .bench.runner import run_protocol
    from .bench.store import ResultsStore

    if args.list:
        for p in PROTOCOLS.values():
            print(f"{p.name:<16} v{p.version}  {p.description}")
        print(f"{'floor':<16}     {FLOOR_DESCRIPTION}")
        print(f"{FILES_PROTOCOL:<16}     {FILES_DESCRIPTION}")
        return
    if args.protocol == FILES_PROTOCOL:
        options = _parse_options(args.data_option, typed=True)
        known = set(inspect.signature(run_files).parameters) - {"out"}
        if set(options) - known:
            raise ValueError(f"The files protocol takes --data-option {', '.join(sorted(known))}; got "
                             f"{', '.join(sorted(set(options) - known))}.")
        page = run_files(args.out or Path("results") / FILES_PROTOCOL, **options)
        print(page.read_text())
        print(f"report: {page}")
        return
    if args.protocol == FLOOR_PROTOCOL:
        page = run_floor(args.out or Path("results") / "floor", methods=args.methods)
        print(page.read_text())
        print(f"report: {page}")
        return
    comm, device = LOCAL, args.device
    if args.distributed:
        comm, device = TorchComm.from_env(device), process_device(device)
    protocol = get_protocol(args.protocol)
    out = args.out or Path("results") / protocol.name
    say = print if comm.rank == 0 else (lambda *_: None)
    say(f"gpscale bench: protocol {protocol.name} v{protocol.version}: {protocol.description}")
    tic = time.perf_counter()
    path = run_protocol(protocol, out_dir=out, methods=args.methods, datasets=args.datasets, splits=args.splits,
                        data_dir=args.data_dir, resume=args.resume, device=device, comm=comm,
                        options=_parse_options(args.option, typed=True),
                        data_options=_parse_options(args.data_option), command=args.command)
    if comm.rank != 0:  # rank 0 writes the report
        return
    runs = ResultsStore(path).runs(protocol.name)
    print()
    print(print_table(runs))
    report = write_report(path, out, protocol=protocol.name)
    plots = ", ".join(str(p) for p in sorted(out.glob("*.png"))) or "none"
    print(f"\nresults: {path}\nreport:  {report}\nplots:   {plots}")
    print(f"wall time: {time.perf_counter() - tic:.0f} s")
    ran = [r for r in runs if r["status"] != "skipped"]  # a skipped peer is not a failure
    if ran and all(r["status"] != "ok" for r in ran):
        raise RuntimeError(f"every one of the {len(ran)} runs failed; {report} lists their errors.")


def _report(args) -> None:
    from .bench.report import results_section, write_report

    for path in args.results:
        if not path.exists():
            raise ValueError(f"{path}: no such results file.")
    if args.section:
        print(results_section(args.results, protocol=args.protocol), end="")
        return
    if args.output is None:
        raise ValueError("gpscale report needs -o/--output FOLDER for the report and its plots (or --section).")
    print(f"report: {write_report(args.results, args.output, protocol=args.protocol)}")


def _names(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _ints(text: str) -> list[int]:
    try:
        return [int(t) for t in _names(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _data_list(args) -> None:
    from .data import list_datasets

    rows = list_datasets(args.data_dir)
    print(f"{'name':<32} {'kind':<10} {'n':>8} {'d':>5}  available")
    for r in rows:
        n = "" if r["n"] is None else r["n"]
        d = "" if r["d"] is None else r["d"]
        print(f"{r['name']:<32} {r['kind']:<10} {n:>8} {d:>5}  {'yes' if r['available'] else 'no'}")


def _data_download(args) -> None:
    from .data import UCI_BASE_URL, data_dir, download_uci

    dest = data_dir(args.data_dir)
    if dest is None:
        raise ValueError("Where should the data go? Pass --data-dir DIR or set GPSCALE_DATA.")
    path = download_uci(args.name, dest, base_url=args.base_url or UCI_BASE_URL)
    print(f"saved {path}")


def _step_time(args) -> int:
    from .bench.step_time import step_seconds

    options = _parse_options(args.option, typed=True)
    seconds = step_seconds(args.method, args.d, options, args.batch_size, steps=args.steps)
    print(f"{args.method} d={args.d} {options} batch {args.batch_size}: {seconds:.3f} CPU s per step")
    return 0


def _parse_options(pairs: list[str], typed: bool = False) -> dict:
    """``KEY=VALUE`` pairs as a dict of Python values. With ``typed``, the value of an option that some method
    declares boolean must read as one (true/false, yes/no, on/off, 1/0): ``ard=maybe`` is an error, not a string
    that counts as true."""
    from .estimator import boolean_options

    booleans = boolean_options() if typed else set()
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--option and --data-option take KEY=VALUE, got {pair!r}.")
        key = key.strip().replace("-", "_")
        options[key] = _boolean(key, value.strip()) if key in booleans else _literal(value.strip())
    return options


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def _boolean(key: str, text: str) -> bool:
    if text.lower() in _TRUE + _FALSE:
        return text.lower() in _TRUE
    raise ValueError(f"--option {key}={text}: {key} is true or false ({'/'.join(_TRUE)} or {'/'.join(_FALSE)}).")


def _literal(text: str):
    if "," in text:  # a sequence, e.g. init_stretch=1,2,4
        return tuple(_literal(part.strip()) for part in text.split(","))
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


if __name__ == "__main__":
    sys.exit(main())

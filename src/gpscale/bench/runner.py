"""Run a protocol: every (dataset, split, seed, method) in a fixed order, in one process, each run recorded.

A run that fails is recorded with its error and the suite goes on. Every gpscale method runs through the public
estimator, ``GPRegressor(method=key, **options)`` (``GPClassifier`` for a classification likelihood), as a user
would run it: a published reproduction is a call anyone can make. The data set arrives scaled with its training
statistics (:func:`gpscale.data.load_dataset`) and the estimator is told the same scaling, so its own scaling
changes the rows by round-off only. Ours and the peers (GPyTorch's models, the SoftKI authors' code) run on the same
data, inducing points from the same seeded k-means, in the same process, so their times compare as ratios. A peer
whose code is not on this machine (``softki-official`` without the authors' folder) is recorded as skipped, with a
note of where it was looked for. A method entry that differs from an earlier one on the same split only in the
model's ``posterior_options`` (SoftKI's ``calibrate_noise``) reuses that trained estimator and refits only its
posterior (:meth:`gpscale.GPRegressor.refit_posterior`); its record names the run it reused and counts that run's
training time and peak memory.
"""
from __future__ import annotations

import copy
import inspect
import json
import os
import platform
import subprocess
import time
import warnings
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from .. import metrics
from .._version import __version__
from ..data import data_dir as resolve_data_dir
from ..data import load_dataset
from ..distributed import LOCAL, Comm
from ..likelihoods import MULTICLASS
from ..models import available_methods, get_model_class
from ..models.base import option_default
from ..models.inducing import kmeans_centers
from ..shards import row_blocks
from .memory import PeakMemory
from .official_softki import PeerUnavailable
from .protocols import MethodSpec, Protocol, is_peer
from .store import ResultsStore, identity

__all__ = ["run_protocol", "run_one", "machine_info"]

# the training settings of a method entry (the peers take epochs, batch_size and lr)
TRAINING_OPTIONS = ("epochs", "max_steps", "batch_size", "lr", "optimizer", "val_fraction", "patience", "val_every")
# a method entry with this key runs gpscale.GPRegressor(**options) (method "auto" unless the options name one): the
# library as a user gets it
ESTIMATOR = "estimator"
CLASSIFICATION = ("bernoulli", *MULTICLASS)
CALIBRATION_LEVELS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99]


def run_protocol(protocol: Protocol, *, out_dir: str | Path, methods: list[str] | None = None,
                 datasets: list[str] | None = None, splits: list[int] | None = None, data_dir: str | None = None,
                 resume: bool = False, device: str = "cpu", progress: bool = True,
                 log: Callable[[str], None] = print, comm: Comm = LOCAL, options: dict | None = None,
                 data_options: dict | None = None, command: str | None = None) -> Path:
    """Run ``protocol`` (optionally a subset) and append every run to ``out_dir/results.sqlite``.

    Datasets in ``protocol.requires_data`` are skipped, with a note, when the data folder does not have them.
    Returns the path of the results file. Under data parallelism (``comm`` of W processes, all running this with
    the same arguments) each process trains on its block of the training rows, and rank 0 scores the test set,
    writes the results and logs; the peers, which run in one process, are recorded as errors.
    ``options`` replace the protocol's method options (e.g. ``{"epochs": 2}``) in every run, and ``data_options``
    its :func:`~gpscale.data.load_dataset` options (e.g. ``{"x_scaling": "standard"}``) on every data set; the
    latter are recorded in each run's options under ``"data"``. ``command``, the command line that asked for the run,
    is recorded with it.
    """
    _check_data_options(data_options)
    if comm.rank == 0:  # rank 0 creates the results file; the others open it after (for --resume)
        store = ResultsStore(Path(out_dir) / "results.sqlite")
    comm.barrier()
    if comm.rank != 0:
        store = ResultsStore(Path(out_dir) / "results.sqlite")
    done = store.completed(protocol.name, protocol.version) if resume else set()
    specs = _select(protocol.methods, methods, lambda s: s.name, "method")
    names = _select(list(protocol.datasets), datasets, lambda s: s, "dataset")
    context = {**_context(device, protocol.dtype), "processes": comm.world_size if comm.world_size > 1 else None,
               "command": command}
    log = log if comm.rank == 0 else (lambda message: None)
    folder = resolve_data_dir(data_dir)
    _warm_up(specs, protocol.dtype, device)
    for name in names:
        if name in protocol.requires_data and not _available(name, folder):
            log(f"skip {name}: not in the data folder ({folder or 'none set; use --data-dir or GPSCALE_DATA'})")
            continue
        for split in splits if splits is not None else (protocol.datasets[name] or protocol.splits):
            for seed in protocol.seeds:
                given = {**protocol.dataset_options.get(name, {}), **(data_options or {})}
                # the rows as a user has them, for the estimator, which scales them as ds is scaled
                raw = load_dataset(name, split=split, seed=seed, data_dir=folder,
                                   **{**given, "x_scaling": "none", "standardize_y": False})
                ds = raw.rescaled(given.get("x_scaling"), given.get("standardize_y", True))
                trained: dict = {}  # trained models of this split and seed, for posterior-only variants
                for spec in (_on_dataset(s, name, options) for s in specs):
                    if spec.max_n is not None and ds.n_train > spec.max_n:
                        continue
                    recorded = {"key": spec.key, **spec.options, **({"data": data_options} if data_options else {})}
                    base = {"protocol": protocol.name, "protocol_version": protocol.version, "method": spec.name,
                            "options": recorded, "dataset": name, "split": split, "seed": seed}
                    if identity(base) in done:
                        log(f"done already: {spec.name} on {name} split {split} seed {seed}")
                        continue
                    record = {**base, **context, **run_one(spec, ds, seed=seed, dtype=protocol.dtype,
                                                           device=device, progress=progress, trained=trained,
                                                           comm=comm, raw=raw)}
                    if comm.rank == 0:
                        store.append(record)
                    log(_line(record))
    return store.path


def run_one(spec: MethodSpec, ds, *, seed: int, dtype: str, device: str = "cpu", progress: bool = False,
            trained: dict | None = None, comm: Comm = LOCAL, raw=None) -> dict:
    """Train and evaluate one method on one dataset split. In one process it never raises: an error becomes the
    record. Under data parallelism an error stops the job instead, since the other ranks may be waiting for this
    one in a collective (torchrun then stops them all); rerun with ``resume`` to skip the runs recorded so far.

    ``trained`` (optional, per split and seed) keeps our trained models, so that an entry differing from an
    earlier one only in posterior options refits that model's posterior instead of training again. ``raw``
    (optional) is the same split unscaled (``x_scaling='none'``, ``standardize_y=False``): gpscale's estimators
    then get the rows a user has and scale them as ``ds`` is scaled, with the same function, so that they train on
    ds's rows to the bit; without it they get ds's scaled rows (and scale them again, which moves them by
    round-off). Scores are on ds's scale either way.
    """
    raw = ds if raw is None else raw
    record = {"n_train": ds.n_train, "n_test": ds.n_test, "d": ds.d}
    # "auto": the estimators choose their dtype; a peer, and the test rows handed over, are then float64
    torch_dtype = {"float64": torch.float64, "float32": torch.float32, "auto": torch.float64}[dtype]
    first, last = row_blocks(ds.n_train, comm.world_size)[comm.rank:comm.rank + 2]
    if is_peer(spec.key) and comm.world_size > 1:  # refused alike on every rank, before any collective
        return {**record, "status": "error", "error": "NotImplementedError: The peers run in one process."}
    try:
        with PeakMemory(device) as peak:
            tic = time.perf_counter()
            if is_peer(spec.key):
                train = {k: spec.options[k] for k in TRAINING_OPTIONS if k in spec.options}
                options = {k: v for k, v in spec.options.items() if k not in TRAINING_OPTIONS}
                if "n_inducing" in options:
                    options["n_inducing"] = min(options["n_inducing"], ds.n_train)
                Xtr, ytr = (torch.tensor(a, dtype=torch_dtype, device=device) for a in (ds.X_train, ds.y_train))
                predict, seconds_per_epoch, epochs = _run_peer(spec.key, options, train, Xtr, ytr, seed, progress)
                reused, given = None, ds
            else:
                rows = (raw.X_train[first:last], raw.y_train[first:last])
                predict, seconds_per_epoch, epochs, reused, fitted = _run_ours(
                    spec, ds, rows, seed, dtype, device, progress, {} if trained is None else trained, comm)
                given = raw
                record.update(fitted)
            train_seconds = time.perf_counter() - tic
            Xte = torch.tensor(given.X_test, dtype=torch_dtype, device=device)  # the test rows as training's
            tic = time.perf_counter()
            # classes: probabilities [n*, C]; var is None for a peer that predicts a mean only
            mean, var = (None if t is None else t.double().cpu().numpy() for t in predict(Xte))
            if given is not ds and ds.standardize_y and mean.ndim == 1:  # back on ds's y scale
                mean, var = (mean - ds.y_mean) / ds.y_std, var / ds.y_std**2
            predict_seconds = time.perf_counter() - tic
        peak_mb = peak.mb
        if reused is not None:
            record["reused_training_of"] = reused["label"]
            train_seconds += reused["train_seconds"]
            peak_mb = max(peak_mb or 0.0, reused["peak_memory_mb"] or 0.0) or None
        scores = _class_scores(ds, mean) if spec.options.get("likelihood") in CLASSIFICATION else _scores(ds, mean, var)
        record.update(scores, status="ok", train_seconds=train_seconds,
                      seconds_per_epoch=seconds_per_epoch, predict_seconds=predict_seconds, epochs=epochs,
                      peak_memory_mb=peak_mb)
        if trained is not None and reused is None and not is_peer(spec.key):
            trained[_training_identity(spec)]["run"] = {"label": spec.name, "train_seconds": train_seconds,
                                                        "peak_memory_mb": peak_mb}
    except PeerUnavailable as missing:  # not run here, which is no failure of the peer or of ours
        record.update(status="skipped", error=str(missing))
    except Exception as err:  # noqa: BLE001 - a failed run is data, not a crash of the suite
        if comm.world_size > 1:
            raise RuntimeError(f"Rank {comm.rank}: {spec.name} on {ds.name} failed ({type(err).__name__}: {err}). "
                               "The job stops, since the other ranks may be waiting for this one; the runs "
                               "recorded so far stay, and --resume skips them.") from err
        record.update(status="error", error=f"{type(err).__name__}: {err}")
    return record


def _check_data_options(data_options: dict | None) -> None:
    given, fixed = set(data_options or {}), {"name", "split", "seed", "data_dir"}
    if given & fixed:
        raise ValueError(f"The runner sets {', '.join(map(repr, sorted(given & fixed)))} itself: choose the splits "
                         "with --splits and the data folder with --data-dir; the seeds are the protocol's.")
    allowed = [k for k in inspect.signature(load_dataset).parameters if k not in fixed]
    unknown = sorted(given - set(allowed))
    if unknown:
        raise ValueError(f"Unknown data option(s) {', '.join(map(repr, unknown))}: a data option is one of "
                         f"{', '.join(allowed)} (gpscale.data.load_dataset's arguments).")


def _on_dataset(spec: MethodSpec, dataset: str, options: dict | None = None) -> MethodSpec:
    """``spec`` with its options for ``dataset``, then ``options``, merged in: what runs and what the record's
    options say."""
    overrides = {**spec.dataset_overrides.get(dataset, {}), **(options or {})}
    return replace(spec, options={**spec.options, **overrides}, dataset_overrides={}) if overrides else spec


def _warm_up(specs, dtype, device) -> None:
    """One tiny untimed run of each method, so that one-off costs (imports, thread pools, first-call dispatch)
    do not land on whichever method happens to run first: one epoch, and the method's ``warm_up_options`` (a model
    class whose work is in its posterior fit, which epochs do not shorten, declares them)."""
    from ..data import load_dataset as load

    tiny = load("friedman1", n=200)
    for spec in specs:
        method = spec.options.get("method") if spec.key == ESTIMATOR else spec.key
        own = get_model_class(method).warm_up_options if method in available_methods() else {}
        options = {**spec.options, "epochs": 1, **own}
        with warnings.catch_warnings():  # e.g. a short chain's R-hat: nothing about the timed runs
            warnings.simplefilter("ignore")
            run_one(MethodSpec(spec.key, options), tiny, seed=0, dtype=dtype, device=device)


def _run_ours(spec, ds, rows, seed, dtype, device, progress, trained, comm=LOCAL):
    """Fit spec's method through the public estimator on this process's training ``rows`` of ``ds``, or refit the
    posterior of an estimator trained earlier whose entry differs only in posterior options. Returns (predict,
    seconds per epoch, epochs, the reused run or None, what the record adds: the method fitted, its optimiser steps
    and whether training converged)."""
    X, y = rows
    earlier = trained.get(_training_identity(spec))
    if earlier is not None and "run" in earlier:
        est = copy.deepcopy(earlier["estimator"])
        posterior = get_model_class(est.method_).posterior_options
        est.refit_posterior(X, y, **{name: spec.options.get(name, option_default(get_model_class(est.method_), name))
                                     for name in posterior})
        reused = earlier["run"]
    else:
        est = _estimator(spec, ds, seed, dtype, device, progress, comm).fit(X, y)
        trained[_training_identity(spec)] = {"estimator": est}
        reused = None

    def predict(Xs):
        Xs = Xs.cpu().numpy()
        if hasattr(est, "predict_proba"):
            probabilities = torch.from_numpy(est.predict_proba(Xs))
            return probabilities, torch.zeros_like(probabilities)
        mean, std = est.predict(Xs, return_std=True)
        return torch.from_numpy(mean), torch.from_numpy(std**2)

    result = est.fit_result_
    fitted = {"fitted_method": est.method_, "steps": result.steps, "seconds_per_step": result.seconds_per_step,
              "converged": None if result.converged is None else int(result.converged)}
    return predict, result.seconds_per_epoch, result.epochs_run, reused, fitted


def _estimator(spec, ds, seed, dtype, device, progress, comm):
    """The estimator of a method entry: ``GPRegressor(method=key, **options)`` (``GPClassifier`` for a
    classification likelihood; the entry ``estimator`` takes its method, if any, from its options), told the data
    set's scaling."""
    from ..estimator import GPClassifier, GPRegressor

    options = dict(spec.options)
    if spec.key != ESTIMATOR:
        options["method"] = spec.key
    common = {"seed": seed, "progress": progress, "dtype": dtype, "device": device,
              "distributed": comm.world_size > 1, "x_scaling": ds.x_scaling}
    if options.get("likelihood") in CLASSIFICATION:
        return GPClassifier(**{**common, **options})
    return GPRegressor(**{**common, "normalize_y": ds.standardize_y, **options})


def _training_identity(spec: MethodSpec) -> str:
    """What determines the trained model: the key and every option but the posterior-only ones."""
    key = spec.options.get("method", "auto") if spec.key == ESTIMATOR else spec.key
    posterior = () if key == "auto" else get_model_class(key).posterior_options
    return json.dumps([spec.key, {k: v for k, v in spec.options.items() if k not in posterior}],
                      sort_keys=True, default=str)


def _run_peer(key, options, train, X, y, seed, progress):
    from .peers import make_peer

    m = options.pop("n_inducing", None)
    # GPyTorch draws from torch's global generator (noise on its variational mean when training starts): seeded
    # here, so that a peer's numbers do not depend on what ran before it in the process (ours seed themselves),
    # and forked, so that the caller's generator is left as it was
    with torch.random.fork_rng(devices=[X.device] if X.device.type == "cuda" else []):
        torch.manual_seed(seed)
        peer = make_peer(key, X.shape[1], m, dtype=X.dtype, device=X.device, **options)
        Z = kmeans_centers(X, m, seed) if m is not None else None
        seconds = peer.fit(X, y, seed=seed, Z=Z, progress=progress, **train)
    return peer.predict, float(np.mean(seconds)), len(seconds)


def _scores(ds, mean: np.ndarray, var: np.ndarray | None) -> dict:
    """RMSE (standardised and in y's units), NLPD, 95% coverage and the calibration curve of predictive moments
    [n*]; with no variance (``var`` None, a peer that predicts a mean only) the RMSEs alone, the others missing."""
    y = ds.y_test
    scores = {"rmse": metrics.rmse(y, mean), "rmse_original": metrics.rmse(y, mean) * float(ds.y_std)}
    if var is None:
        return scores
    levels, empirical = metrics.coverage_curve(y, mean, var, CALIBRATION_LEVELS)
    return {**scores, "nlpd": metrics.nlpd(y, mean, var), "coverage": metrics.coverage(y, mean, var, 0.95),
            "calibration": {"levels": list(map(float, levels)), "empirical": list(map(float, empirical))}}


def _class_scores(ds, probabilities: np.ndarray) -> dict:
    """Accuracy and the NLPD of the test labels under predictive class probabilities [n*, C], whose columns follow
    the sorted training labels (0..C-1, or -1 / +1 for two classes)."""
    labels = np.searchsorted(np.unique(ds.y_train), ds.y_test)
    p_true = np.clip(probabilities[np.arange(len(labels)), labels], np.finfo(float).tiny, None)
    return {"accuracy": float((probabilities.argmax(1) == labels).mean()), "nlpd": float(-np.log(p_true).mean())}


def machine_info() -> dict:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"machine": f"{platform.system()} {platform.machine()}", "cpu": cpu, "cores": os.cpu_count()}


def _context(device: str, dtype: str) -> dict:
    try:
        import gpytorch
        gpytorch_version = gpytorch.__version__
    except ImportError:
        gpytorch_version = None
    device_name = torch.cuda.get_device_name(device) if str(device).startswith("cuda") else "cpu"
    return {"dtype": dtype, "device": device_name, "gpscale_version": __version__,
            "torch_version": torch.__version__, "gpytorch_version": gpytorch_version, **machine_info(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "git_commit": _git_commit()}


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent,
                             capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _available(name: str, folder) -> bool:
    if folder is None:
        return False
    try:
        load_dataset(name, split=0, data_dir=folder)
        return True
    except FileNotFoundError:
        return False


def _select(items, wanted, name_of, what):
    if wanted is None:
        return list(items)
    known = {name_of(item): item for item in items}
    unknown = [w for w in wanted if w not in known]
    if unknown:
        raise ValueError(f"Unknown {what}(s) {', '.join(unknown)} for this protocol; it has: {', '.join(known)}.")
    return [known[w] for w in wanted]


def _shown(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _line(record: dict) -> str:
    head = f"{record['method']:<16} {record['dataset']:<12} split {record['split']} seed {record['seed']}"
    if record["status"] != "ok":
        return f"{head}  {'SKIPPED' if record['status'] == 'skipped' else 'FAILED'}  {record['error']}"
    scores = (f"accuracy {record['accuracy']:.4f}  nlpd {record['nlpd']:.3f}" if "accuracy" in record else
              f"rmse {record['rmse']:.4f}  nlpd {_shown(record.get('nlpd'), 3)}  "
              f"cov {_shown(record.get('coverage'), 3)}")
    return (f"{head}  {scores}  "
            f"{record['seconds_per_epoch']:.3f} s/epoch  train {record['train_seconds']:.1f} s  "
            f"peak {record['peak_memory_mb'] or 0:.0f} MB")

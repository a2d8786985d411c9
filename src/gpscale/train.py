"""One training loop for every model: Adam on reshuffled minibatches (or the full batch), an optional
learning-rate schedule, validation with early stopping, restarts on numerical failure, checkpoint/resume; or, for
full-batch models, L-BFGS to convergence.
"""
from __future__ import annotations

import copy
import gc
import math
import os
import sys
import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from . import lbfgs
from .checkpoint import CheckpointError, check_resumable, data_fingerprint, read_checkpoint, write_checkpoint
from .defaults import CONVERGENCE, Convergence, Training, resolve_training
from .device import check_failed, deferred_checks, pinned_for, to_device
from .distributed import LOCAL, Comm, broadcast_state, gather_rows
from .heap import hold_freed_heap
from .io import check_writable
from .linalg import NotPSDError
from .models.base import GPModel
from .preemption import Stopped, StopRequest, deferred_stop
from .sources import MappedRows

__all__ = ["initialisation_rows", "fit", "adam", "FitResult", "TrainingError", "OPTIMIZERS"]

OPTIMIZERS = ("adam", "lbfgs")


class TrainingError(RuntimeError):
    """Training diverged (non-finite loss) and restarts did not help."""


@dataclass
class FitResult:
    """What happened during :func:`fit`. ``history`` has one dict per epoch, or per L-BFGS iteration (epoch, the
    optimiser steps taken so far, loss, lr, seconds and, with validation, val_nlpd). ``settings`` are the training
    settings that ran (the defaults filled in). ``converged`` says, when training ran to convergence, whether the
    plateau rule (or L-BFGS's own test) ended it before the cap of steps; None for a fixed number of epochs."""

    history: list[dict] = field(default_factory=list)
    settings: Training | None = None
    restarts: int = 0
    best_epoch: int | None = None
    stopped_early: bool = False
    converged: bool | None = None
    seconds: float = 0.0

    @property
    def steps(self) -> int:
        """Optimiser steps taken (Adam steps or L-BFGS iterations)."""
        return self.history[-1]["step"] if self.history else 0

    @property
    def final_loss(self) -> float:
        """The training objective (per data point) at the end: the last epoch's mean, or the last iteration's."""
        return self.history[-1]["loss"] if self.history else math.nan

    @property
    def epochs_run(self) -> int:
        return len(self.history)

    @property
    def seconds_per_epoch(self) -> float:
        return sum(h["seconds"] for h in self.history) / max(1, len(self.history))

    @property
    def seconds_per_step(self) -> float | None:
        """The epochs' seconds over their optimiser steps (what papers call seconds per iteration); None before a
        step."""
        return sum(h["seconds"] for h in self.history) / self.steps if self.steps else None


Schedule = str | Callable[[torch.optim.Optimizer, int], torch.optim.lr_scheduler.LRScheduler] | None


def fit(
    model: GPModel,
    X: Tensor,
    y: Tensor,
    *,
    epochs: int | None = None,
    max_steps: int | None = None,
    batch_size: int | None = None,
    lr: float | None = None,
    optimizer: str | None = None,
    schedule: Schedule = None,
    val_fraction: float = 0.0,
    patience: int | None = None,
    val_every: int = 1,
    seed: int = 0,
    progress: bool = True,
    max_restarts: int = 3,
    checkpoint: str | os.PathLike | None = None,
    resume: bool = False,
    comm: Comm = LOCAL,
    convergence: Convergence = CONVERGENCE,
    checkpoint_settings: dict | None = None,
    mapped: MappedRows | None = None,
) -> FitResult:
    """Train ``model`` on X [n, d], y [n] (tensors in the model's dtype and device), then fit its posterior.

    Settings left as None come from :mod:`gpscale.defaults` (the table every entry point reads).

    Args:
        epochs: None (default): train until the objective stops improving, by the plateau rule of
            ``convergence`` (:class:`~gpscale.defaults.Convergence`), for at most ``max_steps`` optimiser steps.
            An int: that many passes over the data (for full-batch models one Adam step each; with
            ``optimizer="lbfgs"``, at most that many L-BFGS iterations).
        max_steps: the cap of training to convergence, in optimiser steps (Adam steps, or L-BFGS iterations and
            evaluations of the loss); ignored with a fixed ``epochs``. None: the method's default.
        batch_size: minibatch size for minibatch models; batches are reshuffled every epoch. None: the method's.
        lr: Adam learning rate. None: the method's default.
        optimizer: ``"adam"``, or ``"lbfgs"`` (scipy's L-BFGS-B, full-batch models only): quasi-Newton steps to
            the loss's optimum, where a fixed Adam budget stops short or oscillates; as GPy and GPflow fit a
            handful of kernel hyperparameters. It uses neither ``lr`` nor ``schedule``, and supports neither
            validation (``val_fraction``) nor checkpoints. Points where the loss cannot be evaluated (a failed
            Cholesky) make the line search backtrack; the best point evaluated is kept. None: the method's
            optimiser for training to convergence, and Adam for a fixed number of epochs, with validation or with
            a checkpoint.
        schedule: ``None``/``'constant'``, ``'cosine'`` (annealed to 0 over ``epochs``), or a callable
            ``(optimizer, epochs) -> scheduler`` stepped once per epoch; only with a fixed ``epochs`` (training to
            convergence steps the learning rate down on plateaus itself).
        val_fraction: hold out this fraction (seeded) to compute the validation NLPD; with a fixed ``epochs``
            after each epoch, training stopping after ``patience`` epochs without improvement; when training to
            convergence at the end of each window, the plateau rule then watching the validation NLPD instead of
            the training loss. The best parameters are restored.
        patience: with a fixed ``epochs``, epochs without a better validation NLPD before stopping (default 10);
            when training to convergence, windows without improvement before the learning rate steps down
            (default ``convergence.patience``).
        val_every: with a fixed ``epochs``, compute the validation NLPD every this many epochs (and after the
            last); the patience still counts epochs. Each check refits the posterior, which for full-batch models
            costs as much as an epoch.
        seed: seeds initialisation, shuffling and the validation split.
        progress: show a progress bar with the loss (in a terminal; elsewhere a line a minute, see
            :func:`progress_bar`).
        max_restarts: on :class:`NotPSDError` or a non-finite loss, restart from the initial parameters,
            perturbed, at most this many times; then raise with a remedy.
        checkpoint: a file written (atomically) after every epoch, with a fingerprint of the data and the
            settings (:mod:`gpscale.checkpoint`); with ``resume=True`` training continues from it when it exists,
            to the model an uninterrupted fit gives, and refuses a checkpoint of other data or settings. While
            training with a checkpoint in the main thread, SIGTERM, SIGUSR1 and SIGINT stop it at the next step
            boundary: the state is saved there, mid-epoch included, and :class:`~gpscale.preemption.Stopped` raised
            (:mod:`gpscale.preemption`; a handler the program set for one of them is left to it). A fit that the
            plateau rule or early stopping ended resumes to itself, with no further training.
        comm: the processes of a data-parallel job (:mod:`gpscale.distributed`), each passing its own shard of
            the rows as (X, y). The model is initialised on rank 0 from :func:`initialisation_rows` (the same
            rows whatever the number of processes) and broadcast; every epoch draws one
            permutation of the global rows (the same on every rank) and cuts it into global batches of
            ``batch_size``, of which each rank evaluates the rows it holds; the ranks' losses, weighted by their
            share of the batch, sum to the one-process loss, and DistributedDataParallel sums their gradients.
            So the trained model equals the one-process fit on the concatenated shards, to round-off. Rank 0
            alone writes the checkpoint. Every rank calls the model's loss on its part (see
            :meth:`~gpscale.models.base.GPModel.loss`): full-batch models all-reduce their statistics inside it,
            and a ``batch_coupled`` loss (SoftKI) gets the whole gathered batch on every rank. With
            ``val_fraction``, each rank holds out that fraction of its shard and the validation NLPD is the mean
            over all held-out rows.
        convergence: the plateau rule of training to convergence.
        checkpoint_settings: the caller's settings that shape the trained state beyond those of this call (the
            model's key, the dtype, batch size, learning rate, seed, schedule and validation settings): the
            estimator's method options and scaling, names to strings. A checkpoint records both, and a resume with
            other values is refused.
        mapped: the :class:`~gpscale.sources.MappedRows` whose memory-mapped tensors X and y are: a minibatch
            step then reads its rows with ``mapped.take`` (copies, nothing mapped), and after each pass over the
            rows (the checkpoint's fingerprint, the initialisation rows, a step of a batch gathered from every
            process, the posterior) ``mapped.release`` gives the pages it mapped back to the file cache, so that
            the memory a minibatch fit holds does not grow with the rows (but for the epoch's permutation of the
            row indices; with ``val_fraction``, the training split is a copy in memory).

    The posterior is fitted on all of (X, y), the validation rows included.
    """
    settings = resolve_training(model.key, model.full_batch, epochs=epochs, max_steps=max_steps,
                                optimizer=optimizer, lr=lr, batch_size=batch_size,
                                watched=val_fraction > 0 or checkpoint is not None)
    _check_positive(epochs=settings.epochs, max_steps=settings.max_steps, batch_size=settings.batch_size,
                    lr=settings.lr, patience=patience, val_every=val_every)
    _check_optimizer(settings.optimizer, model, val_fraction=val_fraction, schedule=schedule, checkpoint=checkpoint)
    if settings.epochs is None and schedule not in (None, "constant"):
        raise ValueError(f"schedule={schedule!r} anneals over a fixed number of epochs; pass epochs=, or leave "
                         "schedule=None (training to convergence steps the learning rate down on plateaus).")
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"Expected val_fraction in [0, 1). Got {val_fraction}.")
    with hold_freed_heap():  # each step reuses the pages of the step before it
        generator = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        X_fit, y_fit, X_val, y_val = _validation_split(X, y, val_fraction, generator, comm)
        if resume and checkpoint is None:
            raise ValueError("resume=True continues from a checkpoint: pass checkpoint=PATH (--checkpoint PATH on the "
                             "command line) too.")
        if checkpoint is not None and comm.rank == 0:
            check_writable(checkpoint)  # before the first epoch, not after it
        shaping = {"method": model.key or type(model).__name__, "dtype": str(X.dtype).removeprefix("torch."),
                   "batch_size": settings.batch_size, "lr": settings.lr, "val_fraction": val_fraction, "seed": seed,
                   "schedule": schedule, "patience": patience, "val_every": val_every, "convergence": convergence}
        release = mapped.release if mapped is not None else (lambda: None)
        saver = None if checkpoint is None else _Checkpointer(
            checkpoint, data_fingerprint(X, y, comm),
            {**{name: repr(value) for name, value in shaping.items()}, **(checkpoint_settings or {})}, comm)
        release()
        state = saver.read() if (resume and saver is not None and Path(checkpoint).exists()) else None
        if state is None:
            X_init, y_init = initialisation_rows(X_fit, y_fit, seed, comm, release)
            if comm.rank == 0:
                model.initialise(X_init, y_init, seed=seed)
            broadcast_state(model, comm)
            # and rank 0's random state after it: a loss that draws (SoftKI's probes) then draws alike everywhere
            torch.set_rng_state(comm.broadcast(torch.get_rng_state(), src=0))
            del X_init, y_init
            release()
        else:
            saver.load_model(model, state)
        initial = snapshot(model.state_dict())
        result = FitResult(settings=settings)
        start = time.perf_counter()
        with deferred_stop() if saver is not None else nullcontext() as stop:
            for attempt in range(max_restarts + 1 if model.trainable else 0):
                try:
                    if settings.optimizer == "lbfgs":
                        _optimise_lbfgs(model, X_fit, y_fit, result, settings, convergence, progress=progress,
                                        comm=comm)
                    else:
                        # a validation split holds its training rows in memory, which steps index directly
                        _optimise(model, X_fit, y_fit, X_val, y_val, result, state, generator, settings,
                                  convergence, schedule=schedule, patience=patience, val_every=val_every,
                                  progress=progress, saver=saver, stop=stop, comm=comm,
                                  mapped=mapped if X_fit is X else None)
                    break
                except (NotPSDError, TrainingError) as err:
                    if attempt == max_restarts:
                        raise type(err)(
                            f"Training failed {attempt + 1} times (last: {err}) Try a smaller lr, a larger noise "
                            "floor (noise_floor=...), fewer inducing points, or dtype='float64'."
                        ) from err
                    if stop is not None and (name := stop.pending(comm)):  # asked to stop: no fresh start
                        raise Stopped(name, checkpoint=saver.path if Path(saver.path).exists() else None,
                                      step=result.steps) from err
                    warnings.warn(f"Training failed ({err}); restarting from perturbed initial values "
                                  f"({attempt + 1}/{max_restarts}).", RuntimeWarning, stacklevel=2)
                    model.load_state_dict(initial)
                    _perturb(model, generator, scale=0.1 * (attempt + 1))
                    result, state = FitResult(settings=settings, restarts=attempt + 1), None
        _check_improved(result)
        _check_not_degenerate(result, model, y_fit, comm, converged=result.converged is True)
        model.fit_posterior(X, y, comm)
        release()
        result.seconds = time.perf_counter() - start
        return result


def adam(model: GPModel, lr: float) -> torch.optim.Adam:
    """Adam on the model's parameter groups, in PyTorch's fused form: one kernel per dtype and device for the whole
    update instead of a dozen operators per tensor. On the CPU it took 0.09-0.32 ms a step where the per-tensor loop
    took 0.23-1.16 ms (the floor protocol's paper-size models; SVDBK's 11 tensors the most), the same update."""
    return torch.optim.Adam(model.parameter_groups(), lr=lr, fused=True)


def _check_improved(result: FitResult) -> None:
    """Raise :class:`TrainingError` when training left the objective (per data point) worse than its first epoch
    by more than 1 nat and more than its size: the optimiser diverged, and the model it left is degenerate (an
    exact GP at lr 10 ended with a constant predictive std of 1e-3 and a training loss of 1.3e5, from 0.85)."""
    if len(result.history) < 2 or result.best_epoch is not None:  # validation kept the best epoch's parameters
        return
    first, last = result.history[0]["loss"], result.history[-1]["loss"]
    if last - first > max(1.0, abs(first)):
        lr = result.settings.lr if result.settings is not None else None
        raise TrainingError(f"training made the objective worse, from {first:.4g} in its first epoch to {last:.4g} "
                            f"at the end: the optimiser diverged. Lower the learning rate (lr={lr}).")


# nats per point by which the best objective of a training run may exceed the loss of the best model that ignores
# the inputs (``likelihood.null_loss``, within every GP's reach) before the fit is called degenerate: a GP trained to
# convergence is never worse than that model by more than its KL term (a few nats at most); SVGP in float32 from a
# given outputscale of 1e12 and noise of 1e-9 stayed at 3e14 nats per point and returned silently without this rule
DEGENERATE_EXCESS = 100.0
# beyond this excess no budget explains the fit (its predictive density e^-1e6 below the null model's): an error
# even when a budget ended training
ABSURD_EXCESS = 1e6


def _check_not_degenerate(result: FitResult, model: GPModel, y: Tensor, comm: Comm, converged: bool) -> None:
    """When even the best objective (per data point) of the run exceeds, by more than ``DEGENERATE_EXCESS`` nats, the
    loss of the best model that ignores the inputs: raise :class:`TrainingError` when training converged there (the
    plateau rule or L-BFGS's own test ended it: the hyperparameters given or reached are absurd, and so would the
    predictions be) or when the excess is beyond ``ABSURD_EXCESS``; warn when a budget ended it (a fixed number of
    epochs, or the cap of steps), which may simply have been too short (unscaled targets far from 0 with
    ``normalize_y=False``, say)."""
    losses = [entry["loss"] for entry in result.history if math.isfinite(entry["loss"])]
    if not losses:
        return
    null = float(comm.all_reduce_max(torch.tensor(model.likelihood.null_loss(y), dtype=torch.float64)))
    best = min(losses)
    if best <= null + DEGENERATE_EXCESS:
        return
    message = (f"training ended with an objective of {best:.4g} nats per point at best, against {null:.4g} for a "
               "model that ignores the inputs: the fitted model is degenerate.")
    if converged or best > null + ABSURD_EXCESS:
        raise TrainingError(f"{message} Check the hyperparameters given (an absurd outputscale, noise or "
                            "lengthscale), scale y, or train in dtype='float64'.")
    warnings.warn(f"{message} Train for longer (more epochs or max_steps), or scale y (normalize_y=True).",
                  RuntimeWarning, stacklevel=3)


class _Plateau:
    """The plateau rule of :class:`~gpscale.defaults.Convergence` over a sequence of window values (mean loss or
    validation NLPD): :meth:`update` says whether the latest value improved, calls for a learning-rate cut, or ends
    training."""

    def __init__(self, convergence: Convergence, patience: int | None, state: dict | None = None,
                 minibatch: bool = False):
        self.tol = convergence.minibatch_tol if minibatch else convergence.tol
        self.lr_cuts = convergence.lr_cuts
        self.patience = convergence.patience if patience is None else patience
        self.state = dict(state) if state else {"best": math.inf, "waited": 0, "cuts": 0}

    def update(self, value: float) -> str:
        """``"improved"``, ``"wait"``, ``"cut"`` (the learning rate steps down) or ``"stop"``."""
        s = self.state
        if value < s["best"] - self.tol * max(1.0, abs(s["best"])) or not math.isfinite(s["best"]):
            s.update(best=min(value, s["best"]), waited=0)
            return "improved"
        s["best"] = min(value, s["best"])
        s["waited"] += 1
        if s["waited"] < self.patience:
            return "wait"
        if s["cuts"] < self.lr_cuts:
            s.update(cuts=s["cuts"] + 1, waited=0)
            return "cut"
        return "stop"


def _optimise(model, X, y, X_val, y_val, result, state, generator, settings: Training, convergence: Convergence, *,
              schedule, patience, val_every, progress, saver: _Checkpointer | None = None,
              stop: StopRequest | None = None, comm=LOCAL, mapped: MappedRows | None = None) -> None:
    """Adam, for a fixed number of epochs or (``settings.epochs`` None) to convergence by the plateau rule; with a
    ``saver``, the state saved after every epoch, and at the step boundary where ``stop`` asks to stop, before
    :class:`Stopped` is raised."""
    model.clear_cache()
    optimiser = adam(model, settings.lr)
    shard = Shard.of(X.shape[0], comm)
    steps_per_epoch = 1 if model.full_batch else math.ceil(shard.n_global / settings.batch_size)
    converging = settings.epochs is None
    sample = None  # rows an epoch draws: all, or (training to convergence on many rows) a round's sample
    if converging and steps_per_epoch > convergence.minibatch_round:
        steps_per_epoch, sample = convergence.minibatch_round, convergence.minibatch_round * settings.batch_size
    if converging:  # windows of whole epochs (rounds); the cap in steps becomes a cap in epochs
        window = (convergence.full_batch_window if model.full_batch
                  else math.ceil(convergence.minibatch_window / steps_per_epoch))
        epochs = math.ceil(settings.max_steps / steps_per_epoch)
    else:
        epochs = settings.epochs
    scheduler = None if converging else _make_scheduler(schedule, optimiser, epochs)
    best = {"nlpd": math.inf, "state": None, "epoch": None, "last_good": -1}
    plateau = _Plateau(convergence, patience, state.get("plateau") if state else None,
                       minibatch=not model.full_batch and X_val is None)
    first, done_before = 0, _Partial(0, 0.0)  # the epoch to start at, and its steps taken before a stop
    if state is not None:
        optimiser.load_state_dict(state["optimiser"])
        if scheduler is not None:
            scheduler.load_state_dict(state["scheduler"])
        generator.set_state(state["generator"])
        torch.set_rng_state(state["random"])
        result.history, best = state["history"], state["best"]
        first, done_before = len(result.history), _Partial(*state["partial"])
        if state["finished"] is not None:  # the plateau rule or early stopping had ended it: nothing left to train
            epochs = first
            result.converged, result.stopped_early = state["finished"]
    step_state = state["step_state"] if state is not None else {}
    objective = _Objective(model)
    if comm.world_size > 1:
        # DDP must look for parameters without a gradient: empty ones (gamma [0, d] without a mean basis) and those
        # that natural-gradient steps move outside the loss
        trained = {id(p) for group in model.parameter_groups() for p in group["params"] if p.numel()}
        unused = any(id(p) not in trained for p in model.parameters() if p.requires_grad)
        objective = DistributedDataParallel(objective, find_unused_parameters=unused)
    bar = progress_bar(range(first, epochs), desc=model.key or "fit", unit="epoch",
                       enabled=progress and comm.rank == 0)
    patience = 10 if patience is None else patience
    speculate = True
    for epoch in bar:
        tic = time.perf_counter()
        model.train()
        model.set_step_state(step_state)  # a resumed epoch's, saved where it stopped
        step_state = {}
        epoch_start = generator.get_state()  # a stop mid-epoch resumes with this epoch's permutation
        run = _epoch(model, objective, X, y, optimiser, generator, settings.batch_size, shard, comm, speculate,
                     first_step=done_before.steps, stop=stop, mapped=mapped, sample=sample)
        speculate = speculate and not run.redone  # a check that failed tends to fail again: check eagerly from now
        if run.steps < run.n_steps:  # asked to stop
            partial = _Partial(run.steps, done_before.total + run.total)
            saver.save(model, optimiser, scheduler, epoch_start, result.history, best, plateau.state, partial, None)
            comm.barrier()  # no process ends, which would make torchrun stop the others, before rank 0 has saved
            raise Stopped(stop.pending(comm), checkpoint=saver.path, step=epoch * steps_per_epoch + run.steps)
        loss, done_before = (done_before.total + run.total) / run.n_steps, _Partial(0, 0.0)
        if scheduler is not None:
            scheduler.step()
        record = {"epoch": epoch, "step": (epoch + 1) * steps_per_epoch, "loss": loss,
                  "lr": optimiser.param_groups[0]["lr"], "seconds": time.perf_counter() - tic}
        window_ends = converging and (epoch + 1) % window == 0
        validate = window_ends if converging else ((epoch + 1) % val_every == 0 or epoch + 1 == epochs)
        if X_val is not None and validate:
            record["val_nlpd"] = _validation_nlpd(model, X, y, X_val, y_val, comm)
            if record["val_nlpd"] < best["nlpd"]:
                best = {"nlpd": record["val_nlpd"], "state": snapshot(model.state_dict()), "epoch": epoch,
                        "last_good": epoch}
        result.history.append(record)
        verdict = None
        if window_ends:
            watched = record.get("val_nlpd", sum(h["loss"] for h in result.history[-window:]) / window)
            verdict = plateau.update(watched)
            if verdict == "cut":
                for group in optimiser.param_groups:
                    group["lr"] *= convergence.lr_factor
        bar.set_postfix({k: f"{v:.4g}" for k, v in record.items() if k in ("loss", "val_nlpd")})
        stopping_early = not converging and "val_nlpd" in record and epoch - best["last_good"] >= patience
        if saver is not None:
            finished = (verdict == "stop", stopping_early) if verdict == "stop" or stopping_early else None
            saver.save(model, optimiser, scheduler, generator.get_state(), result.history, best, plateau.state,
                       _Partial(0, 0.0), finished)
        if verdict == "stop":
            result.converged = True
            break
        if stopping_early:
            result.stopped_early = True
            break
    bar.close()
    if comm.world_size > 1:
        # DDP sits in a reference cycle, and its reducer keeps hooks on the model's parameters and holds the
        # process group: collect it now, so that the fitted model leaves training without them
        del objective
        gc.collect()
    if converging and not result.converged:
        result.converged = False
    model.eval()
    if best["state"] is not None:
        model.load_state_dict(best["state"])
        result.best_epoch = best["epoch"]


def _optimise_lbfgs(model, X, y, result, settings: Training, convergence: Convergence, *, progress,
                    comm=LOCAL) -> None:
    """L-BFGS-B on the full-batch loss; one history record per iteration. With ``settings.epochs`` None it runs to
    scipy's convergence tests or the plateau rule, at most ``settings.max_steps`` iterations and as many evaluations
    of the loss. Under data
    parallelism each rank's share is 1/W of the loss, whose statistics the model all-reduces, and lbfgs sums the
    shares' gradients."""
    model.clear_cache()
    model.train()
    params = [p for group in model.parameter_groups() for p in group["params"]]
    converging = settings.epochs is None
    iterations = settings.max_steps if converging else settings.epochs
    bar = progress_bar(total=iterations, desc=model.key or "fit", unit="it", enabled=progress and comm.rank == 0)
    clock = {"tic": time.perf_counter()}
    marks: list[tuple[int, float]] = []  # (evaluations so far, loss) at the end of each iteration

    def record(iteration: int, loss: float, evaluations: int) -> None:
        now = time.perf_counter()
        result.history.append({"epoch": iteration, "step": iteration + 1, "loss": loss, "lr": math.nan,
                               "seconds": now - clock["tic"]})
        clock["tic"] = now
        bar.update()
        bar.set_postfix(loss=f"{loss:.4g}")
        if converging and _lbfgs_plateaued(marks, loss, evaluations, convergence):
            raise StopIteration  # scipy ends the run; the best point is kept
        marks.append((evaluations, loss))

    objective, n = _Objective(model), Shard.of(X.shape[0], comm).n_global
    fitted = lbfgs.minimise(lambda: objective(X, y, n, 1.0 / comm.world_size, comm), params,
                            max_iterations=iterations, max_evaluations=iterations if converging else 15000,
                            callback=record, comm=comm)
    bar.close()
    model.eval()
    if converging:
        result.converged = fitted.iterations < iterations and fitted.evaluations < iterations
    if not fitted.evaluated:
        raise TrainingError(f"L-BFGS could not evaluate the loss at any of {fitted.evaluations} points.")


def _lbfgs_plateaued(marks: list[tuple[int, float]], loss: float, evaluations: int,
                     convergence: Convergence) -> bool:
    """Whether the loss fell by less than ``tol * max(1, |loss|)`` over the last ``lbfgs_window`` evaluations: since
    the latest iteration in ``marks`` (evaluations so far, loss) that ended that many evaluations or more ago.

    The window counts evaluations, each a pass over the data, rather than iterations: near a minimum, where
    round-off blurs the loss, each of L-BFGS's line searches may take ten or twenty evaluations for a change in the
    sixth digit (SGPR on 36,000 rows of Friedman #1: the last 6 of 33 iterations took 73 of 107 evaluations and
    lowered the loss per row by 2.4e-5)."""
    earlier = [before for at, before in marks if at <= evaluations - convergence.lbfgs_window]
    return bool(earlier) and earlier[-1] - loss < convergence.tol * max(1.0, abs(loss))


def progress_bar(iterable=None, *, total: int | None = None, desc: str, unit: str, enabled: bool,
                 delay: float = 0.0) -> tqdm:
    """A tqdm bar on stderr, shown once ``delay`` seconds have passed. In a terminal it redraws in place; written to
    a file (a long run's log) it writes one plain line at most once a minute, so that the log shows how far the run
    has got."""
    if sys.stderr.isatty():
        return tqdm(iterable, total=total, desc=desc, unit=unit, leave=False, disable=not enabled, delay=delay)
    return tqdm(iterable, total=total, desc=desc, unit=unit, leave=False, disable=not enabled, delay=delay,
                file=_LinesPerMinute(), mininterval=60.0, ascii=True, ncols=100)


class _LinesPerMinute:
    """A file for tqdm that writes its redraws ("\\r" + bar) as plain lines, at most one a minute (a changed
    postfix redraws the bar every step)."""

    def __init__(self, interval: float = 60.0):
        self.interval, self.last = interval, -math.inf

    def write(self, text: str) -> None:
        line = text.replace("\r", "").strip()
        if line and time.monotonic() - self.last >= self.interval:
            self.last = time.monotonic()
            sys.stderr.write(line + "\n")

    def flush(self) -> None:
        sys.stderr.flush()


@dataclass(frozen=True)
class Shard:
    """This process's rows of the global data: rows ``offset .. offset + n - 1`` of ``n_global``."""

    offset: int
    n: int
    n_global: int

    @staticmethod
    def of(n: int, comm: Comm) -> Shard:
        sizes = comm.all_gather(torch.tensor([n])).tolist()
        return Shard(offset=sum(sizes[: comm.rank]), n=n, n_global=sum(sizes))


class _Objective(nn.Module):
    """The model's minibatch loss, weighted by this process's share of the global batch, as a module's forward
    (what DistributedDataParallel wraps)."""

    def __init__(self, model: GPModel):
        super().__init__()
        self.model = model

    def forward(self, X: Tensor, y: Tensor, num_data: int, weight: float, comm: Comm) -> Tensor:
        # every rank evaluates its part, rows or not, so that it joins the collectives the loss takes
        loss = weight * self.model.loss(X, y, num_data=num_data, comm=comm, share=weight / comm.world_size)
        return loss + self._zero() if X.shape[0] == 0 else loss

    def _zero(self) -> Tensor:
        """For a rank without rows of the batch: a zero that still reaches every parameter, with a separate zero
        gradient tensor each (sum(p.sum()) * 0 would hand 0-dim parameters views of one tensor, which
        DistributedDataParallel's bucket copies then mix up)."""
        return sum((p * 0.0).sum() for p in self.model.parameters() if p.requires_grad)


class _Batch(NamedTuple):
    """One step's rows: ``rows`` None for the full batch; else global row indices that every rank gathers
    (``gathered``: a batch-coupled loss under data parallelism), or the indices of this process's rows in X, on X's
    device; ``share`` is this process's share of the global batch."""

    rows: Tensor | None
    share: float
    gathered: bool = False


def _epoch_batches(model, X: Tensor, generator, batch_size: int, shard: Shard, comm: Comm,
                   sample: int | None = None) -> list[_Batch]:
    """The steps of one epoch: batches of a permutation of the global rows, or of its first ``sample`` rows (a
    round, :class:`~gpscale.defaults.Convergence`). The permutation is drawn on the host by the training generator,
    whose state a checkpoint keeps (so a resumed fit reshuffles as the uninterrupted one); the indices of this
    process's rows go to an accelerator holding X once for the epoch, asynchronously from pinned memory, not once per
    step."""
    if model.full_batch:  # every rank holds its rows of one loss, whose statistics the model all-reduces
        return [_Batch(None, 1.0 / comm.world_size)]
    batches = torch.randperm(shard.n_global, generator=generator)[:sample].split(batch_size)
    if model.batch_coupled and comm.world_size > 1:  # the whole batch, in order, on every rank
        return [_Batch(rows, 1.0 / comm.world_size, gathered=True) for rows in batches]
    mine = batches if shard.n == shard.n_global else \
        [rows[(rows >= shard.offset) & (rows < shard.offset + shard.n)] - shard.offset for rows in batches]
    on_device = mine if X.device.type == "cpu" else \
        to_device(pinned_for(X.device, torch.cat(mine)), X.device).split([len(m) for m in mine])
    return [_Batch(rows, len(m) / len(b)) for rows, m, b in zip(on_device, mine, batches)]


def _step(model, objective, X, y, batch: _Batch, optimiser, shard: Shard, comm: Comm,
          mapped: MappedRows | None = None) -> Tensor:
    """One optimiser step (after the model's natural-gradient step) on ``batch``; returns the global batch's loss,
    not read on the host. Rows of a ``mapped`` X are read with its ``take`` (or, gathered, given back after)."""
    if batch.rows is None:
        xb, yb = X, y
    elif batch.gathered:
        xb, yb = gather_rows(X, y, batch.rows, shard.offset, comm)
        if mapped is not None:
            mapped.release()
    elif mapped is not None:
        xb, yb = mapped.take(batch.rows)
    else:
        xb, yb = X[batch.rows], y[batch.rows]
    model.natural_gradient_step(xb, yb, shard.n_global, comm, batch.share)
    optimiser.zero_grad(set_to_none=True)
    # the ranks' weighted losses sum to the loss of the global batch; DDP averages gradients, so scale by W
    loss = objective(xb, yb, shard.n_global, batch.share * comm.world_size, comm)
    global_loss = comm.all_reduce_sum(loss.detach() / comm.world_size)
    if check_failed(~torch.isfinite(global_loss)):
        raise TrainingError(f"the loss became {global_loss.item()}.")
    loss.backward()
    optimiser.step()
    return global_loss


class _Partial(NamedTuple):
    """The steps of an epoch taken before a stop, and the sum of their losses."""

    steps: int
    total: float


class _EpochRun(NamedTuple):
    """What :func:`_epoch` did: the sum of its steps' losses, the steps taken (all ``n_steps`` of the epoch unless
    asked to stop), and whether it speculated in vain and ran again."""

    total: float
    steps: int
    n_steps: int
    redone: bool


def _epoch(model, objective, X, y, optimiser, generator, batch_size, shard: Shard, comm: Comm,
           speculate: bool = True, first_step: int = 0, stop: StopRequest | None = None,
           mapped: MappedRows | None = None, sample: int | None = None) -> _EpochRun:
    """One pass, from its step ``first_step`` (a resumed epoch), ending before any step when ``stop`` asks (a
    collective under data parallelism: every process ends at the same step), reading rows from ``mapped`` as
    :func:`fit` says; over the first ``sample`` rows of its permutation only, where given (a round). The losses
    are the global batch's.

    Speculating, the steps never wait for the device: every check inside them (that a Cholesky factorisation
    succeeded, that the loss is finite) is deferred (:func:`gpscale.device.deferred_checks`) and the losses are
    summed on the device, so the epoch reads the host once, after its last step. If a check failed, the epoch is
    undone (the model, the optimiser and the random state put back as they were at its start) and run again with
    every check read where it is made, which adds jitter, halves a natural-gradient step or raises at the step
    where it would have without speculation: the result is the same either way."""
    batches = _epoch_batches(model, X, generator, batch_size, shard, comm, sample)

    def run() -> tuple[Tensor, int]:
        total = torch.zeros((), dtype=torch.float64, device=X.device)
        for step in range(first_step, len(batches)):
            if stop is not None and stop.pending(comm):
                return total, step
            total = total + _step(model, objective, X, y, batches[step], optimiser, shard, comm, mapped)
        return total, len(batches)

    if speculate:
        undo = _undoer(model, optimiser, X.device)
        total, steps, failed = _speculate(run, comm)
        if not failed:
            return _EpochRun(total, steps, len(batches), False)
        undo()
    total, steps = run()
    return _EpochRun(total.item(), steps, len(batches), speculate)


def _speculate(run: Callable[[], tuple[Tensor, int]], comm: Comm) -> tuple[float, int, bool]:
    """``run()`` with its checks deferred: its total and steps, and whether a check failed (on any rank), read
    together. An error raised after a check failed is taken for a consequence of it: the steps went on with what
    the check would have stopped."""
    try:
        with deferred_checks() as checks:
            total, steps = run()
    except Exception:
        if checks.flag is None or not bool(checks.flag):
            raise
        return math.nan, 0, True
    total, failed = torch.stack([total, comm.all_reduce_sum(checks.any_failed(total))]).tolist()
    return total, steps, failed > 0


def _undoer(model: GPModel, optimiser, device: torch.device) -> Callable[[], None]:
    """A function that puts back, as they are now, what an epoch changes: the model's parameters and buffers, the
    optimiser's state, and the random state that losses draw from (SoftKI's probes, the softmax likelihood's Monte
    Carlo). A cache keyed on a parameter's version (q's precision) sees the restored parameter as new
    and is recomputed."""
    model_state, optimiser_state = snapshot(model.state_dict()), snapshot(optimiser.state_dict())
    cpu_random = torch.get_rng_state()
    cuda_random = torch.cuda.get_rng_state(device) if device.type == "cuda" else None

    def undo() -> None:
        model.load_state_dict(model_state)
        optimiser.load_state_dict(optimiser_state)
        torch.set_rng_state(cpu_random)
        if cuda_random is not None:
            torch.cuda.set_rng_state(cuda_random, device)

    return undo


def snapshot(state):
    """A copy of a (nested) state dict, every tensor cloned and the containers rebuilt; ``copy.deepcopy`` takes its
    pickling path per tensor, about 0.4 to 0.9 ms for a model and its Adam state where this takes 0.1 (every epoch
    takes one, and a full-batch model's epoch is one step)."""
    if isinstance(state, Tensor):
        return state.clone()
    if isinstance(state, dict):
        copied = type(state)((key, snapshot(value)) for key, value in state.items())
        if hasattr(state, "_metadata"):  # a module's state dict: its modules' versions, which loading reads
            copied._metadata = copy.deepcopy(state._metadata)
        return copied
    if isinstance(state, (list, tuple)):
        return type(state)(snapshot(value) for value in state)
    return copy.copy(state)


INIT_ROWS = 200_000  # the most rows a model's initialisation (k-means, PCA, a data box) sees
GATHERED_ROWS = 16_384  # rows of the initialisation's sample gathered at a time


def initialisation_rows(X: Tensor, y: Tensor, seed: int, comm: Comm = LOCAL,
                        release: Callable[[], None] = lambda: None) -> tuple[Tensor, Tensor]:
    """The rows a model is initialised on, gathered from every process's shard (X [n_r, d], y [n_r]), the same
    for any number of processes, so that 1 and N processes start from the same model: every row, in global order,
    up to :data:`INIT_ROWS`; beyond, a sample of that many drawn by global row index (seeded), in order, gathered
    :data:`GATHERED_ROWS` at a time with ``release`` (a mapped X's, see :func:`fit`) after each."""
    shard = Shard.of(X.shape[0], comm)
    if shard.n_global <= INIT_ROWS:
        if comm.world_size == 1:
            return X, y
        rows = torch.arange(shard.n_global)
    else:
        draw = torch.randperm(shard.n_global, generator=torch.Generator().manual_seed(seed))
        rows = draw[:INIT_ROWS].sort().values
    parts = []
    for part in rows.split(GATHERED_ROWS):
        parts.append(gather_rows(X, y, part, shard.offset, comm))
        release()
    return torch.cat([X for X, _ in parts]), torch.cat([y for _, y in parts])


@torch.no_grad()
def _validation_nlpd(model, X, y, X_val, y_val, comm=LOCAL) -> float:
    """The mean validation NLPD over every process's held-out rows (the same number on every rank)."""
    model.fit_posterior(X, y, comm)
    means, variances = model.predict_mixture(X_val)  # [S, n]: the density is the mixture's, the mean of S
    S = means.shape[0]
    log_densities = model.likelihood.log_predictive_density(y_val.repeat(S), means.flatten(0, 1),
                                                            variances.flatten(0, 1)).reshape(S, -1)
    log_density = torch.logsumexp(log_densities, 0) - math.log(S)
    total = comm.all_reduce_sum(torch.stack([-log_density.sum(), torch.tensor(float(len(y_val))).to(means)]))
    model.clear_cache()
    return (total[0] / total[1]).item()


def _validation_split(X, y, fraction, generator, comm=LOCAL):
    """(X_fit, y_fit, X_val, y_val): ``fraction`` of the rows held out, drawn by ``generator``; under data
    parallelism each rank holds out that fraction of its shard, drawn by a generator of its own, so that the
    shared generator stays the same on every rank."""
    if fraction == 0.0:
        return X, y, None, None
    if comm.world_size > 1:
        generator = torch.Generator().manual_seed(int(torch.randint(2**62, (), generator=generator)) + comm.rank)
    n_val = int(round(fraction * X.shape[0]))
    if n_val < 1 or n_val >= X.shape[0]:
        raise ValueError(f"val_fraction={fraction} leaves no validation or no training rows for n={X.shape[0]}.")
    order = torch.randperm(X.shape[0], generator=generator).to(X.device)
    val, fit_ = order[:n_val], order[n_val:]
    return X[fit_], y[fit_], X[val], y[val]


def _make_scheduler(schedule, optimiser, epochs):
    if schedule is None or schedule == "constant":
        return None
    if schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, T_max=epochs)
    if callable(schedule):
        return schedule(optimiser, epochs)
    raise ValueError(f"Unknown schedule {schedule!r}; use None, 'constant', 'cosine' or a callable.")


def _perturb(model: GPModel, generator: torch.Generator, scale: float) -> None:
    """Jitter the unconstrained hyperparameters (not the variational or inducing parameters, which k-means and
    the prior initialised) by ``scale`` standard normal noise."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.rsplit(".", 1)[-1].startswith("raw_"):
                p.add_(scale * torch.randn(p.shape, generator=generator).to(p))


class _Checkpointer:
    """Writes (rank 0) and reads (every rank) one fit's checkpoint at ``path``, with the fingerprints of its data
    and settings (:mod:`gpscale.checkpoint`)."""

    def __init__(self, path, data: dict, settings: dict, comm: Comm):
        self.path, self.data, self.settings, self.comm = path, data, settings, comm

    def save(self, model, optimiser, scheduler, generator_state: Tensor, history: list[dict], best: dict,
             plateau: dict, partial: _Partial, finished: tuple[bool, bool] | None = None) -> None:
        """The training state after the epochs in ``history`` and ``partial.steps`` steps of the next, whose
        permutation ``generator_state`` draws; ``finished``: (converged, stopped early) where the plateau rule or
        early stopping ended training there, so that a resume trains no further."""
        if self.comm.rank != 0:
            return
        state = {"model": model.state_dict(), "optimiser": optimiser.state_dict(),
                 "scheduler": scheduler.state_dict() if scheduler is not None else None,
                 "generator": generator_state, "random": torch.get_rng_state(), "history": history, "best": best,
                 "plateau": plateau, "partial": tuple(partial),
                 "step_state": model.step_state() if partial.steps else {}, "finished": finished}
        write_checkpoint(self.path, state, self.data, self.settings)

    def read(self) -> dict:
        checkpoint = read_checkpoint(self.path)
        check_resumable(self.path, checkpoint, self.data, self.settings)
        return checkpoint

    def load_model(self, model: GPModel, checkpoint: dict) -> None:
        try:
            model.load_state_dict(checkpoint["model"])
        except (RuntimeError, KeyError) as err:
            first = str(err).strip().splitlines()[-1].strip() if str(err).strip() else type(err).__name__
            raise CheckpointError(f"Cannot resume from {self.path}: its model state does not fit this model "
                                  f"({first}). Delete it (or give checkpoint= a new file) to start afresh.") from None


def _check_optimizer(optimizer, model, *, val_fraction, schedule, checkpoint) -> None:
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"Unknown optimizer {optimizer!r}; use one of {OPTIMIZERS}.")
    if optimizer != "lbfgs":
        return
    if not model.full_batch:
        raise ValueError(f"optimizer='lbfgs' needs the full-batch loss, but {model.key or type(model).__name__} "
                         "trains on minibatches; use optimizer='adam'.")
    unsupported = {"val_fraction": val_fraction > 0, "schedule": schedule not in (None, "constant"),
                   "checkpoint": checkpoint is not None}
    for name, given in unsupported.items():
        if given:
            raise ValueError(f"optimizer='lbfgs' runs to convergence without {name}; drop {name} or use "
                             "optimizer='adam'.")


def _check_positive(**values) -> None:
    for name, value in values.items():
        if value is not None and not value > 0:
            raise ValueError(f"Expected {name} to be positive. Got {value}.")

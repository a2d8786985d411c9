"""Adam's training loop: epochs of optimiser steps (:mod:`gpscale.train.epoch`), for a fixed number of epochs with
an optional learning-rate schedule and early stopping on the validation NLPD, or to convergence by the plateau rule;
the state saved to a checkpoint after every epoch and where a stop is asked for."""
from __future__ import annotations

import gc
import math
import time
from typing import Callable

import torch
from torch.nn.parallel import DistributedDataParallel

from ..defaults import Convergence, Training
from ..distributed import LOCAL
from ..models.base import GPModel
from ..preemption import Stopped, StopRequest
from ..sources import MappedRows
from .batches import Shard
from .checkpointing import Checkpointer, Partial, snapshot
from .convergence import Plateau, cuts_due, epochs_of
from .epoch import Objective, run_epoch
from .progress import progress_bar
from .validation import validation_nlpd

__all__ = ["adam", "Schedule", "make_scheduler", "optimise_adam"]

Schedule = str | Callable[[torch.optim.Optimizer, int], torch.optim.lr_scheduler.LRScheduler] | None


def adam(model: GPModel, lr: float) -> torch.optim.Adam:
    """Adam on the model's parameter groups, in PyTorch's fused form: one kernel per dtype and device for the whole
    update instead of a dozen operators per tensor, so that the overhead of a step, most of a small model's step,
    does not grow with its number of parameter tensors; the update is the same."""
    return torch.optim.Adam(model.parameter_groups(), lr=lr, fused=True)


def make_scheduler(schedule: Schedule, optimiser, epochs):
    """The learning-rate scheduler of ``schedule`` (see :func:`~gpscale.train.fit`) over ``epochs``; None for a
    constant rate."""
    if schedule is None or schedule == "constant":
        return None
    if schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, T_max=epochs)
    if callable(schedule):
        return schedule(optimiser, epochs)
    raise ValueError(f"Unknown schedule {schedule!r}; use None, 'constant', 'cosine' or a callable.")


def optimise_adam(model, X, y, X_val, y_val, result, state, generator, settings: Training, convergence: Convergence,
                  *, schedule, patience, val_every, progress, saver: Checkpointer | None = None,
                  stop: StopRequest | None = None, comm=LOCAL, mapped: MappedRows | None = None) -> None:
    """Adam, for a fixed number of epochs or (``settings.epochs`` None) to convergence by the plateau rule; with a
    ``saver``, the state saved after every epoch, and at the step boundary where ``stop`` asks to stop, before
    :class:`Stopped` is raised. ``state`` is a checkpoint's to resume from, or None; ``result`` gets the history."""
    model.clear_cache()
    optimiser = adam(model, settings.lr)
    shard = Shard.of(X.shape[0], comm)
    converging = settings.epochs is None
    epochs, steps_per_epoch, sample, window = epochs_of(settings, convergence, model.full_batch, shard.n_global)
    cap = epochs * steps_per_epoch  # the cap of steps in whole epochs, whose last part the cool-down takes
    scheduler = None if converging else make_scheduler(schedule, optimiser, epochs)
    best = {"nlpd": math.inf, "state": None, "epoch": None, "last_good": -1}
    watching = X_val is not None and (convergence.watch_validation or not converging)
    plateau = Plateau(convergence, patience, state.get("plateau") if state else None,
                      minibatch=not model.full_batch and not watching)
    first, done_before = 0, Partial(0, 0.0)  # the epoch to start at, and its steps taken before a stop
    if state is not None:
        optimiser.load_state_dict(state["optimiser"])
        if scheduler is not None:
            scheduler.load_state_dict(state["scheduler"])
        generator.set_state(state["generator"])
        torch.set_rng_state(state["random"])
        result.history, best = state["history"], state["best"]
        first, done_before = len(result.history), Partial(*state["partial"])
        if state["finished"] is not None:  # the plateau rule or early stopping had ended it: nothing left to train
            epochs = first
            result.converged, result.stopped_early = state["finished"]
    for group in optimiser.param_groups:  # the rates that the cuts divide (a checkpoint's, where resumed)
        group.setdefault("initial_lr", group["lr"])

    def set_rate(step: int) -> None:
        """Training to convergence, the rate of the fit's step ``step`` (from 0): the first rate cut once for each
        of the plateau rule's cuts or of the cool-down's due at that step, whichever are more."""
        cuts = max(plateau.state["cuts"], cuts_due(step, cap, convergence))
        for group in optimiser.param_groups:
            group["lr"] = group["initial_lr"] * convergence.lr_factor ** cuts

    step_state = state["step_state"] if state is not None else {}
    objective = Objective(model)
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
        rate = (lambda step: set_rate(epoch * steps_per_epoch + step)) if converging else None
        run = run_epoch(model, objective, X, y, optimiser, generator, settings.batch_size, shard, comm, speculate,
                        first_step=done_before.steps, stop=stop, mapped=mapped, sample=sample, rate=rate)
        speculate = speculate and not run.redone  # a check that failed tends to fail again: check eagerly from now
        if run.steps < run.n_steps:  # asked to stop
            partial = Partial(run.steps, done_before.total + run.total)
            saver.save(model, optimiser, scheduler, epoch_start, result.history, best, plateau.state, partial, None)
            comm.barrier()  # no process ends, which would make torchrun stop the others, before rank 0 has saved
            raise Stopped(stop.pending(comm), checkpoint=saver.path, step=epoch * steps_per_epoch + run.steps)
        loss, done_before = (done_before.total + run.total) / run.n_steps, Partial(0, 0.0)
        if scheduler is not None:
            scheduler.step()
        record = {"epoch": epoch, "step": (epoch + 1) * steps_per_epoch, "loss": loss,
                  "lr": optimiser.param_groups[0]["lr"], "seconds": time.perf_counter() - tic}
        window_ends = converging and (epoch + 1) % window == 0
        validate = window_ends if converging else ((epoch + 1) % val_every == 0 or epoch + 1 == epochs)
        if watching and validate:
            record["val_nlpd"] = validation_nlpd(model, X, y, X_val, y_val, comm)
            if record["val_nlpd"] < best["nlpd"]:
                best = {"nlpd": record["val_nlpd"], "state": snapshot(model.state_dict()), "epoch": epoch,
                        "last_good": epoch}
        result.history.append(record)
        verdict = None
        if window_ends:
            watched = record.get("val_nlpd", sum(h["loss"] for h in result.history[-window:]) / window)
            verdict = plateau.update(watched)
        if converging and verdict != "stop":
            # the rule counts the cool-down's cuts so far, so that the plateau after the last ends the fit
            plateau.catch_up(cuts_due((epoch + 1) * steps_per_epoch - 1, cap, convergence))
        bar.set_postfix({k: f"{v:.4g}" for k, v in record.items() if k in ("loss", "val_nlpd")})
        stopping_early = not converging and "val_nlpd" in record and epoch - best["last_good"] >= patience
        if saver is not None:
            finished = (verdict == "stop", stopping_early) if verdict == "stop" or stopping_early else None
            saver.save(model, optimiser, scheduler, generator.get_state(), result.history, best, plateau.state,
                       Partial(0, 0.0), finished)
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

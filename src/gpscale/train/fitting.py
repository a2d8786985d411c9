"""The entry point of training, :func:`fit`: its settings checked and filled in, the validation split, the model
initialised (or resumed from a checkpoint), the optimiser's loop run with restarts on numerical failure, the result
checked, and the posterior fitted."""
from __future__ import annotations

import os
import time
import warnings
from contextlib import nullcontext
from pathlib import Path

import torch
from torch import Tensor

from ..checkpoint import data_fingerprint
from ..defaults import Convergence, resolve_training
from ..distributed import LOCAL, Comm, broadcast_state, global_count
from ..heap import hold_freed_heap
from ..io import check_writable
from ..linalg import NotPSDError
from ..models.base import GPModel
from ..preemption import Stopped, deferred_stop
from ..sources import MappedRows
from .adam_loop import Schedule, optimise_adam
from .batches import initialisation_rows
from .checkpointing import Checkpointer, snapshot
from .lbfgs_loop import optimise_lbfgs
from .result import FitResult, TrainingError, check_improved, check_not_degenerate
from .validation import fit_posterior_after_held_out, held_out_fraction, validation_split

__all__ = ["fit", "OPTIMIZERS"]

OPTIMIZERS = ("adam", "lbfgs")


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
    val_fraction: float | None = None,
    patience: int | None = None,
    val_every: int = 1,
    seed: int = 0,
    progress: bool = True,
    max_restarts: int = 3,
    checkpoint: str | os.PathLike | None = None,
    resume: bool = False,
    comm: Comm = LOCAL,
    convergence: Convergence | None = None,
    checkpoint_settings: dict | None = None,
    mapped: MappedRows | None = None,
) -> FitResult:
    """Train ``model`` on X [n, d], y [n] (tensors in the model's dtype and device), then fit its posterior.

    Settings left as None come from the model class's :meth:`~gpscale.models.base.GPModel.training_defaults`
    (what every entry point reads).

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
        val_fraction: hold out this fraction (seeded; None: the method's default when training to convergence
            on at most :data:`~gpscale.defaults.HELD_OUT_MAX_ROWS` rows, else 0), for the model to calibrate on
            (:meth:`~gpscale.models.base.GPModel.calibrate_on_held_out`) and for the validation NLPD: with a fixed
            ``epochs`` after each epoch, training stopping after ``patience`` epochs without improvement; when
            training to convergence at the end of each window, the plateau rule then watching the validation NLPD
            instead of the training loss (unless ``convergence.watch_validation`` is False). The best parameters
            are restored.
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
            ``val_fraction``, the rows held out are drawn over the global rows (the split one process holding
            every row draws) and the validation NLPD is the mean over all of them.
        convergence: the plateau rule of training to convergence (default: the model class's
            ``default_convergence``).
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

    The posterior is fitted on all of (X, y), the validation rows included, after the model has taken what it takes
    from the held-out rows.
    """
    convergence = type(model).default_convergence if convergence is None else convergence
    posterior = {name: getattr(model, name) for name in model.posterior_options}  # as refit_posterior sets them
    val_fraction = held_out_fraction(type(model), posterior, val_fraction, epochs, global_count(X.shape[0], comm))
    settings = resolve_training(model.training_defaults(), epochs=epochs, max_steps=max_steps,
                                optimizer=optimizer, lr=lr, batch_size=batch_size,
                                watched=val_fraction > 0 or checkpoint is not None)
    _check_positive(epochs=settings.epochs, max_steps=settings.max_steps, batch_size=settings.batch_size,
                    lr=settings.lr, patience=patience, val_every=val_every)
    _check_optimizer(settings.optimizer, model, schedule=schedule, checkpoint=checkpoint,
                     validation=val_fraction > 0 and convergence.watch_validation)
    if settings.epochs is None and schedule not in (None, "constant"):
        raise ValueError(f"schedule={schedule!r} anneals over a fixed number of epochs; pass epochs=, or leave "
                         "schedule=None (training to convergence steps the learning rate down on plateaus).")
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"Expected val_fraction in [0, 1). Got {val_fraction}.")
    with hold_freed_heap():  # each step reuses the pages of the step before it
        generator = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        X_fit, y_fit, X_val, y_val = validation_split(X, y, val_fraction, generator, comm)
        if resume and checkpoint is None:
            raise ValueError("resume=True continues from a checkpoint: pass checkpoint=PATH (--checkpoint PATH on the "
                             "command line) too.")
        if checkpoint is not None and comm.rank == 0:
            check_writable(checkpoint)  # before the first epoch, not after it
        shaping = {"method": model.key or type(model).__name__, "dtype": str(X.dtype).removeprefix("torch."),
                   "batch_size": settings.batch_size, "lr": settings.lr, "val_fraction": val_fraction, "seed": seed,
                   "schedule": schedule, "patience": patience, "val_every": val_every, "convergence": convergence,
                   # training to convergence cools down the last part of its cap: another cap, another schedule
                   "max_steps": settings.max_steps if settings.epochs is None else None}
        release = mapped.release if mapped is not None else (lambda: None)
        saver = None if checkpoint is None else Checkpointer(
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
                        optimise_lbfgs(model, X_fit, y_fit, result, settings, convergence, progress=progress, comm=comm)
                    else:
                        # a validation split holds its training rows in memory, which steps index directly
                        optimise_adam(model, X_fit, y_fit, X_val, y_val, result, state, generator, settings,
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
        check_improved(result)
        check_not_degenerate(result, model, y_fit, comm, converged=result.converged is True)
        fit_posterior_after_held_out(model, X, y, (X_fit, y_fit, X_val, y_val), comm)
        release()
        result.seconds, result.val_fraction = time.perf_counter() - start, val_fraction
        return result


def _perturb(model: GPModel, generator: torch.Generator, scale: float) -> None:
    """Jitter the unconstrained hyperparameters (not the variational or inducing parameters, which k-means and
    the prior initialised) by ``scale`` standard normal noise."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.rsplit(".", 1)[-1].startswith("raw_"):
                p.add_(scale * torch.randn(p.shape, generator=generator).to(p))


def _check_optimizer(optimizer, model, *, validation, schedule, checkpoint) -> None:
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"Unknown optimizer {optimizer!r}; use one of {OPTIMIZERS}.")
    if optimizer != "lbfgs":
        return
    if not model.full_batch:
        raise ValueError(f"optimizer='lbfgs' needs the full-batch loss, but {model.key or type(model).__name__} "
                         "trains on minibatches; use optimizer='adam'.")
    unsupported = {"val_fraction": validation, "schedule": schedule not in (None, "constant"),
                   "checkpoint": checkpoint is not None}
    for name, given in unsupported.items():
        if given:
            raise ValueError(f"optimizer='lbfgs' runs to convergence without {name}; drop {name} or use "
                             "optimizer='adam'.")


def _check_positive(**values) -> None:
    for name, value in values.items():
        if value is not None and not value > 0:
            raise ValueError(f"Expected {name} to be positive. Got {value}.")

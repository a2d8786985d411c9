"""What :func:`~gpscale.train.fit` returns, and the checks that what it trained is a model: that the objective did
not end far worse than it began, and not far worse than ignoring the inputs."""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..defaults import Training
from ..distributed import Comm
from ..models.base import GPModel

__all__ = ["TrainingError", "FitResult", "check_improved", "check_not_degenerate", "DEGENERATE_EXCESS",
           "ABSURD_EXCESS"]


class TrainingError(RuntimeError):
    """Training diverged (non-finite loss) and restarts did not help."""


@dataclass
class FitResult:
    """What happened during :func:`fit`. ``history`` has one dict per epoch, or per L-BFGS iteration (epoch, the
    optimiser steps taken so far, loss, lr, seconds and, with validation, val_nlpd). ``settings`` are the training
    settings that ran (the defaults filled in). ``converged`` says, when training ran to convergence, whether the
    plateau rule (or L-BFGS's own test) ended it before the cap of steps; None for a fixed number of epochs.
    ``val_fraction`` is the share of the rows training held out (drawn by ``validation_split`` from the fit's seed)."""

    history: list[dict] = field(default_factory=list)
    settings: Training | None = None
    restarts: int = 0
    best_epoch: int | None = None
    stopped_early: bool = False
    converged: bool | None = None
    seconds: float = 0.0
    val_fraction: float = 0.0

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


def check_improved(result: FitResult) -> None:
    """Raise :class:`TrainingError` when training left the objective (per data point) worse than its first epoch
    by more than 1 nat and more than its size: the optimiser diverged, and the model it left is degenerate (a
    constant predictive variance, a training loss orders of magnitude above its start)."""
    if len(result.history) < 2 or result.best_epoch is not None:  # validation kept the best epoch's parameters
        return
    first, last = result.history[0]["loss"], result.history[-1]["loss"]
    if last - first > max(1.0, abs(first)):
        lr = result.settings.lr if result.settings is not None else None
        raise TrainingError(f"training made the objective worse, from {first:.4g} in its first epoch to {last:.4g} "
                            f"at the end: the optimiser diverged. Lower the learning rate (lr={lr}).")


# nats per point by which the best objective of a training run may exceed the loss of the best model that ignores
# the inputs (``likelihood.null_loss``, within every GP's reach) before the fit is called degenerate: a GP trained to
# convergence is never worse than that model by more than its KL term (a few nats at most); absurd hyperparameters
# given (an outputscale of 1e12 with a noise of 1e-9, in float32) can leave a fit orders of magnitude beyond it
DEGENERATE_EXCESS = 100.0
# beyond this excess no budget explains the fit (its predictive density e^-1e6 below the null model's): an error
# even when a budget ended training
ABSURD_EXCESS = 1e6


def check_not_degenerate(result: FitResult, model: GPModel, y: Tensor, comm: Comm, converged: bool) -> None:
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

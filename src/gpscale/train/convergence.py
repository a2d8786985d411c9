"""Training to convergence (:class:`~gpscale.defaults.Convergence`): how Adam's epochs are cut into rounds and
windows, the plateau rule over the windows, and L-BFGS's plateau test over its evaluations of the loss."""
from __future__ import annotations

import math
from typing import NamedTuple

from ..defaults import Convergence, Training

__all__ = ["Plateau", "cuts_due", "Epochs", "epochs_of", "lbfgs_plateaued"]


class Plateau:
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

    def catch_up(self, due: int) -> None:
        """Count the cuts of ``due`` (:func:`cuts_due`) not yet counted, so that the plateau after ``lr_cuts`` cuts,
        the rule's or the cool-down's, ends training. The wait starts afresh after a cut."""
        cuts = min(max(due, self.state["cuts"]), self.lr_cuts)
        if cuts > self.state["cuts"]:
            self.state.update(cuts=cuts, waited=0)


def cuts_due(step: int, steps: int, convergence: Convergence) -> int:
    """The learning-rate cuts due at step ``step`` (from 0) of a fit to convergence with a cap of ``steps``: the last
    ``cooldown`` share of the cap is cut into ``lr_cuts`` parts of ``w = cooldown * steps / lr_cuts`` steps, the
    i-th at the rate of i cuts, so with r = steps - step steps left (this one among them),
    ``lr_cuts + 1 - ceil(r / w)``, within [0, lr_cuts]."""
    if convergence.cooldown <= 0 or convergence.lr_cuts <= 0:
        return 0
    part = convergence.cooldown * steps / convergence.lr_cuts
    due = convergence.lr_cuts + 1 - math.ceil((steps - step) / part)
    return min(convergence.lr_cuts, max(0, due))


class Epochs(NamedTuple):
    """How Adam's training is cut: ``epochs`` passes of ``steps_per_epoch`` steps, each over the first ``sample``
    rows of its permutation (None: all rows); training to convergence, the plateau rule reads the mean loss of every
    ``window`` epochs (None for a fixed number of epochs)."""

    epochs: int
    steps_per_epoch: int
    sample: int | None
    window: int | None


def epochs_of(settings: Training, convergence: Convergence, full_batch: bool, n_global: int) -> Epochs:
    """The epochs of a fit on ``n_global`` rows. A fixed ``settings.epochs`` passes over all the rows. Training to
    convergence (``settings.epochs`` None) on so many rows that an epoch exceeds ``convergence.minibatch_round``
    steps, each epoch is a round of that many steps on a fresh sample of the rows, so that the plateau rule reads
    the loss often whatever the size of the data; windows are whole epochs, and the cap in steps becomes a cap in
    epochs."""
    steps_per_epoch = 1 if full_batch else math.ceil(n_global / settings.batch_size)
    if settings.epochs is not None:
        return Epochs(settings.epochs, steps_per_epoch, None, None)
    sample = None
    if steps_per_epoch > convergence.minibatch_round:
        steps_per_epoch, sample = convergence.minibatch_round, convergence.minibatch_round * settings.batch_size
    window = convergence.full_batch_window if full_batch else math.ceil(convergence.minibatch_window / steps_per_epoch)
    return Epochs(math.ceil(settings.max_steps / steps_per_epoch), steps_per_epoch, sample, window)


def lbfgs_plateaued(marks: list[tuple[int, float]], loss: float, evaluations: int, convergence: Convergence) -> bool:
    """Whether the loss fell by less than ``tol * max(1, |loss|)`` over the last ``lbfgs_window`` evaluations: since
    the latest iteration in ``marks`` (evaluations so far, loss) that ended that many evaluations or more ago.

    The window counts evaluations, each a pass over the data, rather than iterations: near a minimum, where
    round-off blurs the loss, each of L-BFGS's line searches may take ten or twenty evaluations for a change in the
    sixth digit, so that a window of iterations would let the last few iterations cost most of the run."""
    earlier = [before for at, before in marks if at <= evaluations - convergence.lbfgs_window]
    return bool(earlier) and earlier[-1] - loss < convergence.tol * max(1.0, abs(loss))

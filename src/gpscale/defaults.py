"""The library's defaults that belong to no one method: the shape of a method's training defaults and the generic
rows, the rule that decides when training has converged, and the thresholds and budgets by which ``method="auto"``
picks a method (:func:`gpscale.models.auto.choose_method`).

Each method declares its own defaults on its model class (:class:`~gpscale.models.base.GPModel`:
``default_training``, ``auto_dtype``, ``default_max_steps``); :class:`~gpscale.GPRegressor`,
:class:`~gpscale.GPClassifier`, the command line, the benchmark runner and :func:`gpscale.train.fit` all read them
through the registry, so a setting left out means the same thing wherever it is left out, for a registered user
model as for a built-in one. A model's own options (inducing points, noise, calibration) default to its
constructor's defaults, which the model documents.

Two ways to train:

- ``epochs=None`` (the default): train until the objective stops improving (:class:`Convergence`), at most
  ``max_steps`` optimiser steps. Full-batch methods (the collapsed bounds: exact, sgpr, vff, grief, dbk) use
  scipy's L-BFGS-B, which needs no learning rate and converges in tens to hundreds of iterations; minibatch
  methods use Adam with a step-down schedule on plateaus (natural-gradient steps for q where the model takes
  them). The cap counts optimiser steps, not passes over the data, so a small data set gets as many steps as a
  large one; an L-BFGS fit also stops after ``max_steps`` evaluations of the objective, because its line search
  may take several (each a pass over the data) in one iteration near the optimum.
- ``epochs=N``: N passes over the data with Adam at the method's learning rate (one step per pass for full-batch
  methods), as gpscale has always trained: what the paper protocols pin.

The estimators also start the lengthscale(s) of a stationary kernel (RBF, Matérn) at the median distance between
training rows, unless given ``lengthscale=`` or a kernel object
(:meth:`~gpscale.models.base.GPModel.start_lengthscale_at_median`). The models' own default, ln 2 as GPyTorch's,
suits a few standardised inputs; over many, typical rows lie so far apart in its units that the kernel between
them underflows, and L-BFGS, seeing no gradient, stops where the model explains nothing, no better than the
mean. The median distance puts typical pairs of rows at a kernel value of order one whatever the number of inputs.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TrainingDefaults", "Convergence", "CONVERGENCE", "FULL_BATCH_TRAINING", "MINIBATCH_TRAINING",
           "resolve_training", "Training", "AUTO_EXACT_MAX_N", "AUTO_EXACT_MAX_FLOPS", "AUTO_ITERATIVE_MAX_ENTRIES",
           "AUTO_ITERATIVE_PRODUCTS", "AUTO_INDUCING", "AUTO_COLLAPSED_MAX_WORK", "CHOLESKY_MEMORY_FRACTION",
           "SGPR_WORK_BUDGET", "EXACT_EVIDENCE_BUDGET", "HELD_OUT_MAX_ROWS",
           "HELD_OUT_MIN_ROWS"]


@dataclass(frozen=True)
class TrainingDefaults:
    """How one method trains unless told otherwise.

    Attributes:
        optimizer: the optimiser of training to convergence (``epochs=None``): ``"lbfgs"`` or ``"adam"``. A fixed
            ``epochs`` always trains with Adam unless ``optimizer`` is given.
        lr: Adam's learning rate.
        batch_size: rows per Adam step (minibatch methods; full-batch methods use every row).
        max_steps: the cap of training to convergence, in optimiser steps (Adam steps, or L-BFGS iterations and
            evaluations of the loss).
        val_fraction: the share of the rows held out from training (validation, and what a model takes from rows
            it was not trained on: :meth:`~gpscale.models.base.GPModel.calibrate_on_held_out`); 0 for none. It
            applies to training to convergence on at most :data:`HELD_OUT_MAX_ROWS` rows where it holds out at
            least :data:`HELD_OUT_MIN_ROWS`: a fixed ``epochs`` trains on every row unless told otherwise. A
            method may make it depend on its options (:meth:`~gpscale.models.base.GPModel.default_val_fraction`).
    """

    optimizer: str
    lr: float
    batch_size: int = 1024
    max_steps: int = 5000
    val_fraction: float = 0.0


# A method's default val_fraction holds rows out of fits of at most this many rows. A split copies the rows it
# keeps, so beyond this a fit from a file would hold memory that grows with n; and the rows a model is trained on
# understate the noise at new rows where it can nearly fit them, which is a small-data effect.
HELD_OUT_MAX_ROWS = 100_000
# ... and only where it holds out at least this many: a noise variance fitted to fewer is too loose an estimate
HELD_OUT_MIN_ROWS = 50


@dataclass(frozen=True)
class Convergence:
    """When training with ``epochs=None`` stops: the plateau rule.

    The objective is watched in windows. For full-batch Adam a window is ``full_batch_window`` steps; for minibatch
    Adam it is the smallest whole number of rounds holding at least ``minibatch_window`` steps, a round being an
    epoch (so a window sees every row, and its mean loss is a smoothed full-data objective) or, where an epoch would
    take more than ``minibatch_round`` steps, ``minibatch_round`` steps on a fresh random sample of the rows, drawn
    without replacement (so that on millions of rows the rule still acts, and steps the learning rate down, within
    the cap of steps, where a single epoch would outlast the cap at the first learning rate). A window *improves*
    when its mean loss (or, with ``val_fraction > 0``, the validation NLPD at its end) is below the best so far by
    more than ``tol * max(1, |best|)``, where ``tol`` is ``minibatch_tol`` for minibatch losses: the mean of a
    window of minibatch losses moves by about that much from window to window by chance alone. After ``patience``
    windows without improvement Adam's learning rate is multiplied by ``lr_factor``; the next such plateau after
    ``lr_cuts`` cuts ends training. A fit that the rule has not ended by the last ``cooldown`` share of its cap of
    steps (rounded up to whole epochs) takes the cuts it has left there, one at the first step of each of
    ``lr_cuts`` equal parts of that share, so that a fit which reaches its cap ends at the lowest rate, as one the
    rule ends does, and not in the noise of its first rate (Adam's iterate wanders by about the rate times the
    gradient's spread). L-BFGS-B stops where scipy's own tests say it has converged, or when the loss
    fell by less than ``tol * max(1, |loss|)`` over the last ``lbfgs_window`` evaluations of the loss (counted to
    the end of an iteration: with one evaluation an iteration, the last ``lbfgs_window`` iterations; fewer where
    line searches take several). Either way, training stops after the method's ``max_steps``. With
    ``watch_validation=False`` the rule watches the training loss even where rows are held out: they serve what the
    model takes from them (:meth:`~gpscale.models.base.GPModel.calibrate_on_held_out`), not early stopping.
    """

    tol: float = 1e-4
    minibatch_tol: float = 2e-3
    patience: int = 2
    lr_factor: float = 0.1
    lr_cuts: int = 2
    cooldown: float = 0.2
    full_batch_window: int = 10
    minibatch_window: int = 100
    minibatch_round: int = 1000
    lbfgs_window: int = 10
    watch_validation: bool = True


CONVERGENCE = Convergence()

# The generic rows: a model class that sets no ``default_training`` of its own
# (:meth:`gpscale.models.base.GPModel.training_defaults`) takes the first if it trains full batch, else the second.
FULL_BATCH_TRAINING = TrainingDefaults("lbfgs", lr=0.1, max_steps=1000)
MINIBATCH_TRAINING = TrainingDefaults("adam", lr=0.01, max_steps=5000)


@dataclass(frozen=True)
class Training:
    """Settings of one training run, every one decided: ``epochs`` None means to convergence."""

    epochs: int | None
    max_steps: int
    optimizer: str
    lr: float
    batch_size: int


def resolve_training(row: TrainingDefaults, *, epochs: int | None = None, max_steps: int | None = None,
                     optimizer: str | None = None, lr: float | None = None, batch_size: int | None = None,
                     watched: bool = False) -> Training:
    """Fill in what the caller left as None from the method's row (its class's
    :meth:`~gpscale.models.base.GPModel.training_defaults`): the optimiser is the row's for training to
    convergence, and Adam for a fixed number of epochs or when training is ``watched`` (validation or checkpoints,
    which L-BFGS does not support)."""
    if optimizer is None:
        optimizer = row.optimizer if epochs is None and not watched else "adam"
    return Training(epochs=epochs, max_steps=row.max_steps if max_steps is None else max_steps,
                    optimizer=optimizer, lr=row.lr if lr is None else lr,
                    batch_size=row.batch_size if batch_size is None else batch_size)


# --- method="auto" ---------------------------------------------------------------------------------------------
# The exact GP is what every other method approximates, so auto fits it wherever the machine affords it: its
# hyperparameters from the exact evidence of 5,000 rows, then one float64 Cholesky factor of all n rows, n^3 / 3
# floating-point operations and 8 n^2 bytes, which must take at most CHOLESKY_MEMORY_FRACTION of the free memory.
# The budget of operations is the factor of 56,000 rows (docs/choosing.md gives what it costs).
AUTO_EXACT_MAX_FLOPS = 6e13
# Beyond the factor's memory, the iterative solver needs O(n) memory but computes K a block at a time in every
# product: about (CG iterations + variance_rank) n^2 kernel entries for the posterior. auto takes it while that is
# at most this many kernel entries (a GPU computes them some hundred times faster than the CPU).
AUTO_ITERATIVE_MAX_ENTRIES = {"cpu": 0.0, "cuda": 5e14}
AUTO_ITERATIVE_PRODUCTS = 400  # products with K in a default iterative posterior: CG's and the Lanczos cache's
AUTO_EXACT_MAX_N = 2000  # below this the exact GP is chosen whatever the memory says (its factor is 32 MB)
AUTO_INDUCING = 512
# the largest n m (m + d) for which sgpr is chosen: 50,000 rows with 20 features at m = 512
AUTO_COLLAPSED_MAX_WORK = 50_000 * AUTO_INDUCING * (AUTO_INDUCING + 20)
# the multiply-adds of the passes a default sgpr fit may take in all (SGPR.default_max_steps), so that a default fit of
# up to 50,000 rows ends within a few minutes on a 2-core CPU
SGPR_WORK_BUDGET = 1.1e12
# the share of the free memory the exact GP's n x n float64 factor may take (the rest: chunks and the process)
CHOLESKY_MEMORY_FRACTION = 0.8
# The exact GP's training (ExactGP.default_max_steps): each L-BFGS evaluation of the evidence of m rows is a Cholesky
# factor and its inverse, about m^3 multiply-adds. The budget is the sum of m^3 over the evaluations a default fit may
# take: 120 evaluations of 5,000 rows (docs/choosing.md gives what it costs); with many inputs the ARD lengthscales
# creep on past it.
EXACT_EVIDENCE_BUDGET = 1.5e13

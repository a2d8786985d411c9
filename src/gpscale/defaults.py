"""The library's defaults in one place: how each method trains when the caller does not say, the rule that
decides when training has converged, and the rule by which ``method="auto"`` picks a method.

:class:`~gpscale.GPRegressor`, :class:`~gpscale.GPClassifier`, the command line, the benchmark runner and
:func:`gpscale.train.fit` all read these tables, so a setting left out means the same thing wherever it is left
out. A model's own options (inducing points, noise, calibration) default to its constructor's defaults, which
the model documents.

Two ways to train:

- ``epochs=None`` (the default): train until the objective stops improving (:class:`Convergence`), at most
  ``max_steps`` optimiser steps. Full-batch methods (the collapsed bounds: exact, sgpr, vff, grief, dbk) use
  scipy's L-BFGS-B, which needs no learning rate and converges in tens to hundreds of iterations; minibatch
  methods use Adam with a step-down schedule on plateaus (natural-gradient steps for q where the model takes
  them). The cap counts optimiser steps, not passes over the data, so a small data set gets as many steps as a
  large one; an L-BFGS fit also stops after ``max_steps`` evaluations of the objective, because its line search
  may take several (each a pass over the data) in one iteration near the optimum.
- ``epochs=N``: N passes over the data with Adam at the table's learning rate (one step per pass for full-batch
  methods), as gpscale has always trained: what the paper protocols pin.

The estimators also start the lengthscale(s) of a stationary kernel (RBF, Matérn) at the median distance between
training rows, unless given ``lengthscale=`` or a kernel object
(:meth:`~gpscale.models.base.GPModel.start_lengthscale_at_median`). The models' own default, ln 2 as GPyTorch's,
suits a few standardised inputs; over many, typical rows lie so far apart in its units that the kernel between
them underflows, and L-BFGS, seeing no gradient, stops where the model explains nothing: on skillcraft (19 inputs,
split 0) SGPR stopped after 21 steps at test RMSE 0.978 (the mean's), and from the median after 56 at 0.608.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .memory import gib

__all__ = ["TrainingDefaults", "Convergence", "CONVERGENCE", "TRAINING", "training_defaults", "resolve_training",
           "Choice", "choose_method", "AUTO_EXACT_MAX_N", "AUTO_EXACT_MAX_FLOPS", "AUTO_ITERATIVE_MAX_ENTRIES",
           "CHOLESKY_MEMORY_FRACTION", "EXACT_EVIDENCE_BUDGET", "exact_max_steps", "AUTO_COLLAPSED_MAX_WORK",
           "Training", "sgpr_max_steps", "FLOAT32_METHODS", "default_dtype"]


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
    """

    optimizer: str
    lr: float
    batch_size: int = 1024
    max_steps: int = 5000


@dataclass(frozen=True)
class Convergence:
    """When training with ``epochs=None`` stops: the plateau rule.

    The objective is watched in windows. For full-batch Adam a window is ``full_batch_window`` steps; for minibatch
    Adam it is the smallest whole number of rounds holding at least ``minibatch_window`` steps, a round being an
    epoch (so a window sees every row, and its mean loss is a smoothed full-data objective) or, where an epoch would
    take more than ``minibatch_round`` steps, ``minibatch_round`` steps on a fresh random sample of the rows, drawn
    without replacement (so that on millions of rows the rule still acts, and steps the learning rate down,
    within the cap of steps, where a single epoch would outlast the cap at the first learning rate). A window *improves* when its mean loss
    (or, with ``val_fraction > 0``, the validation NLPD at its end) is below the best so far by more than
    ``tol * max(1, |best|)``, where ``tol`` is ``minibatch_tol`` for minibatch losses: the mean of a window of
    minibatch losses moves by about that much from window to window by chance alone. After ``patience`` windows
    without improvement Adam's learning rate is multiplied by ``lr_factor``; the next such plateau after
    ``lr_cuts`` cuts ends training. L-BFGS-B stops where scipy's own tests say it has converged, or when the loss
    fell by less than ``tol * max(1, |loss|)`` over the last ``lbfgs_window`` evaluations of the loss (counted to
    the end of an iteration: with one evaluation an iteration, the last ``lbfgs_window`` iterations; fewer where
    line searches take several). Either way, training stops after the method's ``max_steps``.
    """

    tol: float = 1e-4
    minibatch_tol: float = 2e-3
    patience: int = 2
    lr_factor: float = 0.1
    lr_cuts: int = 2
    full_batch_window: int = 10
    minibatch_window: int = 100
    minibatch_round: int = 1000
    lbfgs_window: int = 10


CONVERGENCE = Convergence()

_FULL_BATCH = TrainingDefaults("lbfgs", lr=0.1, max_steps=1000)
_MINIBATCH = TrainingDefaults("adam", lr=0.01, max_steps=5000)
# SVGP and HVGP move q by natural-gradient steps, Adam only the kernel and the inducing inputs, which take the
# full-batch methods' rate. Measured with SVGP (m = 512, batch 1,024): on elevators lr 0.1 converged in 1,575 steps
# to test NLPD 0.430 where lr 0.01 took 2,520 steps to 0.438; on keggdirected lr 0.1 took 1,548 steps to -0.965.
_NATURAL = TrainingDefaults("adam", lr=0.1, max_steps=5000)

# Per method; a method missing here (a user's registered model) takes _FULL_BATCH or _MINIBATCH by its full_batch.
# Where a step is dear, the cap keeps a default fit of 50,000 rows of 20 features near 10 minutes on a 2-core CPU;
# the comments give the CPU seconds of one step at the defaults on 44,000 random rows of 20 features, one thread
# (`gpscale step-time METHOD --d 20 --batch-size 1024` for the minibatch methods).
TRAINING: dict[str, TrainingDefaults] = {
    "exact": _FULL_BATCH,
    "sgpr": _FULL_BATCH,  # 3.5 s a step at that size; the estimators cap it by a budget of work (below)
    "vff": TrainingDefaults("lbfgs", lr=0.1, max_steps=100),  # 7.4 s a step (1,300 additive features)
    "grief": TrainingDefaults("lbfgs", lr=0.1, max_steps=100),  # 8.7 s a step (p = 1,000); the paper's 100
    # a network takes smaller Adam steps than a kernel's few hyperparameters (the DBK paper's 1e-3); 0.9 s a step
    "dbk": TrainingDefaults("lbfgs", lr=1e-3, max_steps=500),
    "svdbk": TrainingDefaults("adam", lr=1e-3, batch_size=256, max_steps=20_000),  # 0.007 s a step of 256 rows
    "svgp": _NATURAL,  # 0.20 s a step
    "softki": _MINIBATCH,  # 0.11 s a step
    "hvgp": TrainingDefaults("adam", lr=0.1, max_steps=400),  # 1.7 s a step (8 blocks of 128 points, orbits of 8)
    "vff-svgp": _MINIBATCH,  # 0.14 s a step
    "odvgp": _MINIBATCH,  # 0.03 s a step
    "odvff": TrainingDefaults("adam", lr=0.01, max_steps=500),  # 1.1 s a step (F = 16 per input, M_g = 300)
    # Convolutional GPs: batches of 64 images, the HKD paper's (Sun et al., ICML 2021), since every image brings
    # its P patches to each kernel evaluation (P = 576 for 5 x 5 patches of 28 x 28 images: a batch of 64 images
    # costs what 37,000 rows cost svgp). q moves by natural-gradient steps (by Adam under the robust-max likelihood,
    # the multiclass default: see gpscale.likelihoods.RobustMax); Adam moves the inducing patches (in the pixel
    # units of standardised images), their TICK positions and the kernel at lr 0.01, between svgp's 0.1 for
    # a kernel alone and the paper's 0.003 for everything, q included, over 270,000 GPU steps. The caps keep a
    # default fit near 10 minutes on a 2-core CPU; the seconds are one step on 28 x 28 images, 5 x 5 patches, TICK,
    # 10 robust-max classes, one thread.
    "conv-svgp": TrainingDefaults("adam", lr=0.01, batch_size=64, max_steps=400),  # 1.5 s a step (M = 512)
    "conv-hvgp": TrainingDefaults("adam", lr=0.01, batch_size=64, max_steps=200),  # 3.7 s a step (4 x 128)
    # the deep convolutional GP as conv-hvgp (the HKD paper's batch of 64 and, for its hidden layers' q, which Adam
    # moves, lr 0.01 between its 0.003 over 270,000 steps and a few hundred here); 2.6 s a step at its defaults
    # (2 layers: 5 x 5 then 4 x 4 by 2 patches, 10 hidden channels, 4 x 16 hidden and 4 x 128 output inducing
    # patches), so the cap keeps a default fit near 9 minutes
    "deep-conv-hvgp": TrainingDefaults("adam", lr=0.01, batch_size=64, max_steps=200),
}


# dtype="auto" (the estimators' default): the methods whose data-sized work runs in float32, their m x m (or p x p)
# cores and every solve in float64 whatever the data's dtype, where float32 measured faster at the same accuracy;
# every other method runs in float64. Measured on elevators split 0 (14,940 rows of 18 inputs), the estimator's
# defaults capped at 300 steps, one thread, float64 then float32 (CPU seconds of one step of 1,024 random rows of 17
# inputs; test RMSE and NLPD in standardised units):
#   svgp    0.24 -> 0.17 s a step, RMSE 0.3836 -> 0.3823, NLPD 0.463 -> 0.459
#   softki  0.073 -> 0.035 s a step, RMSE 0.3827 -> 0.3828, NLPD 0.464 -> 0.465
# and the same way with two threads, HVGP's default cap (210 steps), SVGP's 300, SGPR's 26 L-BFGS iterations:
#   hvgp      0.85 -> 0.30 s a step, RMSE 0.3879 -> 0.3881, NLPD 0.475 -> 0.476, coverage 0.948 both
#   sgpr      1.75 -> 2.55 s a step (float32 takes the QR solver), RMSE 0.3801 -> 0.3747: float64 stays
#   vff-svgp: the same time and the same scores to four digits (its Fourier features are float64 either way)
# and the same way (elevators split 0, one thread, CPU seconds a step over the whole fit; the machine was shared, so
# the seconds compare only within a pair), with ODVGP's and ODVFF's additive Matern-3/2 kernel:
#   odvgp   0.30 -> 0.146 s a step (300 steps), RMSE 0.4201 both, NLPD 0.5511 both, coverage 0.946 both
#   odvff   0.35 -> 0.23 s a step (300 steps), RMSE 0.4171, NLPD 0.5507, coverage 0.957, in both dtypes
#   svdbk   0.0058 -> 0.0034 s a step; converged fits RMSE 0.3522 (float64) and 0.3524 (float32), NLPD 0.406 and
#           0.407 (seeds 0 and 1: each dtype also had one fit that stopped badly, at the step cap or early)
#   dbk     0.56-0.80 -> 0.34-0.37 s an L-BFGS evaluation, RMSE 0.45-0.47 -> 0.43-0.44: faster and no worse, but
#           neither dtype fits elevators well with the defaults (NLPD 1.7-2.7, coverage 1.000)
#   vff     3.3 -> 9.1 s an L-BFGS iteration (float32 takes the QR solver), the same scores: float64 stays
# and the convolutional models with their defaults on 3,200 Fashion-MNIST training images (x_scaling="center"), 1,000
# test images, two threads, the idle machine, wall seconds a step (steps: the cap rounded up to whole epochs):
#   conv-svgp        0.62 -> 0.33 s a step (150 steps), accuracy 0.743 -> 0.742, NLL 1.165 -> 1.159
#   conv-hvgp        1.53 -> 0.63 s a step (50 steps), accuracy 0.661 both, NLL 1.265 both
#   deep-conv-hvgp   0.85 -> 0.46 s a step (50 steps), accuracy 0.578 both, NLL 1.250 -> 1.245
FLOAT32_METHODS = frozenset({"svgp", "softki", "hvgp", "odvgp", "odvff", "svdbk", "dbk", "conv-svgp", "conv-hvgp",
                             "deep-conv-hvgp"})


def default_dtype(key: str) -> str:
    """The dtype ``dtype="auto"`` gives method ``key``: ``"float32"`` for :data:`FLOAT32_METHODS`, else
    ``"float64"``."""
    return "float32" if key in FLOAT32_METHODS else "float64"


def training_defaults(key: str, full_batch: bool) -> TrainingDefaults:
    """The table's row for method ``key`` (a model whose key is not in it: by whether it trains full batch)."""
    return TRAINING.get(key, _FULL_BATCH if full_batch else _MINIBATCH)


@dataclass(frozen=True)
class Training:
    """Settings of one training run, every one decided: ``epochs`` None means to convergence."""

    epochs: int | None
    max_steps: int
    optimizer: str
    lr: float
    batch_size: int


def resolve_training(key: str, full_batch: bool, *, epochs: int | None = None, max_steps: int | None = None,
                     optimizer: str | None = None, lr: float | None = None, batch_size: int | None = None,
                     watched: bool = False) -> Training:
    """Fill in what the caller left as None from the table: the optimiser is the table's for training to
    convergence, and Adam for a fixed number of epochs or when training is ``watched`` (validation or checkpoints,
    which L-BFGS does not support)."""
    row = training_defaults(key, full_batch)
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
# the multiply-adds of the passes a default sgpr fit may take in all: about 4 minutes of the 2-core CPU above, so that a
# default fit of up to 50,000 rows ends within 5 minutes. Whole fits there ran at 4.6e9 to 5.0e9 multiply-adds of
# n m (m + d) a second (the forward pass; gradients and line searches included): with a budget of 1.4e12, elevators
# took 305 s (345 steps), pol 283 s and parkinsons 277 s on split 0.
SGPR_WORK_BUDGET = 1.1e12
# the share of the free memory the exact GP's n x n float64 factor may take (the rest: chunks and the process)
CHOLESKY_MEMORY_FRACTION = 0.8
# The exact GP's training: each L-BFGS evaluation of the evidence of m rows is a Cholesky factor and its inverse, about
# m^3 multiply-adds. The budget is the sum of m^3 over the evaluations a default fit may take: 120 evaluations of
# 5,000 rows (docs/choosing.md gives what it costs); with many inputs the ARD lengthscales creep on past it.
EXACT_EVIDENCE_BUDGET = 1.5e13


def sgpr_max_steps(n: int, d: int, n_inducing: int | None = None) -> int:
    """The cap on a default sgpr fit's L-BFGS steps (each a pass over the data, n m (m + d) multiply-adds with
    m = min(n_inducing or 512, n)): 1.1e12 multiply-adds in all, and at most the table's 1,000 steps. Read by
    ``method="auto"`` and by the estimators when they are asked for sgpr and no ``max_steps``."""
    m = min(AUTO_INDUCING if n_inducing is None else int(n_inducing), n)
    return max(1, min(TRAINING["sgpr"].max_steps, int(SGPR_WORK_BUDGET // (n * m * (m + d)))))


def exact_max_steps(n: int, evidence_rows: int | None) -> int:
    """The cap on a default exact-GP fit's L-BFGS steps (iterations and evaluations of the evidence), with
    m = min(evidence_rows, n) rows in the evidence (all n when None): 1.5e13 / m^3, at most the table's 1,000. Read
    by the estimators when they fit the exact GP, named or chosen, and no ``max_steps`` is given."""
    m = n if evidence_rows is None else min(int(evidence_rows), n)
    return max(1, min(TRAINING["exact"].max_steps, int(EXACT_EVIDENCE_BUDGET // m**3)))


@dataclass(frozen=True)
class Choice:
    """What ``method="auto"`` chose, and why (one sentence, for ``summary()``); ``max_steps`` caps its training
    when the caller does not (None: the method's own cap)."""

    method: str
    reason: str
    max_steps: int | None = None


def choose_method(n: int, d: int, task: str = "regression", n_inducing: int | None = None, *,
                  memory_bytes: float = math.inf, device_type: str = "cpu") -> Choice:
    """The method ``method="auto"`` fits to n rows of d features; ``task`` is ``"regression"`` or
    ``"classification"``; ``n_inducing``, the inducing points the caller asked for (None: 512), enters the cost of
    a pass; ``memory_bytes`` is what the device (``"cpu"`` or ``"cuda"``) has free.

    - classification: ``svgp``, the variational method with every likelihood (probit, robust-max, softmax);
    - the exact GP by its Cholesky factor, while its 8 n^2 bytes take at most 80% of ``memory_bytes`` and its
      n^3 / 3 operations at most 6e13 (always up to 2,000 rows);
    - the exact GP by the iterative solver (on a GPU), while its posterior's
      ``AUTO_ITERATIVE_PRODUCTS`` n^2 kernel entries are at most the device's ``AUTO_ITERATIVE_MAX_ENTRIES``;
    - ``sgpr`` while n m (m + d) <= 50,000 x 512 x 532 (m = min(512, n)), the collapsed bound, each of whose
      L-BFGS steps is one pass over the data; its steps are capped at 1.1e12 / (n m (m + d)) (at most the method's
      1,000), the passes that take about 4 minutes on a 2-core CPU;
    - beyond: ``svgp``, minibatch Adam, whose steps cost the same whatever n.
    """
    if task == "classification":
        return Choice("svgp", "classification needs a non-Gaussian likelihood, which the variational svgp takes")
    if task != "regression":
        raise ValueError(f"task must be 'regression' or 'classification', got {task!r}.")
    factor_bytes, factor_flops = 8.0 * n * n, n**3 / 3
    if n <= AUTO_EXACT_MAX_N:
        return Choice("exact", f"n = {n:,} <= {AUTO_EXACT_MAX_N:,}: the exact GP's Cholesky factor of every row is "
                               f"small ({_gb(factor_bytes)})")
    if factor_bytes <= CHOLESKY_MEMORY_FRACTION * memory_bytes and factor_flops <= AUTO_EXACT_MAX_FLOPS:
        return Choice("exact", f"n = {n:,}: the exact GP's Cholesky factor of every row takes {_gb(factor_bytes)} "
                               f"and {_engineering(factor_flops)} operations, which the {device_type} affords "
                               f"({_gb(memory_bytes)} free)")
    entries = AUTO_ITERATIVE_PRODUCTS * float(n) ** 2
    if entries <= AUTO_ITERATIVE_MAX_ENTRIES.get(device_type, 0.0):
        return Choice("exact", f"n = {n:,}: the {device_type}'s iterative solver for the exact GP computes "
                               f"{_engineering(entries)} kernel entries, which it affords (the model takes the "
                               f"Cholesky factor if it fits the {_gb(memory_bytes)} free)")
    too_large = (f"the exact GP's factor would take {_gb(factor_bytes)} ({_gb(memory_bytes)} free) and "
                 f"{_engineering(factor_flops)} operations")
    m = min(AUTO_INDUCING if n_inducing is None else int(n_inducing), n)
    work = n * m * (m + d)
    if work <= AUTO_COLLAPSED_MAX_WORK:
        steps = sgpr_max_steps(n, d, n_inducing)
        return Choice("sgpr", f"n = {n:,}, d = {d}: {too_large}; a pass over the data with {m} inducing points "
                              f"costs {_engineering(work)} multiply-adds, at most "
                              f"{_engineering(AUTO_COLLAPSED_MAX_WORK)}, so the collapsed bound trains full batch, "
                              f"for at most {steps} L-BFGS steps", steps)
    return Choice("svgp", f"n = {n:,}, d = {d}: {too_large}, and a full-batch pass would cost {_engineering(work)} "
                          f"multiply-adds, more than {_engineering(AUTO_COLLAPSED_MAX_WORK)}, so minibatch svgp trains "
                          "instead")


def _gb(n_bytes: float) -> str:
    return "unlimited" if math.isinf(n_bytes) else gib(n_bytes)


def _engineering(x: float) -> str:
    exponent = int(math.floor(math.log10(x)))
    return f"{x / 10 ** exponent:.1f}e{exponent}"

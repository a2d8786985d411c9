"""The constraints on the values of gpscale's numeric options: one table, checked at the front door.

The estimators check every option they are given against :data:`CONSTRAINTS` when ``fit`` starts, before they
touch the data, so that a value no method can use (``n_inducing=-5``, ``epochs=2.5``, a NaN lengthscale) is
refused with a message that names the option, the value and what it takes, instead of failing later inside torch,
scikit-learn's k-means or the fourth attempt at a Cholesky factor. The command line and the benchmark reach the
models through the estimators, so the table serves them too. ``None`` always passes: it asks for the default.

Model constructors keep their own checks of what only they know (a choice among their networks, a group that
must fit the inputs); the table holds what a value must be whatever the method.

An option renamed so that one name has one meaning across the methods is listed by its model class
(``renamed_options``, old name -> new): the estimators refuse the old name for that method with a message that
names the new one (:func:`check_renamed`), and accept nothing under it.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

__all__ = ["Constraint", "CONSTRAINTS", "check_options", "check_renamed", "constraints_table", "renamed_table"]


@dataclass(frozen=True)
class Constraint:
    """An integer or a real number in [low, high] (an end open where said; None: unbounded), or one of ``words``.

    Args:
        integer: the value must be an integer (a float with an integral value is not: ``epochs=2.0`` is
            refused as ``epochs=2.5`` is, since the option counts something).
        means: what the option is, for the message.
        pair: a (height, width) pair of such values is admitted too (an image filter's size, its stride).
    """

    integer: bool
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    words: tuple[str, ...] = ()
    means: str = ""
    pair: bool = False

    def admits(self, value) -> bool:
        if self.pair and isinstance(value, (tuple, list)) and len(value) == 2:
            return all(self._admits_one(v) for v in value)
        return self._admits_one(value)

    def _admits_one(self, value) -> bool:
        if isinstance(value, str):
            return value in self.words
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return False
        if self.integer and not isinstance(value, numbers.Integral):
            return False
        value = float(value)
        if not math.isfinite(value):
            return False
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def describe(self) -> str:
        """E.g. 'an integer >= 1', 'a number in (0, 1]', "a number > 0 or 'median'"."""
        what = "an integer" if self.integer else "a number"
        if self.low is not None and self.high is not None:
            what += f" in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        elif self.low is not None:
            what += f" {'>' if self.low_open else '>='} {self.low:g}"
        elif self.high is not None:
            what += f" {'<' if self.high_open else '<='} {self.high:g}"
        what += "".join(f" or {word!r}" for word in self.words)
        return what + (" (or a (height, width) pair of them)" if self.pair else "")


def _count(what: str, low: int = 1) -> Constraint:
    return Constraint(True, low=low, means=f"the number of {what}")


def _positive(means: str, **kwargs) -> Constraint:
    return Constraint(False, low=0, low_open=True, means=means, **kwargs)


def _non_negative(means: str) -> Constraint:
    return Constraint(False, low=0, means=means)


CONSTRAINTS: dict[str, Constraint] = {
    # training
    "epochs": _count("passes over the training rows"),
    "max_steps": _count("optimiser steps"),
    "batch_size": _count("rows per minibatch"),
    "lr": _positive("the optimiser's learning rate"),
    "val_fraction": Constraint(False, low=0, high=1, high_open=True,
                               means="the share of rows held out of training (validation, calibration), 0 for none"),
    "patience": _count("validation checks without improvement before training stops"),
    "val_every": _count("epochs between validation checks"),
    "seed": Constraint(True, low=0, means="the seed of every random draw"),
    "chunk_size": _count("rows per chunk of every pass over the data"),
    # sizes of a model
    "n_inducing": _count("inducing points, per sub-GP where a method has several"),
    "n_mean_inducing": _count("points of the decoupled mean basis", low=0),
    "n_extra_inducing": _count("extra inducing points", low=0),
    "n_frequencies": _count("Fourier frequencies per input dimension"),
    "n_basis": _count("basis functions of the network"),
    "width": _count("units per hidden layer"),
    "depth": _count("hidden layers"),
    "n_probes": _count("Hutchinson probe vectors"),
    "n_eigen": _count("eigenpairs of the kernel kept (None: the paper's min(1000, 10^floor(log10 n)))"),
    "grid_size": _count("grid points per input dimension (the GP-GRIEF paper uses 10)", low=2),
    "n_ways": _count("ways of the harmonic decomposition"),
    "period": _count("rotations of the longitude group"),
    "step": Constraint(True, low=1, means="the pixels of one roll of the image group"),
    "filter_size": Constraint(True, low=1, pair=True, means="the pixels of a convolutional patch along each side"),
    "stride": Constraint(True, low=1, pair=True, means="the pixels between neighbouring convolutional patches"),
    "n_layers": _count("layers of a deep convolutional GP"),
    "hidden_inducing": _count("inducing patches of each hidden layer, per sub-GP"),
    "train_samples": _count("draws of a deep GP's hidden layers per row in each training step"),
    "predict_samples": _count("draws of a deep GP's hidden layers the predictive averages over"),
    "predict_seed": Constraint(True, low=0, means="the key of a deep GP's prediction draws"),
    "n_classes": _count("classes", low=2),
    "init_exact_points": _count("rows of the exact GP that starts GP-GRIEF's hyperparameters (0: none)", low=0),
    "init_iterations": _count("L-BFGS iterations of GP-GRIEF's exact-GP initialisation"),
    "n_iterations": _count("MCMC iterations of each chain"),
    "burn_in": _count("MCMC iterations discarded", low=0),
    "thin": Constraint(True, low=1, means="the MCMC iterations per kept sample"),
    "n_chains": _count("MCMC chains"),
    "n_leapfrog": _count("HMC's mean leapfrog steps per iteration"),
    "evidence_rows": _count("rows whose exact evidence trains the exact GP's hyperparameters (None: all)", low=2),
    "max_cg_iterations": _count("conjugate-gradient iterations of one solve"),
    "preconditioner_rank": _count("columns of the pivoted-Cholesky preconditioner (0: none)", low=0),
    "variance_rank": _count("Lanczos steps of the exact GP's variance cache (None: CG variances)"),
    "cg_tolerance": Constraint(False, low=0, high=1, low_open=True,
                               means="the relative residual at which conjugate gradients stop"),
    # hyperparameters and numerical settings
    "lengthscale": _positive("the kernel's initial lengthscale", words=("median",)),
    "outputscale": _positive("the kernel's initial signal variance"),
    "noise": _positive("the initial noise variance of standardised y"),
    "noise_floor": _non_negative("the lower bound of a learned noise variance"),
    "jitter": _non_negative("the diagonal added to an inducing covariance"),
    "hidden_q_scale": _positive("the initial scale of a deep GP's hidden-layer output covariance factor"),
    "weight_decay": _non_negative("the network's L2 weight decay"),
    "natgrad_step": Constraint(False, low=0, high=1, low_open=True, means="the natural-gradient step size"),
    "step_size": _positive("the MCMC proposal's step size"),
    "weight_prior_variance": _positive("the variance of the log-normal prior of GP-GRIEF-I's weights"),
    "noise_prior_variance": _positive("the variance of the log-normal prior of GP-GRIEF-I's noise"),
    "margin": _positive("the margin of the Fourier features' box around the data, in units of each column's range"),
}


def check_options(options: dict) -> None:
    """Raise ValueError for the first option in ``options`` whose value breaks its entry of :data:`CONSTRAINTS`
    (options without an entry, and None, pass)."""
    for name, value in options.items():
        rule = CONSTRAINTS.get(name)
        if rule is None or value is None or rule.admits(value):
            continue
        raise ValueError(f"{name} ({rule.means}) must be {rule.describe()}, got {value!r}.")


def check_renamed(method: str, renamed: dict[str, str], names) -> None:
    """Raise ValueError for the first of ``names`` that ``renamed`` (a model class's ``renamed_options``: old name
    -> new) lists, naming the new option of ``method``."""
    for name in names:
        if name in renamed:
            new = renamed[name]
            raise ValueError(f"option {name!r} of {method} is now {new!r}: pass {new}=...")


def renamed_table(renamed: dict[tuple[str, str], str]) -> str:
    """Renamed options, (method, old name) -> new name, as a markdown table for the docs."""
    rows = [f"| `{method}` | `{old}` | `{new}` |" for (method, old), new in sorted(renamed.items())]
    return "\n".join(["| method | old name | new name |", "|---|---|---|", *rows]) + "\n"


def constraints_table() -> str:
    """:data:`CONSTRAINTS` as a markdown table (option, what it is, the values it takes), for the docs."""
    rows = [f"| `{name}` | {rule.means} | {rule.describe()} |" for name, rule in sorted(CONSTRAINTS.items())]
    return "\n".join(["| option | what it is | values |", "|---|---|---|", *rows]) + "\n"

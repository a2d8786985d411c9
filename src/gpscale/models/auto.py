"""``method="auto"``: the rule by which the estimators pick a method for the data and the machine.

The rule necessarily names methods, so it lives with them; its thresholds and budgets are
:mod:`gpscale.defaults`' (``AUTO_*``, ``CHOLESKY_MEMORY_FRACTION``), and the step cap of a chosen method is its
class's :meth:`~gpscale.models.base.GPModel.default_max_steps`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .. import defaults
from ..memory import gib
from .base import get_model_class

__all__ = ["Choice", "choose_method"]


@dataclass(frozen=True)
class Choice:
    """What ``method="auto"`` chose, and why (one sentence, for ``summary()``); ``max_steps`` is the cap it gives
    the chosen method's training when the caller does not (None: the method's own cap)."""

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
      1,000; :meth:`SGPR.default_max_steps <gpscale.models.linear.SGPR.default_max_steps>`): a fixed budget of
      work, so that a default fit ends in minutes whatever n;
    - beyond: ``svgp``, minibatch Adam, whose steps cost the same whatever n.
    """
    if task == "classification":
        return Choice("svgp", "classification needs a non-Gaussian likelihood, which the variational svgp takes")
    if task != "regression":
        raise ValueError(f"task must be 'regression' or 'classification', got {task!r}.")
    factor_bytes, factor_flops = 8.0 * n * n, n**3 / 3
    if n <= defaults.AUTO_EXACT_MAX_N:
        return Choice("exact", f"n = {n:,} <= {defaults.AUTO_EXACT_MAX_N:,}: the exact GP's Cholesky factor of every "
                               f"row is small ({_gb(factor_bytes)})")
    if (factor_bytes <= defaults.CHOLESKY_MEMORY_FRACTION * memory_bytes
            and factor_flops <= defaults.AUTO_EXACT_MAX_FLOPS):
        return Choice("exact", f"n = {n:,}: the exact GP's Cholesky factor of every row takes {_gb(factor_bytes)} "
                               f"and {_engineering(factor_flops)} operations, which the {device_type} affords "
                               f"({_gb(memory_bytes)} free)")
    entries = defaults.AUTO_ITERATIVE_PRODUCTS * float(n) ** 2
    if entries <= defaults.AUTO_ITERATIVE_MAX_ENTRIES.get(device_type, 0.0):
        return Choice("exact", f"n = {n:,}: the {device_type}'s iterative solver for the exact GP computes "
                               f"{_engineering(entries)} kernel entries, which it affords (the model takes the "
                               f"Cholesky factor if it fits the {_gb(memory_bytes)} free)")
    too_large = (f"the exact GP's factor would take {_gb(factor_bytes)} ({_gb(memory_bytes)} free) and "
                 f"{_engineering(factor_flops)} operations")
    m = min(defaults.AUTO_INDUCING if n_inducing is None else int(n_inducing), n)
    work = n * m * (m + d)
    limit = defaults.AUTO_COLLAPSED_MAX_WORK
    if work <= limit:
        steps = get_model_class("sgpr").default_max_steps(n, d, {"n_inducing": m})
        return Choice("sgpr", f"n = {n:,}, d = {d}: {too_large}; a pass over the data with {m} inducing points "
                              f"costs {_engineering(work)} multiply-adds, at most {_engineering(limit)}, so the "
                              f"collapsed bound trains full batch, for at most {steps} L-BFGS steps", steps)
    return Choice("svgp", f"n = {n:,}, d = {d}: {too_large}, and a full-batch pass would cost {_engineering(work)} "
                          f"multiply-adds, more than {_engineering(limit)}, so minibatch svgp trains instead")


def _gb(n_bytes: float) -> str:
    return "unlimited" if math.isinf(n_bytes) else gib(n_bytes)


def _engineering(x: float) -> str:
    exponent = int(math.floor(math.log10(x)))
    return f"{x / 10 ** exponent:.1f}e{exponent}"

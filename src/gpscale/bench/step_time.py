"""CPU seconds per training step of one minibatch method, the way :func:`gpscale.train.fit` steps it (a
natural-gradient step where the model takes one, then an Adam step), on random data:

    gpscale step-time odvff --d 17 --option n_frequencies=50 --option n_mean_inducing=300

Process CPU time, not wall-clock time, so that other processes sharing the cores distort it less. For comparing
two versions of a model's step on one machine; the benchmark protocols measure whole trainings.
"""
from __future__ import annotations

import time

import torch

from ..heap import hold_freed_heap
from .floor import random_problem, trainer_step


def step_seconds(method: str, d: int, options: dict, batch_size: int = 400, steps: int = 5, seed: int = 0) -> float:
    """Mean CPU seconds of ``steps`` steps of the trainer's own epoch loop (one process) on batches of
    ``batch_size`` random rows in [-1, 1]^d (float64), after one warm-up step."""
    model, X, y, g = random_problem(method, batch_size * (steps + 1), d, options, torch.float64, seed)
    if model.full_batch:
        raise ValueError(f"{method!r} trains full batch; step-time times minibatch methods (svgp, odvff, ...).")
    step = trainer_step(model, g, lr=0.01)
    with hold_freed_heap():  # as in fit: each step reuses the pages of the step before it
        step(X[:batch_size], y[:batch_size])
        start = time.process_time()
        step(X[batch_size:], y[batch_size:], batch_size)
        return (time.process_time() - start) / steps

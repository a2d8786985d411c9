"""CPU seconds per training step of one minibatch method, the way :func:`gpscale.train.fit` steps it (a
natural-gradient step where the model takes one, then an Adam step), on random data:

    gpscale step-time odvff --d 17 --option n_frequencies=50 --option n_mean_inducing=300

Process CPU time, not wall-clock time, so that other processes sharing the cores distort it less. For comparing
two versions of a model's step on one machine; the benchmark protocols measure whole trainings.
"""
from __future__ import annotations

import time

import torch

from ..distributed import LOCAL
from ..models import get_model_class
from ..train import Shard, _epoch, _Objective


def step_seconds(method: str, d: int, options: dict, batch_size: int = 400, steps: int = 5, seed: int = 0) -> float:
    """Mean CPU seconds of ``steps`` steps of the trainer's own epoch loop (one process) on batches of
    ``batch_size`` random rows in [-1, 1]^d (float64), after one warm-up step."""
    n = batch_size * (steps + 1)
    g = torch.Generator().manual_seed(seed)
    X = 2 * torch.rand(n, d, generator=g, dtype=torch.float64) - 1
    y = torch.sin(3 * X).sum(1) + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    model = get_model_class(method)(d, **options).double()
    if model.full_batch:
        raise ValueError(f"{method!r} trains full batch; step-time times minibatch methods (svgp, odvff, ...).")
    model.init(X, y, seed=seed)
    optimiser = torch.optim.Adam(model.parameter_groups(), lr=0.01)
    objective = _Objective(model)

    def epoch(Xe, ye):
        _epoch(model, objective, Xe, ye, optimiser, g, batch_size, Shard(0, Xe.shape[0], Xe.shape[0]), LOCAL)

    epoch(X[:batch_size], y[:batch_size])
    start = time.process_time()
    epoch(X[batch_size:], y[batch_size:])
    return (time.process_time() - start) / steps

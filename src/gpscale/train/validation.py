"""The validation rows of a fit: held out from the training rows (``val_fraction``), and the NLPD on them that
early stopping and the plateau rule watch."""
from __future__ import annotations

import math

import torch

from ..defaults import HELD_OUT_MAX_ROWS, HELD_OUT_MIN_ROWS
from ..distributed import LOCAL

__all__ = ["held_out_fraction", "rows_trained_on", "validation_split", "fit_posterior_after_held_out",
           "validation_nlpd"]


def held_out_fraction(model_class, options: dict, val_fraction: float | None, epochs: int | None, n: int) -> float:
    """The share of n rows a fit holds out: ``val_fraction`` where given, else the method's default for its
    constructor ``options`` (``model_class.default_val_fraction(options)``) when training to convergence on at most
    :data:`~gpscale.defaults.HELD_OUT_MAX_ROWS` rows of which it holds out at least
    :data:`~gpscale.defaults.HELD_OUT_MIN_ROWS`, else 0."""
    if val_fraction is not None:
        return val_fraction
    default = model_class.default_val_fraction(options)
    held_out = n - rows_trained_on(n, default)
    return default if epochs is None and HELD_OUT_MIN_ROWS <= held_out and n <= HELD_OUT_MAX_ROWS else 0.0


def rows_trained_on(n: int, fraction: float) -> int:
    """The rows of n that a split holding out ``fraction`` trains on."""
    return n - int(round(fraction * n)) if fraction > 0 else n


def validation_split(X, y, fraction, generator, comm=LOCAL):
    """(X_fit, y_fit, X_val, y_val): ``fraction`` of the rows held out, drawn by ``generator`` over the global rows
    (every process's shard, concatenated in rank order), so that the split is the one a single process holding
    every row draws, and the fit on it the same. The rows keep their order."""
    if fraction == 0.0:
        return X, y, None, None
    counts = comm.all_gather(torch.tensor([X.shape[0]], device=X.device)).cpu()
    n, offset = int(counts.sum()), int(counts[:comm.rank].sum())
    n_val = n - rows_trained_on(n, fraction)
    if n_val < 1 or n_val >= n:
        raise ValueError(f"val_fraction={fraction} leaves no validation or no training rows for n={n}.")
    held = torch.zeros(n, dtype=torch.bool)
    held[torch.randperm(n, generator=generator)[:n_val]] = True
    kept = [int((~part).sum()) for part in held.split(counts.tolist())]  # the same on every process
    if min(kept) < 1:  # a process without training rows could not take part in the training's collectives
        raise ValueError(f"val_fraction={fraction} holds out every row of process {kept.index(0)} (rows parted "
                         f"{counts.tolist()} over {comm.world_size} processes): give each process more rows, or "
                         "pass val_fraction=0.")
    held = held[offset:offset + X.shape[0]].to(X.device)
    return X[~held], y[~held], X[held], y[held]


def fit_posterior_after_held_out(model, X, y, split, comm=LOCAL) -> None:
    """Fit ``model``'s posterior on every row of (X, y) after it has taken what it takes from the rows that
    ``split`` = :func:`validation_split`'s (X_fit, y_fit, X_held, y_held) held out, if any: the end of a fit, and a
    refit of its posterior with other posterior options."""
    X_fit, y_fit, X_held, y_held = split
    if X_held is not None:
        model.calibrate_on_held_out(X_fit, y_fit, X_held, y_held, comm)
    model.fit_posterior(X, y, comm)


@torch.no_grad()
def validation_nlpd(model, X, y, X_val, y_val, comm=LOCAL) -> float:
    """The mean validation NLPD over every process's held-out rows (the same number on every rank), the posterior
    fitted on the training rows (X, y) after the model has taken what it takes from the held-out rows
    (:meth:`~gpscale.models.base.GPModel.calibrate_on_held_out`)."""
    model.calibrate_on_held_out(X, y, X_val, y_val, comm)
    model.fit_posterior(X, y, comm)
    means, variances = model.predict_mixture(X_val)  # [S, n]: the density is the mixture's, the mean of S
    S = means.shape[0]
    log_densities = model.likelihood.log_predictive_density(y_val.repeat(S), means.flatten(0, 1),
                                                            variances.flatten(0, 1)).reshape(S, -1)
    log_density = torch.logsumexp(log_densities, 0) - math.log(S)
    total = comm.all_reduce_sum(torch.stack([-log_density.sum(), torch.tensor(float(len(y_val))).to(means)]))
    model.clear_cache()
    return (total[0] / total[1]).item()

"""The validation rows of a fit: held out from the training rows (``val_fraction``), and the NLPD on them that
early stopping and the plateau rule watch."""
from __future__ import annotations

import math

import torch

from ..distributed import LOCAL

__all__ = ["validation_split", "validation_nlpd"]


def validation_split(X, y, fraction, generator, comm=LOCAL):
    """(X_fit, y_fit, X_val, y_val): ``fraction`` of the rows held out, drawn by ``generator``; under data
    parallelism each rank holds out that fraction of its shard, drawn by a generator of its own, so that the
    shared generator stays the same on every rank."""
    if fraction == 0.0:
        return X, y, None, None
    if comm.world_size > 1:
        generator = torch.Generator().manual_seed(int(torch.randint(2**62, (), generator=generator)) + comm.rank)
    n_val = int(round(fraction * X.shape[0]))
    if n_val < 1 or n_val >= X.shape[0]:
        raise ValueError(f"val_fraction={fraction} leaves no validation or no training rows for n={X.shape[0]}.")
    order = torch.randperm(X.shape[0], generator=generator).to(X.device)
    val, fit_ = order[:n_val], order[n_val:]
    return X[fit_], y[fit_], X[val], y[val]


@torch.no_grad()
def validation_nlpd(model, X, y, X_val, y_val, comm=LOCAL) -> float:
    """The mean validation NLPD over every process's held-out rows (the same number on every rank), the posterior
    fitted on the training rows (X, y)."""
    model.fit_posterior(X, y, comm)
    means, variances = model.predict_mixture(X_val)  # [S, n]: the density is the mixture's, the mean of S
    S = means.shape[0]
    log_densities = model.likelihood.log_predictive_density(y_val.repeat(S), means.flatten(0, 1),
                                                            variances.flatten(0, 1)).reshape(S, -1)
    log_density = torch.logsumexp(log_densities, 0) - math.log(S)
    total = comm.all_reduce_sum(torch.stack([-log_density.sum(), torch.tensor(float(len(y_val))).to(means)]))
    model.clear_cache()
    return (total[0] / total[1]).item()

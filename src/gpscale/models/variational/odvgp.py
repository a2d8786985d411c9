"""ODVGP: the orthogonally decoupled variational GP with inducing points in both bases (Salimbeni, Cheng, Boots &
Deisenroth 2018a, "Orthogonally decoupled variational Gaussian processes", NeurIPS): beta = f(Z) [M_b, d] carries
the covariance and part of the mean, gamma [M_g, d] the rest of the mean, on the engine's
:class:`~gpscale.models.variational.decoupled.OrthogonallyDecoupledGP`.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ...defaults import MINIBATCH_TRAINING
from .decoupled import OrthogonallyDecoupledGP
from ..base import BenchSize, register
from ..inducing import InducingPoints, kmeans_centers

__all__ = ["ODVGP"]


@register("odvgp")
class ODVGP(OrthogonallyDecoupledGP):
    """Orthogonally decoupled SVGP with inducing points.

    Args:
        n_inducing: M_b, the inducing points of the covariance basis (default 100, the paper's |beta|).
        n_mean_inducing: M_g, the inducing points of the mean basis (default 300, the paper's |gamma|).
        learn_inducing: optimise Z and gamma.
        **kwargs: ``natural_gradients``, ``natgrad_step``, ``jitter`` and the options of :class:`GPModel`.
    """

    default_training = MINIBATCH_TRAINING
    auto_dtype = "float32"  # faster than float64 at the same accuracy
    sizes_capped_by_rows = ("n_inducing", "n_mean_inducing")
    floor_sizes = {"small": BenchSize(2000, 4, {"kernel": "additive_matern32", "n_inducing": 50,
                                                "n_mean_inducing": 100}, 400),
                   "paper": BenchSize(15641, 17, {"kernel": "additive_matern32", "n_inducing": 100,
                                                  "n_mean_inducing": 300}, 400)}

    def __init__(self, n_features: int, n_inducing: int = 100, n_mean_inducing: int = 300,
                 learn_inducing: bool = True, **kwargs):
        super().__init__(n_features, n_mean_inducing=n_mean_inducing, **kwargs)
        self.n_inducing = int(n_inducing)
        self.features = InducingPoints(self.kernel, self.n_inducing, self.n_features, learn=learn_inducing)
        self.gamma.requires_grad_(learn_inducing)
        self.initialise_q(self.n_inducing)

    def mean_basis_sums(self, a: Tensor) -> tuple[Tensor, Tensor]:
        """As the engine's, in one product: K_beta,gamma = k(Z, gamma), so both are k(t, gamma) a for t in
        [Z; gamma] (one call of the additive kernel's sums over gamma, not two)."""
        def both():
            sums = self.kernel.matvec(torch.cat([self.features.Z, self.gamma]), self.gamma, a)
            return sums[:self.n_inducing], sums[self.n_inducing:]
        return self.step_shared("K_gamma a", None, both)

    def initialise_from_data(self, X: Tensor, y: Tensor, seed: int = 0) -> None:
        with torch.no_grad():
            self.features.Z.copy_(kmeans_centers(X, self.n_inducing, seed))
        self.initialise_mean_basis(X, seed + 1)
        self.initialise_q_at_prior()

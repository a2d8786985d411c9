"""SVGP: stochastic variational GP with inducing points (Hensman, Fusi & Lawrence 2013)."""
from __future__ import annotations

import torch
from torch import Tensor

from ...defaults import TrainingDefaults
from .engine import VariationalGP
from ..base import BenchSize, register
from ..inducing import InducingPoints, kmeans_centers

__all__ = ["SVGP"]


@register("svgp")
class SVGP(VariationalGP):
    """SVGP on minibatches with inducing points.

    Args:
        n_inducing: number of inducing points m (k-means initialised). Default 512: each step costs O(m^3) for
            K_uu's factor, and 512 points converge in a few minutes on a CPU (the papers' baselines use 1024,
            which the benchmark protocols pin).
        learn_inducing: optimise Z.
        whiten: keep q over the whitened v = L^{-1} u (default), whose prior N(0, I) stays put while Z and the
            kernel move, or over u itself (``False``: q(u) = N(m, S) against N(0, Kuu); one latent function). With
            Z learned the unwhitened q trains much more slowly (docs/svgp.md has a measurement).
        **kwargs: ``natural_gradients``, ``natgrad_step``, ``jitter`` and the kernel, likelihood and chunking
            options of :class:`GPModel`.
    """

    # q moves by natural-gradient steps, so Adam moves only the kernel and the inducing inputs, at the full-batch rate
    default_training = TrainingDefaults("adam", lr=0.1, max_steps=5000)
    auto_dtype = "float32"  # faster than float64 at the same accuracy
    floor_sizes = {"small": BenchSize(2000, 8, {"n_inducing": 128}, 256),
                   "paper": BenchSize(13500, 26, {"n_inducing": 1024}, 1024)}

    def __init__(self, n_features: int, n_inducing: int = 512, learn_inducing: bool = True, **kwargs):
        super().__init__(n_features, **kwargs)
        self.n_inducing = int(n_inducing)
        self.features = InducingPoints(self.kernel, self.n_inducing, self.n_features, learn=learn_inducing)
        self.initialise_q(self.n_inducing)

    def initialise_from_data(self, X: Tensor, y: Tensor, seed: int = 0) -> None:
        with torch.no_grad():
            self.features.Z.copy_(kmeans_centers(X, self.n_inducing, seed))
        self.initialise_q_at_prior()

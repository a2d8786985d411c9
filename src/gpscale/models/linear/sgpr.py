"""SGPR: the collapsed variational bound of Titsias (2009) with inducing points, streamed in chunks.

With inducing points Z [m, d], ``Kuu = K(Z, Z) + jitter I = L L^T`` and features ``phi(x) = L^{-1} k_Z(x)``,
the Nyström approximation ``Q = Phi Phi^T`` makes SGPR a Bayesian linear model plus a trace term
(:class:`~gpscale.models.linear.collapsed.CollapsedGP`):

    log p(y) >= log N(y | 0, Q + sigma^2 I) - (tr K_ff - tr Q) / (2 sigma^2).
"""
from __future__ import annotations

import torch
from torch import Tensor

from ... import defaults
from ...defaults import FULL_BATCH_TRAINING
from .collapsed import CollapsedGP
from ..base import BenchSize, option_default, register
from ..inducing import InducingPoints, kmeans_centers

__all__ = ["SGPR"]


@register("sgpr")
class SGPR(CollapsedGP):
    """Sparse GP regression with inducing points Z and the Titsias bound, trained full batch.

    Args:
        n_inducing: number of inducing points m (k-means initialised).
        learn_inducing: optimise Z with the hyperparameters.
        jitter: added to the diagonal of Kuu (absolute, standardised units).
        solver: ``'auto'`` (default), ``'cholesky'`` or ``'qr'``; see
            :class:`~gpscale.models.linear.engine.FeatureSpaceGP`.
        **kwargs: the kernel, likelihood and chunking options of :class:`~gpscale.models.base.GPModel`.
    """

    # L-BFGS on the collapsed bound, its step cap set by a budget of work (default_max_steps)
    default_training = FULL_BATCH_TRAINING
    floor_sizes = {"small": BenchSize(2000, 8, {"n_inducing": 128}),
                   "paper": BenchSize(13500, 26, {"n_inducing": 512})}

    @classmethod
    def default_max_steps(cls, n: int, d: int, options: dict) -> int:
        """The budget of work, :data:`~gpscale.defaults.SGPR_WORK_BUDGET` multiply-adds, in L-BFGS steps, each a pass
        over the data of n m (m + d) multiply-adds with m = min(n_inducing, n): 1.1e12 / (n m (m + d)), at most the
        row's ``max_steps``. Read by ``method="auto"`` and by the estimators when they fit sgpr with no
        ``max_steps``."""
        m = min(int(options.get("n_inducing") or option_default(cls, "n_inducing")), n)
        return max(1, min(cls.training_defaults().max_steps, int(defaults.SGPR_WORK_BUDGET // (n * m * (m + d)))))

    def __init__(self, n_features: int, n_inducing: int = 512, learn_inducing: bool = True,
                 jitter: float = 1e-6, *, solver: str = "auto", **kwargs):
        super().__init__(n_features, **kwargs)
        self.set_engine_options(solver=solver)
        self.n_inducing = int(n_inducing)
        self.jitter = float(jitter)
        self.features = InducingPoints(self.kernel, self.n_inducing, self.n_features, learn=learn_inducing)

    def initialise_from_data(self, X: Tensor, y: Tensor, seed: int = 0) -> None:
        with torch.no_grad():
            self.features.Z.copy_(kmeans_centers(X, self.n_inducing, seed))

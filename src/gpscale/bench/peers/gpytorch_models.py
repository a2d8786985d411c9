"""The GPyTorch models of the peers, as in GPyTorch's own examples: an ExactGP and an ApproximateGP with a zero mean,
and their kernels by name."""
from __future__ import annotations

import gpytorch
from gpytorch.distributions import MultivariateNormal
from gpytorch.kernels import AdditiveKernel, MaternKernel, RBFKernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import ZeroMean
from gpytorch.variational import CholeskyVariationalDistribution, VariationalStrategy
from torch import Tensor


def _rbf_ard(n_features: int) -> ScaleKernel:
    return ScaleKernel(RBFKernel(ard_num_dims=n_features))


PEER_KERNELS = ("rbf", "additive_matern12", "additive_matern32", "additive_matern52")


def peer_kernel(name: str, n_features: int) -> gpytorch.kernels.Kernel:
    """``'rbf'``: a scaled ARD RBF; ``'additive_matern{12,32,52}'``: a sum over input dimensions of scaled 1-D
    Matérns (``active_dims``), gpscale's ``AdditiveMatern``."""
    if name == "rbf":
        return _rbf_ard(n_features)
    nus = {"additive_matern12": 0.5, "additive_matern32": 1.5, "additive_matern52": 2.5}
    if name not in nus:
        raise ValueError(f"Unknown peer kernel {name!r}; choose one of {PEER_KERNELS}.")
    return AdditiveKernel(*[ScaleKernel(MaternKernel(nu=nus[name], active_dims=(d,))) for d in range(n_features)])


class ExactGPModel(gpytorch.models.ExactGP):
    """Zero mean, the given covariance module; training data set later with ``set_train_data``."""

    def __init__(self, covar_module: gpytorch.kernels.Kernel, likelihood: GaussianLikelihood):
        super().__init__(None, None, likelihood)
        self.mean_module = ZeroMean()
        self.covar_module = covar_module

    def forward(self, x: Tensor) -> MultivariateNormal:
        return MultivariateNormal(self.mean_module(x), self.covar_module(x))


class SVGPModel(gpytorch.models.ApproximateGP):
    def __init__(self, inducing_points: Tensor, covar_module: gpytorch.kernels.Kernel,
                 jitter_val: float | None = None):
        q = CholeskyVariationalDistribution(inducing_points.shape[0])
        strategy = VariationalStrategy(self, inducing_points, q, learn_inducing_locations=True,
                                       jitter_val=jitter_val)
        super().__init__(strategy)
        self.mean_module = ZeroMean()
        self.covar_module = covar_module

    def forward(self, x: Tensor) -> MultivariateNormal:
        return MultivariateNormal(self.mean_module(x), self.covar_module(x))

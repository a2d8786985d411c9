"""Separable Matérn kernels: a sum or a product over input dimensions of 1-D Matérns, the kernels whose RKHS
variational Fourier features factorise over dimensions (one feature set per dimension for a sum, tensor-product
features for a product).

    additive:  k(x, x') = sum_d s_d^2 g(|x_d - x'_d| / l_d)      (its own s_d^2 and l_d per dimension)
    product:   k(x, x') = s^2 prod_d g(|x_d - x'_d| / l_d)

with g the 1-D Matérn-nu profile. Neither equals the ARD Matérn of :mod:`.stationary`, which is a function of
the joint distance ``||(x - x') / l||``.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn.functional import softplus

from .stationary import SOFTPLUS_ZERO, Kernel, inverse_softplus

__all__ = ["AdditiveMatern", "ProductMatern", "matern_profile"]


def matern_profile(nu: float, distance: Tensor) -> Tensor:
    """The 1-D Matérn-nu correlation at scaled distances ``|x - x'| / l`` (any shape), ``z = sqrt(2 nu) r``:
    exp(-z), (1 + z) exp(-z), (1 + z + z^2 / 3) exp(-z)."""
    z = math.sqrt(2.0 * nu) * distance
    if nu == 0.5:
        poly = 1.0
    elif nu == 1.5:
        poly = 1.0 + z
    elif nu == 2.5:
        poly = 1.0 + z + z * z / 3.0
    else:
        raise ValueError(f"Matern nu must be 0.5, 1.5 or 2.5, got {nu}.")
    return poly * torch.exp(-z)


class _SeparableMatern(Kernel):
    """Per-dimension lengthscales l [D] and Matérn smoothness nu; the variance(s) are the subclass's."""

    def __init__(self, n_features: int, nu: float = 1.5, lengthscale: float = SOFTPLUS_ZERO):
        super().__init__()
        if nu not in (0.5, 1.5, 2.5):
            raise ValueError(f"Matern nu must be 0.5, 1.5 or 2.5, got {nu}.")
        self.n_features = int(n_features)
        self.nu = float(nu)
        self.raw_lengthscale = nn.Parameter(inverse_softplus(torch.full((self.n_features,), float(lengthscale))))

    @property
    def lengthscale(self) -> Tensor:
        """[D]"""
        return softplus(self.raw_lengthscale)

    def config(self) -> dict:
        return {"n_features": self.n_features, "nu": self.nu}

    def factors(self, X1: Tensor, X2: Tensor) -> Tensor:
        """The 1-D correlations g(|x_d - x'_d| / l_d) [D, n1, n2]."""
        ls = self.lengthscale.to(X1.dtype)
        # the floor keeps the gradient of |.| finite on the diagonal
        distance = ((X1.T.unsqueeze(-1) - X2.T.unsqueeze(-2)).abs() / ls[:, None, None]).clamp_min(1e-30)
        return matern_profile(self.nu, distance)


class AdditiveMatern(_SeparableMatern):
    """``sum_d s_d^2 g_nu(|x_d - x'_d| / l_d)``: D one-dimensional Matérns with their own variances.

    Args:
        n_features: D.
        nu: 0.5, 1.5 or 2.5.
        lengthscale: initial l_d.
        outputscale: initial total variance ``sum_d s_d^2`` (split evenly: s_d^2 = outputscale / D).
    """

    def __init__(self, n_features: int, nu: float = 1.5, lengthscale: float = SOFTPLUS_ZERO,
                 outputscale: float = 1.0):
        super().__init__(n_features, nu, lengthscale)
        self.raw_variance = nn.Parameter(inverse_softplus(torch.full((self.n_features,),
                                                                     float(outputscale) / self.n_features)))

    @property
    def variance(self) -> Tensor:
        """s_d^2 [D]"""
        return softplus(self.raw_variance)

    def forward(self, X1: Tensor, X2: Tensor) -> Tensor:
        return torch.einsum("d,dij->ij", self.variance.to(X1.dtype), self.factors(X1, X2))

    def diag(self, X: Tensor) -> Tensor:
        return self.variance.to(X.dtype).sum().expand(X.shape[0]).clone()


class ProductMatern(_SeparableMatern):
    """``s^2 prod_d g_nu(|x_d - x'_d| / l_d)``.

    Args:
        n_features: D.
        nu: 0.5, 1.5 or 2.5.
        lengthscale: initial l_d.
        outputscale: initial s^2.
    """

    def __init__(self, n_features: int, nu: float = 1.5, lengthscale: float = SOFTPLUS_ZERO,
                 outputscale: float = 1.0):
        super().__init__(n_features, nu, lengthscale)
        self.raw_outputscale = nn.Parameter(inverse_softplus(torch.tensor(float(outputscale))))

    @property
    def outputscale(self) -> Tensor:
        return softplus(self.raw_outputscale)

    def forward(self, X1: Tensor, X2: Tensor) -> Tensor:
        return self.outputscale.to(X1.dtype) * self.factors(X1, X2).prod(0)

    def diag(self, X: Tensor) -> Tensor:
        return self.outputscale.to(X.dtype).expand(X.shape[0]).clone()

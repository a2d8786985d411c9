"""The periodic (exp-sine-squared) kernel."""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn.functional import softplus

from .base import SOFTPLUS_ZERO, Kernel, hyperparameter_repr, inverse_softplus
from .distances import underflow_cutoff


class Periodic(Kernel):
    """The exp-sine-squared kernel ``s^2 exp(-2 sum_d sin^2(pi |x_d - x'_d| / p) / l^2)`` (MacKay 1998), with a
    learned period p, lengthscale l and outputscale s^2 (shared across inputs).

    Args:
        n_features: input dimension d.
        period, lengthscale, outputscale: initial values.
    """

    def __init__(self, n_features: int, period: float = 1.0, lengthscale: float = SOFTPLUS_ZERO,
                 outputscale: float = SOFTPLUS_ZERO):
        super().__init__()
        self.n_features = int(n_features)
        self.raw_period = nn.Parameter(inverse_softplus(torch.tensor(float(period))))
        self.raw_lengthscale = nn.Parameter(inverse_softplus(torch.tensor(float(lengthscale))))
        self.raw_outputscale = nn.Parameter(inverse_softplus(torch.tensor(float(outputscale))))

    @property
    def period(self) -> Tensor:
        return softplus(self.raw_period)

    def config(self) -> dict:
        return {"n_features": self.n_features}

    def extra_repr(self) -> str:
        return (f"period={hyperparameter_repr(self.period)}, lengthscale={hyperparameter_repr(self.lengthscale)}, "
                f"outputscale={hyperparameter_repr(self.outputscale)}")

    @property
    def lengthscale(self) -> Tensor:
        return softplus(self.raw_lengthscale)

    @property
    def outputscale(self) -> Tensor:
        return softplus(self.raw_outputscale)

    def forward(self, X1: Tensor, X2: Tensor) -> Tensor:
        angle = math.pi * (X1.unsqueeze(-2) - X2.unsqueeze(-3)) / self.period.to(X1.dtype)  # [n1, n2, d]
        exponent = -2 * (torch.sin(angle) ** 2).sum(-1) / self.lengthscale.to(X1.dtype) ** 2
        # held as the stationary kernels' (underflow_cutoff): a short lengthscale takes it far below exp's range
        return self.outputscale.to(X1.dtype) * torch.exp(exponent.clamp_min(underflow_cutoff(X1.dtype)))

    def diag(self, X: Tensor) -> Tensor:
        return self.outputscale.to(X.dtype).expand(X.shape[0]).clone()

"""Observation models p(y | f)."""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn.functional import softplus

from .kernels.stationary import SOFTPLUS_ZERO, inverse_softplus

__all__ = ["Gaussian"]

LOG_2PI = math.log(2.0 * math.pi)


class Gaussian(nn.Module):
    """``y = f + eps``, ``eps ~ N(0, sigma^2)``.

    Args:
        noise: initial (or, with ``learn_noise=False``, fixed) noise variance sigma^2.
        learn_noise: train sigma^2 with the other hyperparameters.
        noise_floor: sigma^2 = noise_floor + softplus(raw) stays above this; it keeps every
            ``K + sigma^2 I`` well conditioned. Ignored when the noise is fixed.
    """

    def __init__(self, noise: float = SOFTPLUS_ZERO, learn_noise: bool = True, noise_floor: float = 1e-6):
        super().__init__()
        if noise <= 0:
            raise ValueError(f"noise must be positive, got {noise}.")
        self.learn_noise = bool(learn_noise)
        self.noise_floor = float(noise_floor) if learn_noise else 0.0
        if self.learn_noise and noise <= self.noise_floor:
            raise ValueError(f"noise ({noise}) must be above noise_floor ({noise_floor}).")
        raw = inverse_softplus(torch.tensor(float(noise) - self.noise_floor))
        if self.learn_noise:
            self.raw_noise = nn.Parameter(raw)
        else:
            self.register_buffer("raw_noise", raw)

    @property
    def noise(self) -> Tensor:
        """sigma^2, a scalar tensor."""
        return self.noise_floor + softplus(self.raw_noise)

    def predictive(self, mean: Tensor, var: Tensor) -> tuple[Tensor, Tensor]:
        """Moments of p(y*) = ∫ p(y* | f*) N(f* | mean, var) df*: ``(mean, var + sigma^2)``."""
        return mean, var + self.noise.to(var.dtype)

    def expected_log_prob(self, y: Tensor, mean: Tensor, var: Tensor) -> Tensor:
        """``E_{N(f | mean, var)} log N(y | f, sigma^2)`` per point [n], in closed form:
        ``-1/2 log(2 pi sigma^2) - ((y - mean)^2 + var) / (2 sigma^2)``."""
        s2 = self.noise.to(mean.dtype)
        return -0.5 * (LOG_2PI + torch.log(s2)) - 0.5 * ((y - mean) ** 2 + var) / s2

    def log_predictive_density(self, y: Tensor, mean: Tensor, var: Tensor) -> Tensor:
        """``log N(y | mean, var + sigma^2)`` per point [n]."""
        mean, var = self.predictive(mean, var)
        return -0.5 * (LOG_2PI + torch.log(var) + (y - mean) ** 2 / var)

"""Observation models p(y | f): Gaussian noise for regression, the probit Bernoulli for binary classification."""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.functional import softplus

from .kernels.stationary import SOFTPLUS_ZERO, inverse_softplus

__all__ = ["Gaussian", "Bernoulli", "make_likelihood", "LIKELIHOODS"]

LIKELIHOODS = ("gaussian", "bernoulli")

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


class Bernoulli(nn.Module):
    """Probit classification: labels y in {-1, +1}, ``p(y | f) = Phi(y f)`` with Phi the standard normal CDF
    (the latent-noise model ``y = sign(f + eps)``, eps ~ N(0, 1); spec odvff.md §4.5).

    Args:
        quadrature_points: Gauss-Hermite points for ``E_q log Phi(y f)`` (default 20).
    """

    noise = None  # no observation noise to learn

    def __init__(self, quadrature_points: int = 20):
        super().__init__()
        nodes, weights = np.polynomial.hermite.hermgauss(int(quadrature_points))
        # E_{N(f | m, v)} g(f) = sum_i w_i / sqrt(pi) g(m + sqrt(2 v) t_i)
        self.register_buffer("nodes", torch.tensor(nodes, dtype=torch.float64))
        self.register_buffer("weights", torch.tensor(weights / math.sqrt(math.pi), dtype=torch.float64))

    def expected_log_prob(self, y: Tensor, mean: Tensor, var: Tensor) -> Tensor:
        """``E_{N(f | mean, var)} log Phi(y f)`` per point [n], by Gauss-Hermite quadrature."""
        f = mean.unsqueeze(-1) + torch.sqrt(2 * var.clamp_min(0)).unsqueeze(-1) * self.nodes.to(mean)  # [n, q]
        return (log_normal_cdf(y.unsqueeze(-1) * f) * self.weights.to(mean)).sum(-1)

    def probability(self, mean: Tensor, var: Tensor) -> Tensor:
        """``p(y* = +1) = Phi(mean / sqrt(1 + var))`` [n], exactly (the probit integral)."""
        return torch.special.ndtr(mean / torch.sqrt(1 + var))

    def predictive(self, mean: Tensor, var: Tensor) -> tuple[Tensor, Tensor]:
        """Moments of y* in {-1, +1}: ``(2p - 1, 4 p (1 - p))``."""
        p = self.probability(mean, var)
        return 2 * p - 1, 4 * p * (1 - p)

    def log_predictive_density(self, y: Tensor, mean: Tensor, var: Tensor) -> Tensor:
        """``log p(y*) = log Phi(y* mean / sqrt(1 + var))`` per point [n]."""
        return log_normal_cdf(y * mean / torch.sqrt(1 + var))


def log_normal_cdf(z: Tensor) -> Tensor:
    """``log Phi(z)``, accurate far in the lower tail (where Phi underflows)."""
    return torch.special.log_ndtr(z)


def make_likelihood(name: str, *, noise: float = SOFTPLUS_ZERO, learn_noise: bool = True,
                    noise_floor: float = 1e-6) -> nn.Module:
    """``'gaussian'`` (with the noise options) or ``'bernoulli'`` (probit)."""
    if name == "gaussian":
        return Gaussian(noise=noise, learn_noise=learn_noise, noise_floor=noise_floor)
    if name == "bernoulli":
        return Bernoulli()
    raise ValueError(f"Unknown likelihood {name!r}; use one of {LIKELIHOODS}.")


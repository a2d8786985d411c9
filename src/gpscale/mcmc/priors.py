"""The log-normal prior of GP-GRIEF-I's positive parameters, given (as the paper states it) by its mode and
variance."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import brentq
from torch import Tensor

__all__ = ["LogNormal"]


@dataclass(frozen=True)
class LogNormal:
    """Log-normal distribution: ``log x ~ N(mu, s^2)``.

    The paper states its priors by (mode, variance); :meth:`from_mode_variance` converts them.
    """

    mu: float
    s: float

    def __post_init__(self):
        if not (math.isfinite(self.mu) and math.isfinite(self.s) and self.s > 0):
            raise ValueError(f"Expected a finite mu and s > 0. Got mu={self.mu}, s={self.s}.")

    @classmethod
    def from_mode_variance(cls, mode: float, variance: float) -> LogNormal:
        """The log-normal with the given mode ``M`` and variance ``V`` (both > 0).

        With ``E = exp(s^2)``: mode ``= exp(mu - s^2)`` and variance ``= (E - 1) E exp(2 mu)``, so ``mu = log(M E)``
        and ``M^2 E^4 - M^2 E^3 - V = 0``. We solve for ``u = E - 1 = expm1(s^2)``, i.e. ``u (1 + u)^3 = V / M^2``:
        the left side increases from 0 on u > 0, so the positive root is unique, and solving for u rather than E
        keeps full relative precision when V / M^2 is tiny (E would round to 1).
        Example: the paper's prior on the kernel weights, mode 1 and variance 100, gives s = 1.1122, mu = 1.2370.
        """
        mode, variance = float(mode), float(variance)
        if not (math.isfinite(mode) and mode > 0 and math.isfinite(variance) and variance > 0):
            raise ValueError(f"Expected a finite mode > 0 and variance > 0. Got mode={mode}, variance={variance}.")
        r = variance / mode**2
        # u (1+u)^3 >= max(u, u^4), so the root lies in (0, min(r, r^(1/4))]
        hi = min(r, r**0.25)
        u = brentq(lambda u: u * (1 + u) ** 3 - r, 0.0, hi, xtol=1e-300, rtol=4 * np.finfo(float).eps, maxiter=500)
        s2 = math.log1p(u)
        return cls(mu=math.log(mode) + s2, s=math.sqrt(s2))

    @property
    def mode(self) -> float:
        return math.exp(self.mu - self.s**2)

    @property
    def mean(self) -> float:
        return math.exp(self.mu + self.s**2 / 2)

    @property
    def variance(self) -> float:
        return math.expm1(self.s**2) * math.exp(2 * self.mu + self.s**2)

    def log_prob(self, x: Tensor) -> Tensor:
        """Elementwise log density, differentiable; ``-inf`` (with a zero gradient) where ``x <= 0``. [...] -> [...]"""
        x = torch.as_tensor(x)
        positive = x > 0
        # evaluate the formula at a harmless point outside the support so that no NaN reaches the backward pass
        log_x = torch.log(torch.where(positive, x, torch.ones_like(x)))
        z = (log_x - self.mu) / self.s
        lp = -log_x - math.log(self.s) - 0.5 * math.log(2 * math.pi) - 0.5 * z**2
        return torch.where(positive, lp, torch.full_like(lp, -math.inf))

    def grad_log_prob(self, x: Tensor) -> Tensor:
        """Analytic ``d/dx log p(x) = -(s^2 + log x - mu) / (x s^2)``, for ``x > 0``. [...] -> [...]"""
        x = torch.as_tensor(x)
        return -(self.s**2 + torch.log(x) - self.mu) / (x * self.s**2)

    def sample(self, shape: tuple[int, ...], generator: torch.Generator | None = None,
               dtype: torch.dtype = torch.float64) -> Tensor:
        """Draws ``exp(mu + s z)``, ``z ~ N(0, 1)``. -> [*shape]"""
        return torch.exp(self.mu + self.s * torch.randn(shape, generator=generator, dtype=dtype))

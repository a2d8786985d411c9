"""Positive-parameter transforms, with the log-Jacobian that makes a chain run in the unconstrained space sample
the stated posterior of the positive parameters.

Shapes: ``D`` parameters.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["LogTarget", "ExpTransform", "SoftplusTransform", "transformed_log_target"]

LogTarget = Callable[[Tensor], Tensor]


class ExpTransform:
    """``f = exp(x)``: maps an unconstrained x to a positive f; ``log |df/dx| = x``."""

    @staticmethod
    def forward(x: Tensor) -> Tensor:
        return torch.exp(x)

    @staticmethod
    def inverse(f: Tensor) -> Tensor:
        return torch.log(f)

    @staticmethod
    def log_abs_det_jacobian(x: Tensor) -> Tensor:
        """Summed over the last dimension. [..., D] -> [...]"""
        return x.sum(-1)


class SoftplusTransform:
    """``f = softplus(x) = log(1 + e^x)``, the official code's map; ``df/dx = sigmoid(x) = 1 - exp(-f)``."""

    @staticmethod
    def forward(x: Tensor) -> Tensor:
        return F.softplus(x)

    @staticmethod
    def inverse(f: Tensor) -> Tensor:
        # x = log(e^f - 1) = f + log(1 - e^-f), written with expm1 so that small f keeps its precision
        return f + torch.log(-torch.expm1(-f))

    @staticmethod
    def log_abs_det_jacobian(x: Tensor) -> Tensor:
        """``sum log sigmoid(x)`` over the last dimension (logsigmoid is stable for large |x|). [..., D] -> [...]"""
        return F.logsigmoid(x).sum(-1)


def transformed_log_target(
    log_posterior: LogTarget, transform=ExpTransform, *, jacobian: bool = True
) -> LogTarget:
    """The log target in the unconstrained space: ``x -> log_posterior(f(x)) + log |df/dx|``.

    ``log_posterior`` takes the positive parameters ``f`` ([..., D]) and returns the unnormalised log posterior
    ([...]). With the exp transform the Jacobian term is ``sum(x)``.

    The official GP-GRIEF code omits the Jacobian (``jacobian=False``), so its chain samples the density
    ``p(f(x))`` in x, which is not the stated posterior of f: for a log-normal it moves the centre of log f from
    ``mu`` to ``mu - s^2``, i.e. to the log of the *mode*. We include it by default; ``jacobian=False`` is there
    only to imitate the official runs.
    """

    def log_target(x: Tensor) -> Tensor:
        lp = log_posterior(transform.forward(x))
        return lp + transform.log_abs_det_jacobian(x) if jacobian else lp

    return log_target

"""What every sampler here shares: the result type, the rule of the iterations kept, the checks of the common
arguments, the seeded random stream and the evaluation of the log target and its autograd gradient for all chains.

Shapes: ``D`` parameters, ``C`` chains, ``S`` kept samples per chain.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .transforms import LogTarget

__all__ = ["MCMCResult", "kept_iterations", "value_and_grad", "check_positive_int", "check_step_size",
           "make_generator", "prepare_start", "check_finite_start"]


@dataclass(frozen=True)
class MCMCResult:
    """What a sampler (:func:`~gpscale.mcmc.mala`, :func:`~gpscale.mcmc.hmc`) returns.

    Attributes:
        samples: [C, S, D] kept states, in the unconstrained space the sampler ran in.
        log_target: [C, S] the log target at those states.
        iterations: [S] the (zero-based) iteration index of each kept sample.
        acceptance_rate: [C] fraction of proposals accepted after burn-in (the sampling phase).
        burn_in_acceptance_rate: [C] the same during burn-in.
        step_size: [C] the step size at the end of the run.
    """

    samples: Tensor
    log_target: Tensor
    iterations: Tensor
    acceptance_rate: Tensor
    burn_in_acceptance_rate: Tensor
    step_size: Tensor

    @property
    def flat_samples(self) -> Tensor:
        """All chains stacked. [C * S, D]"""
        return self.samples.reshape(-1, self.samples.shape[-1])


def kept_iterations(n_iterations: int, burn_in: int, thin: int) -> Tensor:
    """Zero-based iterations whose state is kept: ``i > burn_in and i % thin == 0`` (the official code's rule;
    179 samples for 10,000 / 1,000 / 50). [S]"""
    i = torch.arange(burn_in + 1, n_iterations)
    return i[i % thin == 0]


def check_positive_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"Expected {name} to be an integer >= {minimum}. Got {value!r}.")
    return int(value)


def check_step_size(step_size) -> float:
    if isinstance(step_size, bool) or not isinstance(step_size, (int, float, np.floating, np.integer)) or not (
            math.isfinite(step_size) and step_size > 0):
        raise ValueError(f"Expected step_size to be a finite number > 0. Got {step_size!r}.")
    return float(step_size)


def make_generator(seed: int | torch.Generator | None) -> torch.Generator:
    """The sampler's random stream: ``seed`` itself if a generator; None draws the seed from torch's global RNG, so
    that ``torch.manual_seed`` makes an unseeded run reproducible too."""
    if isinstance(seed, torch.Generator):
        return seed
    if seed is None:
        seed = int(torch.randint(0, 2**62, ()).item())
    return torch.Generator().manual_seed(int(seed))


def prepare_start(x0, n_iterations: int, burn_in: int, thin: int) -> tuple[Tensor, Tensor]:
    """Validates the run's length and x0 [D]; returns x0 as a float tensor and the kept iterations [S]."""
    if burn_in >= n_iterations - 1:
        raise ValueError(f"Expected burn_in < n_iterations - 1 so that some iterations are sampled. "
                         f"Got burn_in={burn_in}, n_iterations={n_iterations}.")
    x0 = torch.as_tensor(x0).detach()
    if not x0.is_floating_point():
        x0 = x0.to(torch.get_default_dtype())
    if x0.ndim != 1 or x0.numel() == 0:
        raise ValueError(f"Expected x0 to be a non-empty 1-D tensor [D]. Got shape {tuple(x0.shape)}.")
    keep = kept_iterations(n_iterations, burn_in, thin)
    if len(keep) == 0:
        raise ValueError(f"No iteration i with burn_in < i < n_iterations is a multiple of thin={thin}: "
                         f"nothing would be kept. Lower thin or raise n_iterations.")
    return x0, keep


def check_finite_start(lp: Tensor, grad: Tensor) -> None:
    """Refuses a start outside the support, naming the chains."""
    bad = ~(torch.isfinite(lp) & torch.isfinite(grad).all(-1))
    if bad.any():
        raise ValueError(f"The log target or its gradient is not finite at the starting point of chain(s) "
                         f"{bad.nonzero().flatten().tolist()} (log target {lp[bad].tolist()}). Start inside the "
                         f"support, e.g. at the prior mode.")


def value_and_grad(log_target: LogTarget, x: Tensor, vectorized: bool) -> tuple[Tensor, Tensor]:
    """The log target and its autograd gradient at every chain's state. [C, D] -> ([C], [C, D])

    Chains are independent, so in the vectorised case the gradient of the *sum* of the C values has the gradient
    of chain c's value in row c.
    """
    with torch.enable_grad():
        if vectorized:
            xr = x.detach().requires_grad_(True)
            lp = log_target(xr)
            if not isinstance(lp, Tensor) or lp.shape != (x.shape[0],):
                raise ValueError(f"With vectorized=True, log_target must map [C, D] to [C]. Got "
                                 f"{getattr(lp, 'shape', type(lp))} for C = {x.shape[0]}.")
            grad = _grad(lp.sum(), xr)
            return lp.detach().to(x.dtype), grad
        values, grads = [], []
        for xc in x:
            xr = xc.detach().requires_grad_(True)
            lp = log_target(xr)
            if not isinstance(lp, Tensor) or lp.numel() != 1:
                raise ValueError(f"log_target must return a scalar tensor. Got {getattr(lp, 'shape', type(lp))}.")
            grads.append(_grad(lp.reshape(()), xr))
            values.append(lp.detach().reshape(()).to(x.dtype))
        return torch.stack(values), torch.stack(grads)


def _grad(value: Tensor, x: Tensor) -> Tensor:
    # A value without a graph (e.g. a constant -inf returned outside the support) has no gradient; treat it as zero
    # and let the accept/reject step deal with the value.
    if not value.requires_grad:
        return torch.zeros_like(x)
    (g,) = torch.autograd.grad(value, x, allow_unused=True)
    return torch.zeros_like(x) if g is None else g.detach()

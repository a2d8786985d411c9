"""What every sampler here shares: the result type, the rule of the iterations kept, the checks of the common
arguments, the seeded random stream and the evaluation of the log target and its autograd gradient for all chains.

Shapes: ``D`` parameters, ``C`` chains, ``S`` kept samples per chain.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from .transforms import LogTarget

__all__ = ["MCMCResult", "ChainRecord", "kept_iterations", "value_and_grad", "check_positive_int", "check_step_size",
           "make_generator", "prepare_start", "start_chains", "check_finite_start"]


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


def start_chains(log_target: LogTarget, x0: Tensor, n_chains: int, init_jitter: float,
                 normal: Callable[..., Tensor], vectorized: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Every chain's start, x0 [D] plus ``init_jitter`` times ``normal(C, D)`` (the sampler's seeded draws), with
    its log target and gradient; a start outside the support is refused. -> (x [C, D], lp [C], grad [C, D])"""
    if not (math.isfinite(init_jitter) and init_jitter >= 0):
        raise ValueError(f"Expected init_jitter to be a finite number >= 0. Got {init_jitter!r}.")
    x = x0.expand(n_chains, x0.numel()).clone()
    if init_jitter > 0:
        x = x + init_jitter * normal(n_chains, x0.numel())
    lp, grad = value_and_grad(log_target, x, vectorized)
    check_finite_start(lp, grad)
    return x, lp, grad


class ChainRecord:
    """What a sampler keeps of a run of C chains over D parameters: the states and log targets of the kept
    iterations ``keep`` [S], and the acceptances counted from iteration 0 (``accepted`` [C]) and through
    iteration ``burn_in``; :meth:`result` makes the :class:`MCMCResult`."""

    def __init__(self, keep: Tensor, n_iterations: int, burn_in: int, x: Tensor):
        C, D = x.shape
        self.keep, self.n_iterations, self.burn_in = keep, n_iterations, burn_in
        self.samples = torch.empty(C, len(keep), D, dtype=x.dtype, device=x.device)
        self.log_target = torch.empty(C, len(keep), dtype=x.dtype, device=x.device)
        self.accepted = torch.zeros(C, dtype=torch.long, device=x.device)
        self.accepted_burn_in = torch.zeros(C, dtype=torch.long, device=x.device)
        self._kept, self._slot = keep.tolist(), 0

    def record(self, i: int, x: Tensor, lp: Tensor, accept: Tensor) -> None:
        """Iteration i ended at states x [C, D] with log targets lp [C], having accepted ``accept`` [C] (bool)."""
        self.accepted += accept
        if i == self.burn_in:
            self.accepted_burn_in = self.accepted.clone()
        if self._slot < len(self._kept) and i == self._kept[self._slot]:
            self.samples[:, self._slot], self.log_target[:, self._slot] = x, lp
            self._slot += 1

    def result(self, step_size: Tensor) -> MCMCResult:
        """The run's result, with each chain's final step size [C]."""
        n_burn, dtype = self.burn_in + 1, self.samples.dtype  # burn-in: iterations 0 .. burn_in
        return MCMCResult(samples=self.samples, log_target=self.log_target, iterations=self.keep,
                          acceptance_rate=(self.accepted - self.accepted_burn_in).to(dtype)
                          / (self.n_iterations - n_burn),
                          burn_in_acceptance_rate=self.accepted_burn_in.to(dtype) / n_burn, step_size=step_size)


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

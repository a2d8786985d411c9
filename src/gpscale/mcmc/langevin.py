"""The Metropolis-adjusted Langevin (MALA) sampler, driven by autograd, with its step size adapted during burn-in.

Shapes: ``D`` parameters, ``C`` chains, ``S`` kept samples per chain.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from .sampling import (ChainRecord, MCMCResult, check_positive_int, check_step_size, make_generator, prepare_start,
                       start_chains, value_and_grad)
from .transforms import LogTarget

__all__ = ["TUNE_MODES", "TARGET_ACCEPTANCE", "ADAPTATION_DECAY", "mala"]

TUNE_MODES = ("burn_in", "always", "never")
# The default tuning (tune="burn_in") drives MALA's acceptance rate toward 0.574, optimal for MALA in high
# dimension (Roberts & Rosenthal 1998), by a Robbins-Monro step on log h after every burn-in iteration with gain
# (i + 1)^-0.6: the gains sum to infinity (h can travel any distance) while their squares do not (it settles),
# the usual diminishing-adaptation schedule (Andrieu & Thoms 2008).
TARGET_ACCEPTANCE = 0.574
ADAPTATION_DECAY = 0.6


def _log_proposal_density(to: Tensor, frm: Tensor, grad_frm: Tensor, h: Tensor) -> Tensor:
    """``log q(to | frm)`` up to a constant shared by both directions, where
    ``q(a|b) = N(a; b + (h^2/2) grad log pi(b), h^2 I)``. ([C, D], [C, D], [C, D], [C]) -> [C]"""
    mean = frm + (h**2 / 2)[:, None] * grad_frm
    return -((to - mean) ** 2).sum(-1) / (2 * h**2)


def mala(
    log_target: LogTarget,
    x0: Tensor,
    *,
    n_iterations: int = 10_000,
    burn_in: int = 1_000,
    thin: int = 50,
    step_size: float = 0.4,
    tune_every: int = 1_000,
    tune: str = "burn_in",
    n_chains: int = 1,
    init_jitter: float = 0.0,
    seed: int | torch.Generator | None = None,
    vectorized: bool = False,
    _hastings_correction: bool = True,
) -> MCMCResult:
    """Metropolis-adjusted Langevin sampling of ``pi(x) ∝ exp(log_target(x))`` on an unconstrained x in R^D.

    Each iteration proposes ``x' = x + (h^2/2) grad log pi(x) + h xi``, ``xi ~ N(0, I)``, and accepts it with
    probability ``min(1, pi(x') q(x|x') / (pi(x) q(x'|x)))``. A proposal whose log target or gradient is not
    finite is rejected. The gradient comes from torch autograd.

    Args:
        log_target: x [D] -> scalar tensor (or, with ``vectorized=True``, x [C, D] -> [C], one value per chain).
            For positive parameters build it with :func:`transformed_log_target`, which keeps the Jacobian.
        x0: [D] starting point, shared by all chains (the paper starts at the prior mode). The chains run on its
            device, with random numbers drawn on the host, so that they draw alike on any device.
        n_iterations: total iterations, burn-in included.
        burn_in, thin: the state after iteration i (zero-based) is kept when ``i > burn_in and i % thin == 0``.
        step_size: initial h (the official tutorial's 0.4).
        tune: ``"burn_in"`` (default): after each iteration ``i < burn_in``, every chain's
            ``log h += (i + 1)^-0.6 (alpha_i - 0.574)``, with alpha_i that iteration's acceptance probability
            (Robbins-Monro toward MALA's optimal acceptance rate); h is then fixed, so every kept sample comes from
            one pi-invariant kernel. ``"always"``: the official code's rule for the whole run (see
            ``tune_every``), an adaptive chain whose kernel depends on its whole past, which can break convergence
            to pi. ``"never"``: h stays ``step_size``.
        tune_every: for ``tune="always"`` only: before iteration i, when i is a positive multiple of ``tune_every``,
            h is multiplied by 0.7 if the chain's cumulative acceptance rate is below 0.2 and by 1.2 if above 0.6
            (the official rule; from h = 0.4 with the official 1000 it first acts at iteration 1000, too late for
            a chain over hundreds of parameters to have moved during burn-in).
        n_chains: independent chains, each with its own h and random stream.
        init_jitter: each chain starts at ``x0 + init_jitter * N(0, I)`` (0: all at x0).
        seed: int or ``torch.Generator`` for reproducible runs; None draws a seed from torch's global RNG.
        vectorized: whether ``log_target`` evaluates all chains at once (faster for cheap targets).
        _hastings_correction: for tests only. False drops ``q(x|x')/q(x'|x)`` from the acceptance ratio, which
            samples the wrong distribution.

    Returns:
        :class:`MCMCResult` with samples [C, S, D].
    """
    n_iterations = check_positive_int("n_iterations", n_iterations)
    burn_in = check_positive_int("burn_in", burn_in, minimum=0)
    thin = check_positive_int("thin", thin)
    tune_every = check_positive_int("tune_every", tune_every)
    n_chains = check_positive_int("n_chains", n_chains)
    step_size = check_step_size(step_size)
    if tune not in TUNE_MODES:
        raise ValueError(f"Expected tune to be 'burn_in', 'always' or 'never'. Got {tune!r}.")
    x0, keep = prepare_start(x0, n_iterations, burn_in, thin)

    gen = make_generator(seed)
    dtype, device, (C, D) = x0.dtype, x0.device, (n_chains, x0.numel())

    def normal(*shape: int) -> Tensor:
        # drawn on the host by the seeded generator, then moved: a chain on a GPU draws what it draws on the CPU
        return torch.randn(*shape, generator=gen, dtype=dtype).to(device)

    x, lp, grad = start_chains(log_target, x0, C, init_jitter, normal, vectorized)  # [C, D], [C], [C, D]
    record = ChainRecord(keep, n_iterations, burn_in, x)
    h = torch.full((C,), float(step_size), dtype=dtype, device=device)  # [C]
    for i in range(n_iterations):
        if tune == "always" and i > 0 and i % tune_every == 0:
            rate = record.accepted.to(dtype) / i  # the cumulative rate, the official rule's
            h = torch.where(rate < 0.2, h * 0.7, torch.where(rate > 0.6, h * 1.2, h))

        xi = normal(C, D)
        x_new = x + (h**2 / 2)[:, None] * grad + h[:, None] * xi  # [C, D]
        lp_new, grad_new = value_and_grad(log_target, x_new, vectorized)
        log_alpha = lp_new - lp  # [C]
        if _hastings_correction:
            log_alpha = log_alpha + _log_proposal_density(x, x_new, grad_new, h) - _log_proposal_density(
                x_new, x, grad, h)
        # NaN compares False and +inf/NaN gradients would poison the next proposal: reject all of them
        finite = torch.isfinite(lp_new) & torch.isfinite(grad_new).all(-1)
        log_u = torch.log(torch.rand(C, generator=gen, dtype=dtype).to(device))
        accept = finite & (log_u < log_alpha)  # [C]
        x = torch.where(accept[:, None], x_new, x)
        lp = torch.where(accept, lp_new, lp)
        grad = torch.where(accept[:, None], grad_new, grad)
        record.record(i, x, lp, accept)
        if tune == "burn_in" and i < burn_in:
            h = _adapt_step_size(h, torch.where(finite, log_alpha, -math.inf), i)
    return record.result(h)


def _adapt_step_size(h: Tensor, log_alpha: Tensor, i: int) -> Tensor:
    """One Robbins-Monro step of each chain's log h toward the target acceptance rate (``TARGET_ACCEPTANCE``), from
    the acceptance probabilities ``min(1, exp(log_alpha))`` of iteration i, which vary less than the accept/reject
    outcomes. [C], [C] -> [C]"""
    alpha = log_alpha.clamp(max=0.0).exp()
    return h * torch.exp((i + 1) ** -ADAPTATION_DECAY * (alpha - TARGET_ACCEPTANCE))

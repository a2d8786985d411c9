"""The Metropolis-adjusted Langevin (MALA) sampler, driven by autograd, with its step size adapted during burn-in,
and the rule of the iterations it keeps.

Shapes: ``D`` parameters, ``C`` chains, ``S`` kept samples per chain.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .transforms import LogTarget

__all__ = ["TUNE_MODES", "TARGET_ACCEPTANCE", "ADAPTATION_DECAY", "MCMCResult", "kept_iterations", "mala"]

TUNE_MODES = ("burn_in", "always", "never")
# The default tuning (tune="burn_in") drives MALA's acceptance rate toward 0.574, optimal for MALA in high
# dimension (Roberts & Rosenthal 1998), by a Robbins-Monro step on log h after every burn-in iteration with gain
# (i + 1)^-0.6: the gains sum to infinity (h can travel any distance) while their squares do not (it settles),
# the usual diminishing-adaptation schedule (Andrieu & Thoms 2008).
TARGET_ACCEPTANCE = 0.574
ADAPTATION_DECAY = 0.6


@dataclass(frozen=True)
class MCMCResult:
    """What :func:`mala` returns.

    Attributes:
        samples: [C, S, D] kept states, in the unconstrained space the sampler ran in.
        log_target: [C, S] the log target at those states.
        iterations: [S] the (zero-based) iteration index of each kept sample.
        acceptance_rate: [C] fraction of proposals accepted after burn-in (the sampling phase).
        burn_in_acceptance_rate: [C] the same during burn-in.
        step_size: [C] the step size h at the end of the run.
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


def _value_and_grad(log_target: LogTarget, x: Tensor, vectorized: bool) -> tuple[Tensor, Tensor]:
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


def _log_proposal_density(to: Tensor, frm: Tensor, grad_frm: Tensor, h: Tensor) -> Tensor:
    """``log q(to | frm)`` up to a constant shared by both directions, where
    ``q(a|b) = N(a; b + (h^2/2) grad log pi(b), h^2 I)``. ([C, D], [C, D], [C, D], [C]) -> [C]"""
    mean = frm + (h**2 / 2)[:, None] * grad_frm
    return -((to - mean) ** 2).sum(-1) / (2 * h**2)


def _check_positive_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"Expected {name} to be an integer >= {minimum}. Got {value!r}.")
    return int(value)


def _generator(seed: int | torch.Generator | None) -> torch.Generator:
    if isinstance(seed, torch.Generator):
        return seed
    if seed is None:
        # draw the seed from the global RNG, so that torch.manual_seed makes an unseeded run reproducible too
        seed = int(torch.randint(0, 2**62, ()).item())
    return torch.Generator().manual_seed(int(seed))


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
    n_iterations = _check_positive_int("n_iterations", n_iterations)
    burn_in = _check_positive_int("burn_in", burn_in, minimum=0)
    thin = _check_positive_int("thin", thin)
    tune_every = _check_positive_int("tune_every", tune_every)
    n_chains = _check_positive_int("n_chains", n_chains)
    if burn_in >= n_iterations - 1:
        raise ValueError(f"Expected burn_in < n_iterations - 1 so that some iterations are sampled. "
                         f"Got burn_in={burn_in}, n_iterations={n_iterations}.")
    if isinstance(step_size, bool) or not isinstance(step_size, (int, float, np.floating, np.integer)) or not (
            math.isfinite(step_size) and step_size > 0):
        raise ValueError(f"Expected step_size to be a finite number > 0. Got {step_size!r}.")
    if tune not in TUNE_MODES:
        raise ValueError(f"Expected tune to be 'burn_in', 'always' or 'never'. Got {tune!r}.")
    if not (math.isfinite(init_jitter) and init_jitter >= 0):
        raise ValueError(f"Expected init_jitter to be a finite number >= 0. Got {init_jitter!r}.")
    x0 = torch.as_tensor(x0).detach()
    if not x0.is_floating_point():
        x0 = x0.to(torch.get_default_dtype())
    if x0.ndim != 1 or x0.numel() == 0:
        raise ValueError(f"Expected x0 to be a non-empty 1-D tensor [D]. Got shape {tuple(x0.shape)}.")
    keep = kept_iterations(n_iterations, burn_in, thin)
    if len(keep) == 0:
        raise ValueError(f"No iteration i with burn_in < i < n_iterations is a multiple of thin={thin}: "
                         f"nothing would be kept. Lower thin or raise n_iterations.")

    gen = _generator(seed)
    dtype, device, (C, D) = x0.dtype, x0.device, (n_chains, x0.numel())

    def normal(*shape: int) -> Tensor:
        # drawn on the host by the seeded generator, then moved: a chain on a GPU draws what it draws on the CPU
        return torch.randn(*shape, generator=gen, dtype=dtype).to(device)

    x = x0.expand(C, D).clone()  # [C, D]
    if init_jitter > 0:
        x = x + init_jitter * normal(C, D)
    lp, grad = _value_and_grad(log_target, x, vectorized)  # [C], [C, D]
    bad = ~(torch.isfinite(lp) & torch.isfinite(grad).all(-1))
    if bad.any():
        raise ValueError(f"The log target or its gradient is not finite at the starting point of chain(s) "
                         f"{bad.nonzero().flatten().tolist()} (log target {lp[bad].tolist()}). Start inside the "
                         f"support, e.g. at the prior mode.")

    h = torch.full((C,), float(step_size), dtype=dtype, device=device)  # [C]
    samples = torch.empty(C, len(keep), D, dtype=dtype, device=device)
    kept_lp = torch.empty(C, len(keep), dtype=dtype, device=device)
    accepted_total = torch.zeros(C, dtype=torch.long, device=device)  # since iteration 0, for the tuning rule
    accepted_burn_in = torch.zeros(C, dtype=torch.long, device=device)
    slot = 0
    keep_set = keep.tolist()
    for i in range(n_iterations):
        if tune == "always" and i > 0 and i % tune_every == 0:
            rate = accepted_total.to(dtype) / i
            h = torch.where(rate < 0.2, h * 0.7, torch.where(rate > 0.6, h * 1.2, h))
        if i == burn_in + 1:
            accepted_burn_in = accepted_total.clone()

        xi = normal(C, D)
        x_new = x + (h**2 / 2)[:, None] * grad + h[:, None] * xi  # [C, D]
        lp_new, grad_new = _value_and_grad(log_target, x_new, vectorized)
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
        accepted_total += accept
        if tune == "burn_in" and i < burn_in:
            h = _adapt_step_size(h, torch.where(finite, log_alpha, -math.inf), i)

        if slot < len(keep_set) and i == keep_set[slot]:
            samples[:, slot], kept_lp[:, slot] = x, lp
            slot += 1

    n_burn = burn_in + 1  # iterations 0..burn_in
    return MCMCResult(
        samples=samples,
        log_target=kept_lp,
        iterations=keep,
        acceptance_rate=(accepted_total - accepted_burn_in).to(dtype) / (n_iterations - n_burn),
        burn_in_acceptance_rate=accepted_burn_in.to(dtype) / n_burn,
        step_size=h,
    )


def _adapt_step_size(h: Tensor, log_alpha: Tensor, i: int) -> Tensor:
    """One Robbins-Monro step of each chain's log h toward the target acceptance rate (``TARGET_ACCEPTANCE``), from
    the acceptance probabilities ``min(1, exp(log_alpha))`` of iteration i, which vary less than the accept/reject
    outcomes. [C], [C] -> [C]"""
    alpha = log_alpha.clamp(max=0.0).exp()
    return h * torch.exp((i + 1) ** -ADAPTATION_DECAY * (alpha - TARGET_ACCEPTANCE))

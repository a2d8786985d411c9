"""Hamiltonian Monte Carlo (HMC) driven by autograd, with the step size tuned by dual averaging and a diagonal
mass matrix estimated from the chains during burn-in (as Stan's warm-up), then both fixed.

Shapes: ``D`` parameters, ``C`` chains, ``S`` kept samples per chain.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from .sampling import (ChainRecord, MCMCResult, check_positive_int, check_step_size, make_generator, prepare_start,
                       start_chains, value_and_grad)
from .transforms import LogTarget

__all__ = ["HMC_TUNE_MODES", "HMC_TARGET_ACCEPTANCE", "hmc", "metric_windows"]

HMC_TUNE_MODES = ("burn_in", "never")
# Dual averaging of log(step) toward a mean acceptance probability of 0.8 (Hoffman & Gelman 2014, Stan's
# defaults: gamma 0.05, t0 10, kappa 0.75, shrinkage toward log(10 step)).
HMC_TARGET_ACCEPTANCE = 0.8
_GAMMA, _T0, _KAPPA = 0.05, 10.0, 0.75
# A trajectory whose energy error exceeds this has diverged: it is stopped and rejected (Stan's threshold).
_DIVERGENCE = 1000.0


def metric_windows(burn_in: int) -> list[tuple[int, int]]:
    """The burn-in iterations [start, end) whose states estimate the mass matrix, one estimate per window (Stan's
    schedule): after an initial buffer of 15% of burn-in (at most 75 iterations) in which only the step adapts,
    windows that double in length (the first of ``min(25, slow / 7)`` iterations, the last stretched to the end),
    then a terminal buffer of 10% (at most 50) in which the step adapts to the final metric. None below 20."""
    if burn_in < 20:
        return []
    start, end = min(75, int(0.15 * burn_in)), burn_in - min(50, int(0.1 * burn_in))
    size = max(1, min(25, (end - start) // 7))
    windows = []
    while start < end:
        stop = start + size
        if stop + 2 * size > end:
            stop = end
        windows.append((start, stop))
        start, size = stop, 2 * size
    return windows


class _DualAveraging:
    """Nesterov dual averaging of log(step) for the mean acceptance probability of the chains, restarted at every
    new metric with ``mu = log(10 step)``."""

    def __init__(self, step: float):
        self.restart(step)

    def restart(self, step: float) -> None:
        self.mu, self.log_step = math.log(10 * step), math.log(step)
        self.t, self.h_bar, self.log_step_bar = 0, 0.0, 0.0

    def update(self, acceptance: float) -> float:
        self.t += 1
        eta = 1.0 / (self.t + _T0)
        self.h_bar = (1 - eta) * self.h_bar + eta * (HMC_TARGET_ACCEPTANCE - acceptance)
        self.log_step = self.mu - math.sqrt(self.t) / _GAMMA * self.h_bar
        weight = self.t ** -_KAPPA
        self.log_step_bar = weight * self.log_step + (1 - weight) * self.log_step_bar
        return math.exp(self.log_step)

    @property
    def final(self) -> float:
        return math.exp(self.log_step_bar)


def hmc(
    log_target: LogTarget,
    x0: Tensor,
    *,
    n_iterations: int = 300,
    burn_in: int = 150,
    thin: int = 1,
    n_leapfrog: int = 8,
    step_size: float = 0.1,
    tune: str = "burn_in",
    n_chains: int = 4,
    init_jitter: float = 0.0,
    seed: int | torch.Generator | None = None,
    vectorized: bool = False,
) -> MCMCResult:
    """Hamiltonian Monte Carlo sampling of ``pi(x) ∝ exp(log_target(x))`` on an unconstrained x in R^D.

    Each iteration draws a momentum ``p ~ N(0, M)``, ``M = diag(1 / m)`` (m the inverse metric, an estimate of the
    posterior variances), runs L leapfrog steps of size e on ``H(x, p) = -log pi(x) + p^T M^{-1} p / 2`` and
    accepts the end point with probability ``min(1, exp(H_0 - H_1))``: the leapfrog map is volume-preserving and
    reversible under ``p -> -p``, so the chain leaves pi invariant for any e, L and M drawn independently of the
    state. L is drawn uniformly from ``1 .. 2 n_leapfrog - 1`` at every iteration (shared by the chains): a fixed
    trajectory near half a period of a Gaussian direction would map x to about -x there, leaving |x| (the
    variances, and rank-normalised R-hat's folded draws) nearly unmixed; random lengths average over the phases
    (Neal 2011, sec. 5.4.2.2). A trajectory that reaches a non-finite target or gradient, or an energy error above
    1000, is stopped there and rejected.

    Tuning (``tune="burn_in"``): during burn-in e follows dual averaging toward a mean acceptance probability of
    0.8 (over the chains), and M^{-1} is set at the end of every :func:`metric_windows` window to the variances of
    the window's states pooled over all chains, shrunk toward 1e-3 as Stan's (``v n / (n + 5) + 1e-3 * 5 / (n +
    5)``), after which dual averaging restarts. After burn-in e is the dual average and M is fixed, so every kept
    sample comes from one pi-invariant kernel (which the chains share). ``"never"``: e = ``step_size``, M = I.

    Args:
        log_target: x [D] -> scalar tensor (or, with ``vectorized=True``, x [C, D] -> [C], one value per chain).
        x0: [D] starting point, shared by all chains. Random numbers are drawn on the host, as :func:`mala`'s.
        n_iterations: total iterations, burn-in included (each costs L gradient evaluations, n_leapfrog on average).
        burn_in, thin: the state after iteration i (zero-based) is kept when ``i > burn_in and i % thin == 0``.
        n_leapfrog: the mean number L of leapfrog steps per iteration.
        step_size: the initial (``"burn_in"``) or fixed (``"never"``) step e.
        tune: ``"burn_in"`` or ``"never"``.
        n_chains: chains, each with its own random stream (they share e and M).
        init_jitter: each chain starts at ``x0 + init_jitter * N(0, I)``.
        seed: int or ``torch.Generator``; None draws a seed from torch's global RNG.
        vectorized: whether ``log_target`` evaluates all chains at once.

    Returns:
        :class:`~gpscale.mcmc.MCMCResult` with samples [C, S, D]; ``step_size`` [C] is the final e.
    """
    n_iterations = check_positive_int("n_iterations", n_iterations)
    burn_in = check_positive_int("burn_in", burn_in, minimum=0)
    thin = check_positive_int("thin", thin)
    n_leapfrog = check_positive_int("n_leapfrog", n_leapfrog)
    n_chains = check_positive_int("n_chains", n_chains)
    step = check_step_size(step_size)
    if tune not in HMC_TUNE_MODES:
        raise ValueError(f"Expected tune to be one of {HMC_TUNE_MODES} for HMC. Got {tune!r}.")
    x0, keep = prepare_start(x0, n_iterations, burn_in, thin)

    gen = make_generator(seed)
    dtype, device, (C, D) = x0.dtype, x0.device, (n_chains, x0.numel())

    def draw(sample, *shape: int) -> Tensor:
        return sample(*shape, generator=gen, dtype=dtype).to(device)

    x, lp, grad = start_chains(log_target, x0, C, init_jitter, lambda *shape: draw(torch.randn, *shape), vectorized)
    record = ChainRecord(keep, n_iterations, burn_in, x)
    inverse_metric = torch.ones(D, dtype=dtype, device=device)
    adapt = tune == "burn_in" and burn_in > 0
    averaging = _DualAveraging(step)
    windows = metric_windows(burn_in) if adapt else []
    window_states: list[Tensor] = []
    for i in range(n_iterations):
        if adapt and i == burn_in:
            step = averaging.final  # the kept samples' kernel: e and M fixed from here on
        n_steps = int(torch.randint(1, 2 * n_leapfrog, (), generator=gen))
        momentum = draw(torch.randn, C, D) / inverse_metric.sqrt()
        x_new, lp_new, grad_new, p_new, alive = _leapfrog(log_target, x, lp, grad, momentum, step, n_steps,
                                                          inverse_metric, vectorized)
        start_energy = -lp + 0.5 * (momentum**2 * inverse_metric).sum(-1)
        log_alpha = start_energy - (-lp_new + 0.5 * (p_new**2 * inverse_metric).sum(-1))
        log_alpha = torch.where(alive & torch.isfinite(log_alpha), log_alpha, torch.full_like(log_alpha, -math.inf))
        accept = torch.log(draw(torch.rand, C)) < log_alpha
        x = torch.where(accept[:, None], x_new, x)
        lp = torch.where(accept, lp_new, lp)
        grad = torch.where(accept[:, None], grad_new, grad)
        record.record(i, x, lp, accept)
        if adapt and i < burn_in:
            step = averaging.update(log_alpha.clamp(max=0.0).exp().mean().item())
            if windows and windows[0][0] <= i < windows[0][1]:
                window_states.append(x)
            if windows and i == windows[0][1] - 1:
                inverse_metric = _regularised_variance(torch.stack(window_states).reshape(-1, D))
                windows.pop(0)
                window_states = []
                averaging.restart(step)
    return record.result(torch.full((C,), step, dtype=dtype, device=device))


def _leapfrog(log_target: LogTarget, x: Tensor, lp: Tensor, grad: Tensor, momentum: Tensor, e: float,
              n_steps: int, inverse_metric: Tensor, vectorized: bool):
    """``n_steps`` leapfrog steps of size e from (x [C, D], p [C, D]); a chain whose target or gradient turns
    non-finite, or whose energy error passes the divergence threshold, stops where it is and is marked dead.
    Returns (x, log target, gradient, momentum, alive [C])."""
    start_energy = -lp + 0.5 * (momentum**2 * inverse_metric).sum(-1)
    alive = torch.ones_like(lp, dtype=torch.bool)
    p = momentum + 0.5 * e * grad
    for step in range(n_steps):
        x_next = x + e * inverse_metric * p
        lp_next, grad_next = value_and_grad(log_target, x_next, vectorized)
        energy = -lp_next + 0.5 * (p**2 * inverse_metric).sum(-1)  # p is half a step behind: a coarse check
        alive = alive & torch.isfinite(lp_next) & torch.isfinite(grad_next).all(-1) & (
            (energy - start_energy).abs() < _DIVERGENCE)
        x = torch.where(alive[:, None], x_next, x)
        lp = torch.where(alive, lp_next, lp)
        grad = torch.where(alive[:, None], grad_next, grad)
        p = torch.where(alive[:, None], p + (e if step < n_steps - 1 else 0.5 * e) * grad, p)
    return x, lp, grad, p, alive


def _regularised_variance(states: Tensor) -> Tensor:
    """Per-parameter variance of the pooled states [N, D], shrunk toward 1e-3 as Stan's. [D]"""
    n = states.shape[0]
    return n / (n + 5.0) * states.var(0) + 1e-3 * 5.0 / (n + 5.0)

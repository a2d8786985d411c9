"""GP-GRIEF-I's chains: its samplers and their default budgets, the check of its MCMC options, and the diagnostics
of its kept samples (acceptance rates, step sizes, split R-hat and effective sample size of the weights and of the
noise), with one warning that says what it checked and what to change when the chains have not converged."""
from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING

import numpy as np

from ...mcmc import HMC_TUNE_MODES, TUNE_MODES, MCMCResult, effective_sample_size, kept_iterations, split_rhat

if TYPE_CHECKING:
    from ..base import GPModel

__all__ = ["ConvergenceWarning", "PARAMETRISATIONS", "SAMPLERS", "SAMPLER_DEFAULTS", "mcmc_settings", "summarise",
           "warn_if_unconverged", "check_mcmc_options"]

PARAMETRISATIONS = ("auto", "reweighted", "orthogonal")
RHAT_LIMIT = 1.1  # the classic split R-hat cut (Gelman et al., BDA3)
MIN_ACCEPTANCE = 0.05  # below this after burn-in a chain has hardly moved (MALA's target is about 0.57, HMC's 0.8)
# The budget a GRIEF-I option left at None takes, per sampler. "hmc" (the default): iterations of n_leapfrog
# gradient evaluations each, every state after burn-in kept, four chains for split R-hat; "mala": the paper's run
# (179 kept samples per chain), two chains.
SAMPLERS = ("hmc", "mala")
SAMPLER_DEFAULTS = {
    "hmc": {"n_iterations": 300, "burn_in": 150, "thin": 1, "n_chains": 4, "step_size": 0.1, "n_leapfrog": 8},
    "mala": {"n_iterations": 10_000, "burn_in": 1_000, "thin": 50, "n_chains": 2, "step_size": 0.4},
}
SAMPLER_TUNE_MODES = {"hmc": HMC_TUNE_MODES, "mala": TUNE_MODES}
TARGET_ACCEPTANCE = {"hmc": "0.8", "mala": "0.57"}


class ConvergenceWarning(RuntimeWarning):
    """GP-GRIEF-I's chains have not converged: the largest split R-hat over the sampled quantities (the log weights
    log u and log sigma^2; theta is fixed, not sampled) is above 1.1 or not finite (chains that never moved), or a
    chain's acceptance rate after burn-in is below 0.05."""


def mcmc_settings(model: GPModel) -> dict:
    """The sampler's budget of a GP-GRIEF-I model: each of ``n_iterations``, ``burn_in``, ``thin``, ``n_chains``,
    ``step_size`` (and HMC's ``n_leapfrog``) as set on the model, or its sampler's :data:`SAMPLER_DEFAULTS` where
    None."""
    defaults = SAMPLER_DEFAULTS[model.sampler]
    return {name: default if getattr(model, name) is None else getattr(model, name)
            for name, default in defaults.items()}


def summarise(result: MCMCResult) -> dict[str, float]:
    """Acceptance rates, step sizes, split R-hat (classic and rank-normalised) and ESS of the kept x = (log u,
    log sigma^2) [C, S, q + 1]: their worst over all of x, over the weights and for sigma^2 (NaN with < 4 draws per
    chain, or for parameters that never moved)."""
    x = result.samples
    if x.shape[1] >= 4:
        rhat, rank_rhat, ess = split_rhat(x), split_rhat(x, rank_normalize=True), effective_sample_size(x)
    else:
        rhat = rank_rhat = ess = np.full(x.shape[-1], np.nan)
    return {
        "acceptance_rate_min": result.acceptance_rate.min().item(),
        "acceptance_rate_max": result.acceptance_rate.max().item(),
        "step_size_min": result.step_size.min().item(),
        "step_size_max": result.step_size.max().item(),
        "rhat_max": _finite_or_nan(np.max, rhat),
        "rhat_weights": _finite_or_nan(np.max, rhat[:-1]),
        "rhat_noise": float(rhat[-1]),
        "rank_rhat_max": _finite_or_nan(np.max, rank_rhat),
        "rank_rhat_noise": float(rank_rhat[-1]),
        "ess_min": _finite_or_nan(np.min, ess),
        "ess_noise": float(ess[-1]),
        "n_samples": float(x.shape[0] * x.shape[1]),
        "noise_mean": x[..., -1].exp().mean().item(),
    }


def _finite_or_nan(reduce, values: np.ndarray) -> float:
    # NaN marks a parameter without a verdict (constant draws): leave it out unless every parameter is NaN
    kept = values[~np.isnan(values)]
    return float(reduce(kept)) if kept.size else math.nan


def warn_if_unconverged(summary: dict[str, float], model: GPModel) -> None:
    """One :class:`ConvergenceWarning` that names what it checked (the classic split R-hat of every sampled
    quantity, the weights' log u and log sigma^2, and the acceptance rates), what is wrong and what to change."""
    settings, problems = mcmc_settings(model), []
    if summary["acceptance_rate_min"] < MIN_ACCEPTANCE:
        problems.append(
            f"a chain accepted {summary['acceptance_rate_min']:.3f} of its proposals after burn-in (want about "
            f"{TARGET_ACCEPTANCE[model.sampler]}), with step size {summary['step_size_min']:.3g} (initially "
            f"step_size={settings['step_size']}): lengthen burn_in (now {settings['burn_in']}) so that "
            f"tune='burn_in' can adapt it (now tune={model.tune!r}), or lower step_size")
    if not math.isfinite(summary["rhat_max"]):
        problems.append(f"split R-hat is {summary['rhat_max']} (chains that never moved, or fewer than 4 kept "
                        f"samples per chain): check the acceptance rates and keep more samples")
    elif summary["rhat_max"] > RHAT_LIMIT:
        problems.append(
            f"the largest split R-hat is {summary['rhat_max']:.3g} (weights: {summary['rhat_weights']:.3g}, "
            f"sigma^2: {summary['rhat_noise']:.3g}; want <= {RHAT_LIMIT}): run more iterations (n_iterations, now "
            f"{settings['n_iterations']}) or more chains (n_chains, now {settings['n_chains']}); acceptance rates "
            f"were {summary['acceptance_rate_min']:.2f}-{summary['acceptance_rate_max']:.2f}")
    if problems:
        warnings.warn(f"GP-GRIEF-I's MCMC ({model.sampler}) has not converged on the sampled weights (log u) and "
                      f"noise (log sigma^2; theta is fixed): " + "; ".join(problems) + ".", ConvergenceWarning,
                      stacklevel=4)  # past fit_posterior's no_grad wrapper, to its caller


def check_mcmc_options(model: GPModel) -> None:
    """Refuse a GP-GRIEF-I model's (:class:`~gpscale.models.grief.grief_i.GRIEFI`) sampler, parametrisation or MCMC
    settings that no chain can run with, naming the option and its least value."""
    if model.sampler not in SAMPLERS:
        raise ValueError(f"Expected sampler to be one of {SAMPLERS} ('hmc': Hamiltonian Monte Carlo with adapted "
                         f"step size and mass matrix; 'mala': the paper's Langevin sampler). Got {model.sampler!r}.")
    if model.parametrisation not in PARAMETRISATIONS:
        raise ValueError(f"Expected parametrisation to be one of {PARAMETRISATIONS}. Got {model.parametrisation!r}.")
    settings = mcmc_settings(model)
    for name, minimum in (("n_iterations", 2), ("burn_in", 0), ("thin", 1), ("n_chains", 1), ("n_leapfrog", 1)):
        value = settings.get(name, getattr(model, name))
        if value is None and name not in settings:  # n_leapfrog, which MALA does not use
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
            default = " (or None: the sampler's default)" if name in settings else ""
            raise ValueError(f"Expected {name} to be an integer >= {minimum}{default}. Got {value!r}.")
    if len(kept_iterations(settings["n_iterations"], settings["burn_in"], settings["thin"])) == 0:
        raise ValueError(f"No MCMC sample would be kept: iteration i is kept when burn_in < i < n_iterations and i "
                         f"% thin == 0. Got n_iterations={settings['n_iterations']}, burn_in={settings['burn_in']}, "
                         f"thin={settings['thin']}.")
    step_size = settings["step_size"]
    if isinstance(step_size, bool) or not (isinstance(step_size, (int, float)) and math.isfinite(step_size)
                                           and step_size > 0):
        raise ValueError(f"Expected step_size to be a finite number > 0. Got {step_size!r}.")
    if model.tune not in SAMPLER_TUNE_MODES[model.sampler]:
        raise ValueError(f"Expected tune to be one of {SAMPLER_TUNE_MODES[model.sampler]} with "
                         f"sampler={model.sampler!r}. Got {model.tune!r}.")
    if not isinstance(model.jacobian, bool):
        raise ValueError(f"Expected jacobian to be True or False. Got {model.jacobian!r}.")
    for name in ("weight_prior_variance", "noise_prior_variance"):
        value = getattr(model, name)
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"Expected {name} (of a log-normal prior) to be a finite number > 0. Got {value!r}.")

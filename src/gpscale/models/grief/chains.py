"""GP-GRIEF-I's chains: the check of its MCMC options, and the diagnostics of its kept samples (acceptance rates,
step sizes, split R-hat and effective sample size), with one warning that says what to change when the chains
have not converged."""
from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING

import numpy as np

from ...mcmc import TUNE_MODES, MCMCResult, effective_sample_size, kept_iterations, split_rhat

if TYPE_CHECKING:
    from ..base import GPModel

__all__ = ["ConvergenceWarning", "PARAMETRISATIONS", "summarise", "warn_if_unconverged", "check_mcmc_options"]

PARAMETRISATIONS = ("auto", "reweighted", "orthogonal")
RHAT_LIMIT = 1.1  # the classic split R-hat cut (Gelman et al., BDA3)
MIN_ACCEPTANCE = 0.05  # below this after burn-in a chain has hardly moved (MALA's target is about 0.57)


class ConvergenceWarning(RuntimeWarning):
    """GP-GRIEF-I's chains have not converged: split R-hat above 1.1 or not finite (chains that never moved), or an
    acceptance rate after burn-in below 0.05."""



def summarise(result: MCMCResult) -> dict[str, float]:
    """Acceptance rates, step sizes, split R-hat and ESS of the kept x [C, S, q + 1] (NaN with < 4 draws per
    chain, or for parameters that never moved)."""
    x = result.samples
    if x.shape[1] >= 4:
        rhat, ess = split_rhat(x), effective_sample_size(x)
    else:
        rhat = ess = np.full(x.shape[-1], np.nan)
    return {
        "acceptance_rate_min": result.acceptance_rate.min().item(),
        "acceptance_rate_max": result.acceptance_rate.max().item(),
        "step_size_min": result.step_size.min().item(),
        "step_size_max": result.step_size.max().item(),
        "rhat_max": _finite_or_nan(np.max, rhat),
        "rhat_noise": float(rhat[-1]),
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
    """One :class:`ConvergenceWarning` listing what is wrong with the chains and what to change."""
    problems = []
    if summary["acceptance_rate_min"] < MIN_ACCEPTANCE:
        problems.append(
            f"a chain accepted {summary['acceptance_rate_min']:.3f} of its proposals after burn-in (want about "
            f"0.57), with step size {summary['step_size_min']:.3g} (initially step_size={model.step_size}): lengthen "
            f"burn_in (now {model.burn_in}) so that tune='burn_in' can adapt it (now tune={model.tune!r}), or "
            f"lower step_size")
    if not math.isfinite(summary["rhat_max"]):
        problems.append(f"split R-hat is {summary['rhat_max']} (chains that never moved, or fewer than 4 kept "
                        f"samples per chain): check the acceptance rates and keep more samples")
    elif summary["rhat_max"] > RHAT_LIMIT:
        problems.append(
            f"the largest split R-hat is {summary['rhat_max']:.3g} (sigma^2: {summary['rhat_noise']:.3g}; want <= "
            f"{RHAT_LIMIT}): run more iterations (n_iterations, now {model.n_iterations}) or more chains "
            f"(n_chains, now {model.n_chains}); acceptance rates were {summary['acceptance_rate_min']:.2f}-"
            f"{summary['acceptance_rate_max']:.2f}")
    if problems:
        warnings.warn("GP-GRIEF-I's MCMC has not converged: " + "; ".join(problems) + ".", ConvergenceWarning,
                      stacklevel=4)  # past fit_posterior's no_grad wrapper, to its caller


def check_mcmc_options(model: GPModel) -> None:
    """Refuse a GP-GRIEF-I model's (:class:`~gpscale.models.grief.grief_i.GRIEFI`) parametrisation or MCMC settings
    that no chain can run with, naming the option and its least value."""
    if model.parametrisation not in PARAMETRISATIONS:
        raise ValueError(f"Expected parametrisation to be one of {PARAMETRISATIONS}. Got {model.parametrisation!r}.")
    for name, minimum in (("n_iterations", 2), ("burn_in", 0), ("thin", 1), ("n_chains", 1)):
        value = getattr(model, name)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
            raise ValueError(f"Expected {name} to be an integer >= {minimum}. Got {value!r}.")
    if len(kept_iterations(model.n_iterations, model.burn_in, model.thin)) == 0:
        raise ValueError(f"No MCMC sample would be kept: iteration i is kept when burn_in < i < n_iterations and i "
                         f"% thin == 0. Got n_iterations={model.n_iterations}, burn_in={model.burn_in}, "
                         f"thin={model.thin}.")
    if not (isinstance(model.step_size, (int, float)) and math.isfinite(model.step_size) and model.step_size > 0):
        raise ValueError(f"Expected step_size to be a finite number > 0. Got {model.step_size!r}.")
    if model.tune not in TUNE_MODES:
        raise ValueError(f"Expected tune to be one of {TUNE_MODES}. Got {model.tune!r}.")
    if not isinstance(model.jacobian, bool):
        raise ValueError(f"Expected jacobian to be True or False. Got {model.jacobian!r}.")
    for name in ("weight_prior_variance", "noise_prior_variance"):
        value = getattr(model, name)
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"Expected {name} (of a log-normal prior) to be a finite number > 0. Got {value!r}.")

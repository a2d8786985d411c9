"""Generic MCMC pieces for GP-GRIEF-I, which samples its kernel weights and noise variance: the log-normal prior
given by (mode, variance) (:mod:`~gpscale.mcmc.priors`), positive-parameter transforms that keep the Jacobian
(:mod:`~gpscale.mcmc.transforms`), two samplers driven by autograd: Metropolis-adjusted Langevin (MALA, the
paper's) with its step size adapted during burn-in (:mod:`~gpscale.mcmc.langevin`) and Hamiltonian Monte Carlo with
a dual-averaged step size and a diagonal mass matrix adapted during burn-in (:mod:`~gpscale.mcmc.hamiltonian`), sharing
:mod:`~gpscale.mcmc.sampling`, and the split R-hat / effective-sample-size diagnostics
(:mod:`~gpscale.mcmc.diagnostics`).

Shapes: ``D`` parameters, ``C`` chains, ``S`` kept samples per chain, ``N`` draws per chain in the diagnostics.
"""
from .diagnostics import effective_sample_size, split_rhat
from .hamiltonian import HMC_TUNE_MODES, hmc
from .langevin import TUNE_MODES, mala
from .sampling import MCMCResult, kept_iterations
from .priors import LogNormal
from .transforms import ExpTransform, SoftplusTransform, transformed_log_target

__all__ = [
    "LogNormal",
    "mala",
    "hmc",
    "HMC_TUNE_MODES",
    "MCMCResult",
    "kept_iterations",
    "TUNE_MODES",
    "ExpTransform",
    "SoftplusTransform",
    "transformed_log_target",
    "split_rhat",
    "effective_sample_size",
]

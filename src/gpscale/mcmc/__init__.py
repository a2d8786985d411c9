"""Generic MCMC pieces for GP-GRIEF-I, which samples its kernel weights and noise variance: the log-normal prior
given by (mode, variance) (:mod:`~gpscale.mcmc.priors`), positive-parameter transforms that keep the Jacobian
(:mod:`~gpscale.mcmc.transforms`), a Metropolis-adjusted Langevin (MALA) sampler driven by autograd, with its step
size adapted during burn-in (:mod:`~gpscale.mcmc.langevin`), and the split R-hat / effective-sample-size
diagnostics (:mod:`~gpscale.mcmc.diagnostics`).

Shapes: ``D`` parameters, ``C`` chains, ``S`` kept samples per chain, ``N`` draws per chain in the diagnostics.
"""
from .diagnostics import effective_sample_size, split_rhat
from .langevin import TUNE_MODES, MCMCResult, kept_iterations, mala
from .priors import LogNormal
from .transforms import ExpTransform, SoftplusTransform, transformed_log_target

__all__ = [
    "LogNormal",
    "mala",
    "MCMCResult",
    "kept_iterations",
    "TUNE_MODES",
    "ExpTransform",
    "SoftplusTransform",
    "transformed_log_target",
    "split_rhat",
    "effective_sample_size",
]

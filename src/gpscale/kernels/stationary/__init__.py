"""Stationary kernels: RBF and Matérn 1/2, 3/2, 5/2 with an outputscale and a shared or ARD lengthscale.

Notation: ``k(x, x') = s^2 g(r)``, ``r = ||(x - x') / l||`` with lengthscale(s) ``l`` and outputscale ``s^2``.
Positive hyperparameters are stored unconstrained and mapped through softplus.
"""
from .base import SOFTPLUS_ZERO, Kernel, Sum, inverse_softplus, median_distance, weighted_grams
from .distances import underflow_cutoff
from .periodic import Periodic
from .radial import RBF, Matern, Stationary

__all__ = ["Kernel", "Stationary", "RBF", "Matern", "Periodic", "Sum", "inverse_softplus", "median_distance",
           "SOFTPLUS_ZERO", "underflow_cutoff", "weighted_grams"]

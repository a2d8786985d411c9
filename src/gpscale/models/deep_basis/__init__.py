"""Deep basis kernels: dbk (the exact O(n r^2) model on the linear engine) and svdbk (its stochastic variational
form)."""
from .dbk import DBK
from .svdbk import SVDBK

__all__ = ["DBK", "SVDBK"]

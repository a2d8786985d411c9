"""The exact GP: a Cholesky factor of K + sigma^2 I when it fits, else an iterative solver over K in blocks."""
from .gp import ExactGP

__all__ = ["ExactGP"]

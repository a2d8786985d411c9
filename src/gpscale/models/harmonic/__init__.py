"""HVGP: the harmonic kernel decomposition, one block of inducing features per irreducible part of a group."""
from .hvgp import HVGP, HarmonicFeatures

__all__ = ["HVGP", "HarmonicFeatures"]

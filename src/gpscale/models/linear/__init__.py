"""The linear engine: a GP whose kernel is a finite feature map (a Bayesian linear model, O(n r^2)), and the
collapsed bound over inducing features on it; sgpr and softki."""
from .collapsed import CollapsedGP
from .engine import Features, FeatureSpaceGP
from .sgpr import SGPR
from .softki import SoftKI

__all__ = ["CollapsedGP", "Features", "FeatureSpaceGP", "SGPR", "SoftKI"]

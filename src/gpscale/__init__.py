"""gpscale: scalable Gaussian processes in PyTorch."""
from ._version import __version__
from .estimator import GPClassifier, GPRegressor, load
from .linalg import NotPSDError, NumericalWarning
from .models import available_methods
from .models._extrapolation import ExtrapolationWarning
from .models.grief_i_chains import ConvergenceWarning


__all__ = ["GPRegressor", "GPClassifier", "load", "available_methods", "NotPSDError", "NumericalWarning",
           "ExtrapolationWarning", "ConvergenceWarning", "__version__"]

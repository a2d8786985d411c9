"""gpscale: scalable Gaussian processes in PyTorch."""
from ._version import __version__
from .cite import cite
from .estimator import GPClassifier, GPRegressor, load
from .linalg import NotPSDError, NumericalWarning
from .models import available_methods
from .models.extrapolation import ExtrapolationWarning
from .models.grief.chains import ConvergenceWarning
from .preemption import Stopped
from .scaling import OutlierWarning
from .sources import Table


__all__ = ["GPRegressor", "GPClassifier", "Table", "load", "available_methods", "NotPSDError", "NumericalWarning",
           "ExtrapolationWarning", "ConvergenceWarning", "OutlierWarning", "Stopped", "cite", "__version__"]

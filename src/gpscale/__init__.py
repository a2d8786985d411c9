"""gpscale: scalable Gaussian processes in PyTorch."""
__version__ = "0.1.0"

from .estimator import GPClassifier, GPRegressor, load  # noqa: E402
from .linalg import NotPSDError, NumericalWarning  # noqa: E402
from .models import available_methods  # noqa: E402
from .models.dbk import ExtrapolationWarning  # noqa: E402


__all__ = ["GPRegressor", "GPClassifier", "load", "available_methods", "NotPSDError", "NumericalWarning",
           "ExtrapolationWarning", "__version__"]

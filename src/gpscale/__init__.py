"""gpscale: scalable Gaussian-process regression in PyTorch."""
__version__ = "0.1.0"

from .estimator import GPRegressor  # noqa: E402
from .linalg import NotPSDError, NumericalWarning  # noqa: E402
from .models import available_methods  # noqa: E402


def load(path, device=None) -> GPRegressor:
    """Load a model saved with :meth:`GPRegressor.save`."""
    return GPRegressor.load(path, device=device)


__all__ = ["GPRegressor", "load", "available_methods", "NotPSDError", "NumericalWarning", "__version__"]

"""Models, registered by key (see :func:`gpscale.models.base.available_methods`)."""
from . import convgp, dbk, deep_conv, exact, grief, grief_i, hvgp, odvgp, sgpr, softki, svdbk, svgp, vff  # noqa: F401 (registers them)
from .base import GPModel, available_methods, get_model_class, register

__all__ = ["GPModel", "available_methods", "get_model_class", "register"]

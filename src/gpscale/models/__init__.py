"""Models, registered by key (see :func:`gpscale.models.base.available_methods`).

One sub-package per family: ``exact`` (the exact GP), ``linear`` (the linear engine: a GP over a finite feature map,
and its collapsed-bound form over inducing features; sgpr, softki), ``variational`` (the variational engine: a
Gaussian q over inducing features; svgp, odvgp), ``fourier`` (variational Fourier features), ``grief`` (GP-GRIEF-I
and -II), ``deep_basis`` (deep basis kernels), ``harmonic`` (HVGP) and ``conv`` (convolutional GPs). Importing this
package registers every method.
"""
from . import conv, deep_basis, exact, fourier, grief, harmonic, linear, variational  # noqa: F401 (registers them)
from .base import GPModel, available_methods, get_model_class, register

__all__ = ["GPModel", "available_methods", "get_model_class", "register"]

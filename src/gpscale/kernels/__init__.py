"""Covariance functions."""
from .gpytorch_adapter import GPyTorchKernel
from .separable import AdditiveMatern, ProductMatern
from .specs import kernel_from_spec, kernel_spec, make_kernel, register_kernel
from .stationary import RBF, SOFTPLUS_ZERO, Kernel, Matern, Periodic, Stationary, Sum, inverse_softplus, median_distance

__all__ = ["Kernel", "Stationary", "RBF", "Matern", "Periodic", "Sum", "AdditiveMatern", "ProductMatern",
           "GPyTorchKernel", "register_kernel", "kernel_spec", "kernel_from_spec",
           "inverse_softplus", "make_kernel", "median_distance", "SOFTPLUS_ZERO"]

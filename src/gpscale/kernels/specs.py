"""Kernels by name (:func:`make_kernel`, :func:`register_kernel`) and as constructor specs: what a model file stores
in place of a kernel object, so that loading a model never unpickles code.

A spec is ``{"type": <class name>, **config}`` for gpscale's own kernels (their ``config()``: the constructor's
arguments, nested kernels as specs). The tensors of the kernel travel in the model's ``state_dict``; the spec
rebuilds its structure. Any other kernel, GPyTorch's included, is saved by registering the function that builds
it and passing its name, which the model file stores as it stores ``kernel="rbf"``::

    @gpscale.kernels.register_kernel("periodic")
    def periodic(n_features):
        return GPyTorchKernel(gpytorch.kernels.ScaleKernel(gpytorch.kernels.PeriodicKernel()))

    GPRegressor(method="exact", kernel="periodic")   # the name, not the object: saved and loaded by name

The process that loads such a model must have registered the same name (import the module that registers it).
"""
from __future__ import annotations

from typing import Callable

from .patches import ConvKernel
from .separable import AdditiveMatern, ProductMatern
from .stationary import RBF, Kernel, Matern, Periodic, Sum

__all__ = ["KERNEL_NAMES", "make_kernel", "register_kernel", "registered_kernel", "kernel_spec", "kernel_from_spec"]

_BUILT_IN: dict[str, type[Kernel]] = {cls.__name__: cls for cls in (RBF, Matern, Periodic, Sum, AdditiveMatern,
                                                                    ProductMatern, ConvKernel)}
_REGISTERED: dict[str, Callable[[int], Kernel]] = {}


KERNEL_NAMES = ("rbf", "matern12", "matern32", "matern52", "additive_matern12", "additive_matern32",
                "additive_matern52")


def make_kernel(name: str, n_features: int, **kwargs) -> Kernel:
    """Kernel by name: ``rbf``, ``matern12``, ``matern32``, ``matern52`` (ARD or not: ``ard=``), or
    ``additive_matern12`` / ``32`` / ``52`` (:class:`~gpscale.kernels.separable.AdditiveMatern`: a lengthscale and
    a variance per input; ``outputscale`` is their initial total)."""
    lowered = name.lower()
    nus = {"matern12": 0.5, "matern32": 1.5, "matern52": 2.5}
    if lowered == "rbf":
        return RBF(n_features, **kwargs)
    if lowered in nus:
        return Matern(n_features, nu=nus[lowered], **kwargs)
    if lowered.startswith("additive_") and lowered[len("additive_"):] in nus:
        kwargs.pop("ard", None)
        return AdditiveMatern(n_features, nu=nus[lowered[len("additive_"):]], **kwargs)
    kernel = registered_kernel(name, n_features)
    if kernel is not None:
        return kernel
    raise ValueError(f"Unknown kernel {name!r}; choose one of {', '.join(KERNEL_NAMES)}, or register a constructor "
                     "with gpscale.kernels.register_kernel (a model saved with a registered kernel needs the same "
                     "registration, e.g. its module imported, before it is loaded).")


def register_kernel(name: str) -> Callable[[Callable[[int], Kernel]], Callable[[int], Kernel]]:
    """Decorator: make ``constructor(n_features) -> Kernel`` available as ``kernel=name`` to every method that takes
    a kernel, and to a model file that names it. Registering a name again replaces its constructor."""
    if not isinstance(name, str) or not name or name.lower() in KERNEL_NAMES:
        raise ValueError(f"A registered kernel needs a new, non-empty name (not one of {', '.join(KERNEL_NAMES)}); "
                         f"got {name!r}.")

    def decorate(constructor: Callable[[int], Kernel]) -> Callable[[int], Kernel]:
        _REGISTERED[name] = constructor
        return constructor

    return decorate


def registered_kernel(name: str, n_features: int) -> Kernel | None:
    """The kernel the constructor registered as ``name`` builds for ``n_features`` inputs; None if none is."""
    if name not in _REGISTERED:
        return None
    kernel = _REGISTERED[name](n_features)
    if not isinstance(kernel, Kernel):
        raise TypeError(f"The constructor registered as kernel {name!r} returned a {type(kernel).__name__}, not a "
                        "gpscale Kernel (wrap a GPyTorch kernel in gpscale.kernels.GPyTorchKernel).")
    return kernel


def kernel_spec(kernel: Kernel) -> dict:
    """The spec that rebuilds ``kernel``'s structure (see the module docstring); a kernel that gpscale cannot
    rebuild is an error that says how to make it savable."""
    config = kernel.config() if type(kernel).__name__ in _BUILT_IN else None
    if config is None:
        raise ValueError(f"A {type(kernel).__name__} kernel object cannot be saved: a model file holds kernels as "
                         "constructor specs, never as pickled code. Register the function that builds it with "
                         "@gpscale.kernels.register_kernel('name') and pass kernel='name' instead of the object.")
    return {"type": type(kernel).__name__,
            **{k: kernel_spec(v) if isinstance(v, Kernel) else v for k, v in config.items()}}


def kernel_from_spec(spec: dict) -> Kernel:
    """The kernel a :func:`kernel_spec` describes (its hyperparameters at their initial values)."""
    args = {k: v for k, v in spec.items() if k != "type"}
    if spec.get("type") not in _BUILT_IN:
        raise ValueError(f"Unknown kernel type {spec.get('type')!r} in a kernel spec; known: "
                         f"{', '.join(sorted(_BUILT_IN))}.")
    args = {k: kernel_from_spec(v) if isinstance(v, dict) and "type" in v else v for k, v in args.items()}
    return _BUILT_IN[spec["type"]](**args)

"""The estimators' settings, checked before a fit touches the data: the dtype and the device, the options of the
registered methods, and what a training checkpoint records of a fit."""
from __future__ import annotations

import numpy as np
import torch

from ..models import available_methods, get_model_class
from ..models.base import option_default, option_names

__all__ = ["DTYPES", "resolve_dtype", "saved_dtype", "dtype_name", "check_device", "all_method_options",
           "boolean_options", "given_hyperparameters", "checkpoint_settings"]


DTYPES = {"float64": torch.float64, "float32": torch.float32}


def resolve_dtype(dtype, method: str | None = None) -> torch.dtype:
    """``"float32"`` / ``"float64"``, or the torch or numpy dtype of either, as a torch dtype; ``"auto"``: the
    method's (its model class's ``auto_dtype``)."""
    if isinstance(dtype, str) and dtype == "auto" and method is not None:
        dtype = get_model_class(method).auto_dtype
    if isinstance(dtype, torch.dtype):
        name = dtype_name(dtype) if dtype in DTYPES.values() else None
    else:
        try:
            name = np.dtype(dtype).name if dtype is not None else None
        except TypeError:
            name = None
    if name not in DTYPES:
        raise ValueError(f"dtype must be 'auto', 'float64' or 'float32' (or the torch or numpy dtype of either), "
                         f"got {dtype!r}.")
    return DTYPES[name]


def saved_dtype(given, method: str, fitted: torch.dtype) -> str:
    """The ``dtype`` parameter a model file records: the one given (``"auto"`` or a name) when it still resolves to
    the fitted dtype, so that a loaded estimator's ``get_params`` are the fitted one's; else (changed by
    ``set_params`` since the fit) the fitted dtype's name."""
    try:
        name = "auto" if isinstance(given, str) and given == "auto" else dtype_name(resolve_dtype(given))
        return name if resolve_dtype(name, method) == fitted else dtype_name(fitted)
    except ValueError:
        return dtype_name(fitted)


def dtype_name(dtype: torch.dtype) -> str:
    return {v: k for k, v in DTYPES.items()}[dtype]


def check_device(device) -> torch.device:
    """``device`` as a torch device, checked to exist on this machine before any work is done on it."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device={device!r} is not a device name torch knows ({err}); use 'cpu', 'cuda' or "
                         "'cuda:N'.") from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r}, but this machine has no CUDA device that torch "
                             f"{torch.__version__} can use (torch.cuda.is_available() is False): use device='cpu', "
                             "or install a CUDA build of torch on a machine with an NVIDIA GPU.")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ValueError(f"device={device!r}, but this machine has {torch.cuda.device_count()} CUDA device(s) "
                             f"(cuda:0 .. cuda:{torch.cuda.device_count() - 1}).")
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device={device!r}, but MPS is not available on this machine: use device='cpu'.")
    elif parsed.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device={device!r}: gpscale runs on 'cpu', 'cuda' or 'mps'.")
    return parsed


def all_method_options() -> set[str]:
    """Every option of every registered method."""
    return set().union(*(option_names(get_model_class(key)) for key in available_methods()))


def boolean_options() -> set[str]:
    """The options that registered methods declare with a True or False default, or with None (the method choosing
    one of the two, as hvgp's ``ard``) where another declares True or False; none declaring it otherwise."""
    kinds: dict[str, set[str]] = {}
    for key in available_methods():
        cls = get_model_class(key)
        for name in option_names(cls):
            default = option_default(cls, name)
            kinds.setdefault(name, set()).add("bool" if isinstance(default, bool) else "none" if default is None
                                              else "other")
    return {name for name, seen in kinds.items() if "bool" in seen and seen <= {"bool", "none"}}


def given_hyperparameters(options: dict) -> str:
    """The initial hyperparameter values the caller gave (not left to start from the data), as one phrase."""
    given = [f"{name}={options[name]:.3g}" for name in ("lengthscale", "outputscale", "noise")
             if isinstance(options.get(name), (int, float))]
    if options.get("learn_noise") is False:
        given.append("learn_noise=False")
    return ", ".join(given)


def checkpoint_settings(options: dict, x_scale, fitted: dict) -> dict[str, str]:
    """What a training checkpoint records of a fit beyond the data the model sees (:mod:`gpscale.checkpoint`): the
    model's options, and the scaling of X and of the targets to 6 digits (shifted data standardise to the same
    rows: their scaling tells them apart)."""
    def digits(value) -> str:
        values = np.asarray(value)
        if values.dtype.kind not in "fiu":
            return repr(values.tolist())
        return " ".join(f"{v:.6g}" for v in np.atleast_1d(values.astype(np.float64)))

    scaling = {"x_shift": x_scale.shift, "x_scale": x_scale.scale, **fitted}
    return {**{name: repr(value) for name, value in options.items()},
            **{name: digits(value) for name, value in scaling.items()}}

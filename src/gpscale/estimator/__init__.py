"""GPRegressor and GPClassifier: the gpscale methods behind the scikit-learn estimator contract.

One job a module: ``base`` (the parameters, choosing, building and training the method, the latent predictive),
``regressor`` and ``classifier`` (the two estimators), ``persistence`` (the model file), ``settings`` (dtype, device
and option checks) and ``rows`` (checks of the rows given).
"""
from __future__ import annotations

import os

from ..io import ModelFileError, read_model_file
from .classifier import GPClassifier
from .regressor import GPRegressor
from .rows import named_blocks
from .settings import boolean_options, check_device, resolve_dtype

__all__ = ["GPRegressor", "GPClassifier", "load", "named_blocks", "resolve_dtype", "check_device",
           "boolean_options"]


def load(path: str | os.PathLike, device: str | None = None) -> GPRegressor | GPClassifier:
    """Load a model saved by :meth:`GPRegressor.save` or :meth:`GPClassifier.save`."""
    header, tensors = read_model_file(path)
    kinds = {klass.__name__: klass for klass in (GPRegressor, GPClassifier)}
    if header.get("kind") not in kinds:
        raise ModelFileError(f"{path} holds a {header.get('kind')!r}, not a GPRegressor or a GPClassifier.")
    return kinds[header["kind"]]._restore(path, header, tensors, device)

"""Saving and loading a fitted estimator: one model file of a JSON header (the parameters, the method's options, how
training ran) and the tensors (:mod:`gpscale.io`), never a pickle."""
from __future__ import annotations

import os

import numpy as np
import torch
from sklearn.utils.validation import check_is_fitted

from .._version import __version__
from ..io import ModelFileError, read_model_file, write_model_file
from ..kernels import Kernel, kernel_from_spec, kernel_spec
from ..models import get_model_class
from .settings import dtype_name, resolve_dtype, saved_dtype

__all__ = ["SavedEstimator", "jsonable", "unjsonable"]


class SavedEstimator:
    """What an estimator adds to be saved and loaded: :meth:`save`, :meth:`load`, and the interface by which each
    kind of estimator writes and reads what its model file holds beyond the model and the X scaling."""

    def save(self, path: str | os.PathLike, metadata: dict | None = None) -> None:
        """Write the fitted model to one file (atomically); :meth:`load` reads it back.

        ``metadata`` (JSON-serialisable, e.g. feature names) is stored alongside and restored as ``metadata_``.
        A kernel object is stored as its constructor's name and arguments plus its tensors (never as a pickle):
        gpscale's kernels and kernels registered with :func:`gpscale.kernels.register_kernel` can be saved; any
        other object is refused with a message saying how to register it.
        """
        check_is_fitted(self, "model_")
        if getattr(self, "rank_", 0) != 0:  # data-parallel: every rank holds the same model; rank 0 writes it
            return
        # the model's own dtype and device, whatever set_params has changed since the fit
        params = {**self.get_params(), "dtype": saved_dtype(self.dtype, self.method_, self.dtype_),
                  "device": str(self.device_)}
        header = {
            "kind": type(self).__name__,
            "gpscale_version": __version__,
            "torch_version": torch.__version__,
            "params": jsonable(params),
            "model_options": jsonable(self.model_options_),
            "method": self.method_,
            "method_reason": self.method_reason_,
            "training": self.training_,
            "n_features_in": int(self.n_features_in_),
            "feature_names": getattr(self, "feature_names_in_", np.empty(0)).tolist() or None,
            **self._header(),
            "dtype": dtype_name(self.dtype_),
            "metadata": metadata or {},
        }
        tensors = {"model": self.model_.state_dict(), "x_mean": torch.as_tensor(self.x_mean_),
                   "x_std": torch.as_tensor(self.x_std_)}
        write_model_file(path, header, tensors)

    @classmethod
    def load(cls, path: str | os.PathLike, device: str | None = None):
        """Read a model written by :meth:`save`; predictions are identical to the saved model's."""
        header, tensors = read_model_file(path)
        if header.get("kind") != cls.__name__:
            raise ModelFileError(f"{path} holds a {header.get('kind')!r}, not a {cls.__name__}.")
        return cls._restore(path, header, tensors, device)

    @classmethod
    def _restore(cls, path, header: dict, tensors: dict, device: str | None):
        try:
            params = unjsonable(dict(header["params"]))
            if device is not None:
                params["device"] = device
            est = cls(**params)
            method = header["method"]
            model_cls = get_model_class(method)
            model = model_cls(header["n_features_in"], **unjsonable(header["model_options"]))
            # cast before loading: load_state_dict copies into the parameters' current dtype
            dtype = resolve_dtype(header["dtype"])  # the fitted dtype (what "auto" resolved to)
            model.to(dtype=dtype, device=torch.device(est.device))
            model.load_state_dict(tensors["model"])
            device = est.device_ = torch.device(est.device)  # a list: per-device factors (HVGP's placed blocks)
            est.dtype_ = dtype
            model.cache = {k: [t.to(device) for t in v] if isinstance(v, list) else v.to(device)
                           for k, v in model.cache.items()}
            est.model_ = model.eval()
            est.method_ = method
            est.method_reason_ = header["method_reason"]
            est.training_ = header["training"]
            est.model_options_ = unjsonable(header["model_options"])
            est.n_features_in_ = header["n_features_in"]
            if header["feature_names"]:
                est.feature_names_in_ = np.asarray(header["feature_names"], dtype=object)
            est.x_mean_, est.x_std_ = tensors["x_mean"].numpy(), tensors["x_std"].numpy()
            est._restore_header(header)
            est.metadata_ = header["metadata"]
        except (KeyError, TypeError, RuntimeError, ValueError) as err:
            raise ModelFileError(f"{path} could not be restored as a {cls.__name__} ({err}); it may come from an "
                                 "incompatible gpscale version.") from err
        return est

    def _header(self) -> dict:  # pragma: no cover - interface
        """What this estimator's model file holds beyond the model and the X scaling."""
        raise NotImplementedError

    def _restore_header(self, header: dict) -> None:  # pragma: no cover - interface
        raise NotImplementedError


_SCALARS = (str, int, float, bool, type(None))


def jsonable(params: dict) -> dict:
    """The options as JSON values: lists of scalars stay lists, tuples of scalars (e.g. ``init_stretch``) become
    ``{"tuple": [...]}`` so that they come back as tuples, a kernel object its constructor spec
    (:func:`gpscale.kernels.kernel_spec`)."""
    def scalar_sequence(v):  # nested: a deep model's filter sizes are a sequence of (height, width) pairs
        return isinstance(v, (list, tuple)) and all(isinstance(x, _SCALARS) or scalar_sequence(x) for x in v)

    def encode(v):
        if isinstance(v, tuple):
            return {"tuple": [encode(x) for x in v]}
        return [encode(x) for x in v] if isinstance(v, list) else v

    out = {}
    for name, value in params.items():
        if isinstance(value, Kernel):
            out[name] = {"kernel_spec": kernel_spec(value)}
        elif isinstance(value, _SCALARS) or scalar_sequence(value):
            out[name] = encode(value)
        elif isinstance(value, os.PathLike):  # a checkpoint's path
            out[name] = os.fspath(value)
        else:
            raise ValueError(f"Cannot save option {name}={value!r}: a model file holds str/int/float/bool/None "
                             "options, lists of them and gpscale kernels, never pickled objects. Pass the option "
                             "by name (e.g. network='resnet', group='pca_negation'), or for a kernel register its "
                             "constructor with gpscale.kernels.register_kernel and pass kernel='<its name>'.")
    return out


def unjsonable(params: dict) -> dict:
    """:func:`jsonable` undone: kernel specs become kernel objects again, tuples tuples."""
    def restore(value):
        if isinstance(value, dict) and "kernel_spec" in value:
            return kernel_from_spec(value["kernel_spec"])
        if isinstance(value, dict) and set(value) == {"tuple"}:
            return tuple(restore(v) for v in value["tuple"])
        return [restore(v) for v in value] if isinstance(value, list) else value

    return {name: restore(value) for name, value in params.items()}

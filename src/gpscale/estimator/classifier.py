"""GPClassifier: Gaussian-process classification with a variational gpscale method, as a scikit-learn classifier."""
from __future__ import annotations

import functools
import json
import math

import numpy as np
import torch
from sklearn.base import ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import validate_data

from ..distributed import Comm, agree
from ..sources import ArrayRows, StagedRows, Table
from .base import GPEstimator, all_or_nothing
from .rows import as_numpy, check_global_rows, min_rows

__all__ = ["GPClassifier", "global_classes"]


class GPClassifier(ClassifierMixin, GPEstimator):
    """Gaussian-process classification with a variational gpscale method.

    Two classes use the probit (Bernoulli) likelihood, more the robust-max one (or ``likelihood="softmax"``),
    each through the method's expected log-likelihood. Labels may be any values that ``numpy.unique`` sorts
    (strings or numbers, also under ``distributed=True``); X is standardised per column with training statistics.

    Parameters
    ----------
    method : str, default="auto"
        A method whose objective takes a non-Gaussian likelihood: ``"svgp"``, ``"hvgp"``, ``"odvgp"``,
        ``"odvff"``, ``"vff-svgp"``, ``"svdbk"``, and for images ``"conv-svgp"``, ``"conv-hvgp"``,
        ``"deep-conv-hvgp"`` (with ``image_shape``); the others say so. ``"auto"``: ``"svgp"``.
    likelihood : {None, "bernoulli", "robustmax", "softmax"}, default=None
        None: "bernoulli" for two classes, "robustmax" for more.
    n_inducing, epochs, max_steps, batch_size, lr, kernel, x_scaling, val_fraction, patience, val_every, seed, dtype,
    device, progress, distributed, checkpoint, resume, **method_options : as for :class:`GPRegressor` (validation
        scores the NLPD of the held-out labels).

    Attributes
    ----------
    classes_ : ndarray (C,), the labels, sorted; ``predict_proba``'s columns follow them.
    method_, method_reason_, model_, kernel_, n_features_in_, x_mean_, x_std_, dtype_, device_, training_seconds_,
        fit_result_ : as for :class:`GPRegressor`.
    """

    _task = "classification"

    def __init__(self, method="auto", n_inducing=None, epochs=None, max_steps=None, batch_size=None, lr=None,
                 kernel=None, likelihood=None, x_scaling="standard", val_fraction=None, patience=None, val_every=1,
                 seed=0, dtype="auto", device="cpu", progress=True, distributed=False, checkpoint=None,
                 resume=False, **method_options):
        self.likelihood = likelihood
        super().__init__(method, n_inducing, epochs, max_steps, batch_size, lr, kernel, x_scaling, val_fraction,
                         patience, val_every, seed, dtype, device, progress, distributed, checkpoint, resume,
                         method_options)

    @all_or_nothing
    def fit(self, X, y=None):
        """Train on X (n, d) and labels y (n,); or X a :class:`~gpscale.sources.Table` whose target column holds the
        labels (y left None), read a block at a time. Returns self."""
        self._check_settings()
        comm = self._comm()
        if isinstance(X, Table):
            scan = self._scan(X, y, comm, labels=True)
            classes = global_classes(np.asarray(sorted(scan.classes)), comm)
        else:
            def validated():
                check_labels(as_numpy(y))
                checked = validate_data(self, as_numpy(X), as_numpy(y), ensure_min_samples=min_rows(comm),
                                        dtype=(np.float64, np.float32))
                check_classification_targets(checked[1])
                return checked

            check_global_rows(X, comm)
            X, y = agree(comm, validated)
            classes = global_classes(y, comm)
        C = len(classes)
        if C < 2:
            raise ValueError(f"y holds one class only ({np.asarray(classes[0]).item()!r}): a classifier needs at "
                             "least two.")
        likelihood = self.likelihood or ("bernoulli" if C == 2 else "robustmax")
        if likelihood == "bernoulli" and C > 2:
            raise ValueError(f"likelihood='bernoulli' is for two classes, but y has {C}; use 'robustmax' or "
                             "'softmax' (or leave likelihood=None).")
        if likelihood not in ("bernoulli", "robustmax", "softmax"):
            raise ValueError(f"likelihood must be None, 'bernoulli', 'robustmax' or 'softmax', got {likelihood!r}.")
        targets = functools.partial(class_targets, classes=classes, likelihood=likelihood)
        rows = StagedRows(scan, targets) if isinstance(X, Table) else ArrayRows(X, targets(y))
        self._train(rows, comm, {"kernel": self.kernel, "likelihood": likelihood,
                                 "n_classes": None if likelihood == "bernoulli" else C}, {"classes_": classes})
        return self

    def _training_rows(self, X, y) -> tuple[np.ndarray, np.ndarray]:
        X, y = validate_data(self, as_numpy(X), as_numpy(y), reset=False, dtype=np.float64)
        unseen = sorted(set(np.unique(y).tolist()) - set(self.classes_.tolist()))
        if unseen:
            raise ValueError(f"y holds labels the classifier was not fitted on: {unseen[:5]}.")
        likelihood = "bernoulli" if self.model_options_.get("n_classes") is None else "multiclass"
        return X, class_targets(y, self.classes_, likelihood)

    @torch.no_grad()
    def predict_proba(self, X):
        """Predictive class probabilities (n*, C), columns in the order of ``classes_``."""
        if isinstance(X, Table):
            return self._by_block(X, self.predict_proba)
        means_f, variances_f = self._latent_mixture(X)  # the mean of the components' probabilities
        S = means_f.shape[0]  # the likelihood takes rows [S n*(, C)]
        p = self.model_.likelihood.probability(means_f.flatten(0, 1), variances_f.flatten(0, 1))
        p = p.reshape(S, -1, *p.shape[1:]).mean(0).double().cpu().numpy()
        return np.stack([1 - p, p], axis=1) if p.ndim == 1 else p

    def predict(self, X):
        """The most probable class (n*,) of each row."""
        most_probable = self.predict_proba(X).argmax(axis=1)  # first: it checks that the model is fitted
        return self.classes_[most_probable]

    def score(self, X, y, sample_weight=None):
        """Accuracy of ``predict(X)`` against y, scikit-learn's score for classifiers. It sees only the most probable
        class: for the probabilities, score ``predict_proba`` (e.g. with ``sklearn.metrics.log_loss``)."""
        return super().score(X, y, sample_weight=sample_weight)

    def _header(self) -> dict:
        return {"classes": self.classes_.tolist()}

    def _restore_header(self, header: dict) -> None:
        self.classes_ = np.asarray(header["classes"])


def global_classes(y: np.ndarray, comm: Comm) -> np.ndarray:
    """The sorted labels of every process's y."""
    classes = np.unique(y)
    if comm.world_size == 1:
        return classes
    if np.issubdtype(classes.dtype, np.number):
        return np.unique(comm.all_gather(torch.as_tensor(classes, dtype=torch.float64)).numpy()).astype(classes.dtype)
    # labels of any other kind travel as one line of JSON per process
    line = torch.tensor(list(json.dumps([str(c) for c in classes]).encode("utf-8") + b"\n"), dtype=torch.uint8)
    lines = bytes(comm.all_gather(line).tolist()).decode("utf-8").splitlines()
    return np.unique(np.asarray([label for text in lines for label in json.loads(text)]))


def check_labels(y) -> None:
    """Refuse a missing label (None or NaN), which no class can stand for."""
    if y is None:  # no labels at all: validate_data says so in scikit-learn's words
        return
    values = np.asarray(y).ravel().tolist()
    missing = np.asarray([v is None or (isinstance(v, float) and math.isnan(v)) for v in values])
    if missing.any():
        raise ValueError(f"y holds {int(missing.sum())} missing label(s) (None or NaN), the first at row "
                         f"{int(missing.argmax())}: drop those rows or give them a class.")


def class_targets(y: np.ndarray, classes: np.ndarray, likelihood: str) -> np.ndarray:
    """The model's targets for labels y: class indices into ``classes``, or -1 / +1 for probit's two classes."""
    codes = np.searchsorted(classes, y).astype(np.float64)
    return 2 * codes - 1 if likelihood == "bernoulli" else codes

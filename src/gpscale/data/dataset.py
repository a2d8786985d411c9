"""A train/test split of a data set, scaled with its training statistics."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..scaling import fit_scaling

_UNSTANDARDISED_X = ("geo", "images")  # inputs already on a natural scale (unit vectors, pixel intensities)


@dataclass
class Dataset:
    """A train/test split, scaled with training statistics.

    ``X_train`` [n, d], ``y_train`` [n], ``X_test`` [n*, d], ``y_test`` [n*] are float64 and scaled:
    X = (X_raw - x_mean) / x_std and y = (y_raw - y_mean) / y_std, with ``x_mean``, ``x_std`` [d] and the scalars
    ``y_mean``, ``y_std`` computed on the training rows only (a zero std is replaced by 1, so constant columns
    become 0). With ``x_scaling='minmax'`` (see :func:`load_dataset`) ``x_mean`` and ``x_std`` are instead the
    training midrange and half-range of each column, so that the training inputs span [-1, 1]; with ``'none'``
    they are 0 and 1. Multiply an RMSE by ``y_std`` to report it in original units. ``source`` is the file read,
    or ``"generated"``.
    """

    name: str
    X_train: np.ndarray = field(repr=False)
    y_train: np.ndarray = field(repr=False)
    X_test: np.ndarray = field(repr=False)
    y_test: np.ndarray = field(repr=False)
    x_mean: np.ndarray = field(repr=False)
    x_std: np.ndarray = field(repr=False)
    y_mean: float
    y_std: float
    split: int
    source: str
    x_scaling: str = "standard"  # how X was scaled (gpscale.scaling.SCALINGS)
    standardize_y: bool = True
    kind: str = "generated"  # the file's kind ("uci", "geo", "images", ...), which decides the default x_scaling

    def rescaled(self, x_scaling: str | None = None, standardize_y: bool = True) -> Dataset:
        """This split, held unscaled (``x_scaling='none'``, ``standardize_y=False``), scaled with its training
        statistics as :func:`load_dataset` scales it (``x_scaling=None``: the kind's default), to the bit."""
        if self.x_scaling != "none" or self.standardize_y:
            raise ValueError(f"{self.name} is scaled already (x_scaling={self.x_scaling!r}, standardize_y="
                             f"{self.standardize_y}); load it with x_scaling='none', standardize_y=False to rescale.")
        if x_scaling is None:
            x_scaling = "none" if self.kind in _UNSTANDARDISED_X else "standard"
        x = fit_scaling(self.X_train, x_scaling)
        y = fit_scaling(self.y_train, "standard" if standardize_y else "none")
        return Dataset(self.name, x.apply(self.X_train), y.apply(self.y_train), x.apply(self.X_test),
                       y.apply(self.y_test), x.shift, x.scale, float(y.shift), float(y.scale), self.split, self.source,
                       x_scaling, standardize_y, self.kind)

    @property
    def n_train(self) -> int:
        return self.X_train.shape[0]

    @property
    def n_test(self) -> int:
        return self.X_test.shape[0]

    @property
    def d(self) -> int:
        return self.X_train.shape[1]

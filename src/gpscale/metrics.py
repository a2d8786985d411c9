"""Predictive metrics for regression: accuracy (rmse, mae) and probabilistic quality (nlpd, msll, coverage,
calibration).

Every function takes 1-D numpy arrays or torch tensors of equal length N (any float dtype; computed in float64)
and returns a Python float. ``var`` is always the predictive variance of y, noise included, so that
N(mean, var) is the predictive distribution of the observed target.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.stats import norm

DEFAULT_LEVELS = np.linspace(0.05, 0.95, 19)


def _as_array(x, name: str) -> np.ndarray:
    """Convert a numpy array, torch tensor or sequence to a finite float64 array of shape [N]."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().to(torch.float64).numpy()
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {x.shape}; pass a flat array (e.g. {name}.ravel()).")
    if x.size == 0:
        raise ValueError(f"{name} is empty.")
    if not np.isfinite(x).all():
        raise ValueError(f"{name} contains {int((~np.isfinite(x)).sum())} non-finite values (NaN or inf).")
    return x


def _validate(y, mean, var=None) -> tuple[np.ndarray, ...]:
    """Return (y, mean) or (y, mean, var) as float64 arrays [N], checking lengths and var > 0."""
    arrays = {"y": _as_array(y, "y"), "mean": _as_array(mean, "mean")}
    if var is not None:
        arrays["var"] = _as_array(var, "var")
        if (arrays["var"] <= 0).any():
            raise ValueError(
                f"var must be > 0 everywhere, got min {arrays['var'].min():.3g}; pass the predictive variance "
                "of y (latent variance plus noise)."
            )
    lengths = {name: a.shape[0] for name, a in arrays.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"inputs must have equal length, got {lengths}.")
    return tuple(arrays.values())


def _check_level(level: float) -> None:
    if not 0.0 < level < 1.0:
        raise ValueError(f"coverage levels must lie in (0, 1), got {level}.")


def rmse(y, mean) -> float:
    """Root mean squared error, sqrt(1/N sum_i (y_i - mean_i)^2)."""
    y, mean = _validate(y, mean)
    return float(np.sqrt(np.mean((y - mean) ** 2)))


def mae(y, mean) -> float:
    """Mean absolute error, 1/N sum_i |y_i - mean_i|."""
    y, mean = _validate(y, mean)
    return float(np.mean(np.abs(y - mean)))


def nlpd(y, mean, var) -> float:
    """Mean negative log predictive density of y under N(mean, var):

        1/N sum_i [ 1/2 log(2 pi var_i) + (y_i - mean_i)^2 / (2 var_i) ].
    """
    y, mean, var = _validate(y, mean, var)
    return float(np.mean(0.5 * np.log(2 * math.pi * var) + 0.5 * (y - mean) ** 2 / var))


def msll(y, mean, var, y_train_mean: float, y_train_var: float) -> float:
    """Mean standardised log loss (Rasmussen & Williams 2006, eq. 2.34 and Sec. 2.5):

        1/N sum_i [ -log N(y_i | mean_i, var_i) + log N(y_i | y_train_mean, y_train_var) ],

    i.e. the NLPD minus that of the trivial model predicting the training mean and variance for every point.
    Negative is better than the trivial model; 0 means no better.
    """
    y, mean, var = _validate(y, mean, var)
    if not (math.isfinite(y_train_var) and y_train_var > 0):
        raise ValueError(f"y_train_var must be finite and > 0, got {y_train_var}.")
    if not math.isfinite(y_train_mean):
        raise ValueError(f"y_train_mean must be finite, got {y_train_mean}.")
    trivial = np.full_like(y, float(y_train_mean))
    return nlpd(y, mean, var) - nlpd(y, trivial, np.full_like(y, float(y_train_var)))


def coverage_curve(y, mean, var, levels=None) -> tuple[np.ndarray, np.ndarray]:
    """Empirical coverage of the central intervals of N(mean, var) at each nominal level.

    The central ``level`` interval is mean_i ± z sqrt(var_i) with z = Phi^-1((1 + level) / 2); its empirical
    coverage is the fraction of points with |y_i - mean_i| / sqrt(var_i) <= z.

    Returns:
        (levels [L], empirical [L]); ``levels`` defaults to 0.05, 0.10, ..., 0.95.
    """
    y, mean, var = _validate(y, mean, var)
    levels = DEFAULT_LEVELS if levels is None else np.atleast_1d(np.asarray(levels, dtype=np.float64))
    for level in levels:
        _check_level(level)
    z = norm.ppf(0.5 + levels / 2)  # [L]
    abs_scores = np.sort(np.abs(y - mean) / np.sqrt(var))  # [N]
    empirical = np.searchsorted(abs_scores, z, side="right") / y.shape[0]
    return levels.copy(), empirical


def coverage(y, mean, var, level: float = 0.95) -> float:
    """Fraction of y_i inside the central ``level`` interval of N(mean_i, var_i) (0.95 for calibrated
    Gaussian predictions at the default level)."""
    _check_level(level)
    return float(coverage_curve(y, mean, var, [level])[1][0])


def calibration_error(y, mean, var, levels=None) -> float:
    """Mean absolute gap between nominal and empirical coverage, 1/L sum_l |level_l - coverage_l|, over
    ``levels`` (default 0.05, 0.10, ..., 0.95). 0 for perfectly calibrated predictions."""
    levels, empirical = coverage_curve(y, mean, var, levels)
    return float(np.mean(np.abs(empirical - levels)))

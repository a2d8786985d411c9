import math

import numpy as np
import pytest
import torch
from scipy.stats import norm

from gpscale import metrics


@pytest.fixture
def calibrated():
    """Predictions whose Gaussian predictive is exactly the law of y: (y, mean, var), n = 20000."""
    rng = np.random.default_rng(0)
    n = 20000
    mean = rng.normal(size=n)
    var = rng.uniform(0.1, 2.0, size=n)
    return mean + np.sqrt(var) * rng.standard_normal(n), mean, var


def test_rmse_and_mae_by_hand():
    y, mean = [1.0, 2.0, 3.0], [1.0, 1.0, 5.0]
    assert metrics.rmse(y, mean) == pytest.approx(math.sqrt(5 / 3), rel=1e-14)
    assert metrics.mae(y, mean) == pytest.approx(1.0, rel=1e-14)


def test_torch_and_numpy_give_the_same_python_float():
    y, mean, var = np.array([0.3, -1.2, 2.0]), np.array([0.0, -1.0, 1.5]), np.array([0.5, 0.2, 1.0])
    as_torch = [torch.tensor(a, dtype=torch.float32, requires_grad=True) for a in (y, mean, var)]
    for name in ("rmse", "mae"):
        value = getattr(metrics, name)(*as_torch[:2])
        assert type(value) is float
        assert value == pytest.approx(getattr(metrics, name)(y, mean), rel=1e-6)
    assert metrics.nlpd(*as_torch) == pytest.approx(metrics.nlpd(y, mean, var), rel=1e-6)


def test_nlpd_matches_scipy_logpdf():
    rng = np.random.default_rng(1)
    y, mean, var = rng.normal(size=50), rng.normal(size=50), rng.uniform(0.01, 3.0, size=50)
    expected = -np.mean(norm.logpdf(y, loc=mean, scale=np.sqrt(var)))
    assert metrics.nlpd(y, mean, var) == pytest.approx(expected, rel=1e-12)


def test_msll_is_nlpd_relative_to_the_trivial_model():
    rng = np.random.default_rng(2)
    y, mean, var = rng.normal(size=40), rng.normal(size=40), rng.uniform(0.1, 2.0, size=40)
    trivial = -np.mean(norm.logpdf(y, loc=0.5, scale=math.sqrt(1.7)))
    expected = -np.mean(norm.logpdf(y, loc=mean, scale=np.sqrt(var))) - trivial
    assert metrics.msll(y, mean, var, 0.5, 1.7) == pytest.approx(expected, rel=1e-12)
    assert metrics.msll(y, np.full(40, 0.5), np.full(40, 1.7), 0.5, 1.7) == pytest.approx(0.0, abs=1e-14)


def test_coverage_by_hand():
    # z(0.95) = 1.95996: |y - mean| / std = 0, 1.5, 3 -> two of three inside.
    assert metrics.coverage([0.0, 1.5, 3.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]) == pytest.approx(2 / 3)
    # the same residuals with var = 4 are all inside
    assert metrics.coverage([0.0, 1.5, 3.0], [0.0, 0.0, 0.0], [4.0, 4.0, 4.0]) == 1.0


def test_coverage_of_exact_gaussian_predictions(calibrated):
    y, mean, var = calibrated
    assert metrics.coverage(y, mean, var) == pytest.approx(0.95, abs=0.01)
    assert metrics.coverage(y, mean, var, level=0.5) == pytest.approx(0.5, abs=0.015)
    assert metrics.coverage(y, mean, var / 4) < 0.7  # overconfident


def test_calibration_error_small_when_calibrated_large_when_overconfident(calibrated):
    y, mean, var = calibrated
    assert metrics.calibration_error(y, mean, var) < 0.01
    assert metrics.calibration_error(y, mean, var / 10) > 0.2
    assert metrics.calibration_error(y, mean, var * 10) > 0.2  # underconfident is miscalibrated too


def test_coverage_curve_levels_and_monotone(calibrated):
    y, mean, var = calibrated
    levels, empirical = metrics.coverage_curve(y, mean, var, levels=[0.2, 0.5, 0.8])
    np.testing.assert_allclose(levels, [0.2, 0.5, 0.8])
    np.testing.assert_allclose(empirical, levels, atol=0.015)
    levels, empirical = metrics.coverage_curve(y, mean, var / 4)
    assert levels.shape == empirical.shape == (19,)
    assert np.all(np.diff(empirical) >= 0) and np.all(empirical < levels)


@pytest.mark.parametrize(
    "args, match",
    [
        (([1.0, 2.0], [1.0]), "equal length"),
        ((np.ones((3, 1)), np.ones(3)), "1-D"),
        (([], []), "empty"),
        (([1.0, np.nan], [1.0, 2.0]), "non-finite"),
    ],
)
def test_bad_inputs_raise(args, match):
    with pytest.raises(ValueError, match=match):
        metrics.rmse(*args)


@pytest.mark.parametrize("bad_var", [[1.0, 0.0], [1.0, -1.0], [1.0, np.inf], [1.0, np.nan]])
def test_nonpositive_or_nonfinite_variance_raises(bad_var):
    with pytest.raises(ValueError, match="var"):
        metrics.nlpd([0.0, 0.0], [0.0, 0.0], bad_var)


def test_bad_level_and_train_variance_raise():
    with pytest.raises(ValueError, match="levels"):
        metrics.coverage([0.0], [0.0], [1.0], level=1.0)
    with pytest.raises(ValueError, match="y_train_var"):
        metrics.msll([0.0], [0.0], [1.0], 0.0, 0.0)

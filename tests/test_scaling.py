"""Scaling with training statistics (gpscale.scaling), shared by the loaders, the estimators and the benchmark."""
import os
import warnings

import numpy as np
import pytest
import torch

from gpscale import GPRegressor
from gpscale.distributed import LocalComm
from gpscale.scaling import OutlierWarning, fit_scaling, warn_outlying_targets


def test_standard_scaling_z_scores_with_training_statistics_and_guards_constant_columns():
    s = fit_scaling([[1.0, 5.0], [3.0, 5.0]], "standard")
    np.testing.assert_array_equal(s.shift, [2.0, 5.0])
    np.testing.assert_array_equal(s.scale, [1.0, 1.0])  # second column guarded
    np.testing.assert_array_equal(s.apply([[1.0, 5.0], [3.0, 5.0]]), [[-1.0, 0.0], [1.0, 0.0]])
    np.testing.assert_array_equal(s.apply([[5.0, 6.0]]), [[3.0, 1.0]])
    np.testing.assert_array_equal(s.undo([[3.0, 1.0]]), [[5.0, 6.0]])


def test_minmax_scaling_maps_the_training_rows_onto_minus_one_one():
    s = fit_scaling([[1.0, 5.0], [3.0, 5.0], [2.0, 5.0]], "minmax")
    np.testing.assert_array_equal(s.shift, [2.0, 5.0])
    np.testing.assert_array_equal(s.scale, [1.0, 1.0])  # second column guarded
    np.testing.assert_array_equal(s.apply([[1.0, 5.0], [3.0, 5.0], [2.0, 5.0]]),
                                  [[-1.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    np.testing.assert_array_equal(s.apply([[5.0, 6.0]]), [[3.0, 1.0]])


def test_scales_other_than_one_are_divided_out():
    A = np.array([[0.0, 10.0], [4.0, 30.0], [8.0, 20.0]])
    s = fit_scaling(A, "standard")
    np.testing.assert_allclose(s.scale, [np.sqrt(32 / 3), np.sqrt(200 / 3)])
    np.testing.assert_allclose(s.apply(A).std(0), 1.0)
    m = fit_scaling(A, "minmax")
    np.testing.assert_array_equal(m.shift, [4.0, 20.0])
    np.testing.assert_array_equal(m.scale, [4.0, 10.0])
    np.testing.assert_array_equal(m.apply(A), [[-1.0, -1.0], [0.0, 1.0], [1.0, 0.0]])
    np.testing.assert_allclose(m.undo(m.apply(A)), A)


def test_center_scaling_subtracts_the_column_means_and_keeps_the_units():
    A = np.array([[0.0, 10.0], [4.0, 30.0], [8.0, 20.0]])
    c = fit_scaling(A, "center")
    np.testing.assert_array_equal(c.shift, [4.0, 20.0])
    np.testing.assert_array_equal(c.scale, [1.0, 1.0])
    np.testing.assert_array_equal(c.apply(A), A - [4.0, 20.0])
    np.testing.assert_array_equal(c.undo(c.apply(A)), A)


def test_targets_and_no_scaling():
    y = fit_scaling([1.0, 2.0, 3.0, 6.0], "standard")
    assert y.shift == pytest.approx(3.0) and y.scale == pytest.approx(np.sqrt(3.5))
    none = fit_scaling([[4.0, -2.0]], "none")
    np.testing.assert_array_equal(none.apply([[4.0, -2.0]]), [[4.0, -2.0]])
    with pytest.raises(ValueError, match="A scaling must be one of 'standard', 'minmax', 'center', 'none', got 'unit'"):
        fit_scaling([[1.0]], "unit")


def _silent(y):
    with warnings.catch_warnings():
        warnings.simplefilter("error", OutlierWarning)
        warn_outlying_targets(y)


def test_a_fit_on_targets_with_a_value_of_a_billion_warns_naming_its_row_and_value():
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, (4000, 2))
    y = rng.standard_normal(4000)
    y[1234] = 1e9
    with pytest.warns(OutlierWarning, match=r"^1 target lies over 1000 robust standard deviations from the median "
                                            r"of y \(y\[1234\] = 1e\+09\): .* Check those rows; remove them, or "
                                            r"transform y"):
        GPRegressor(method="sgpr", n_inducing=10, epochs=1, progress=False).fit(X, y)


def test_the_warning_counts_every_outlying_row_and_names_five():
    y = np.random.default_rng(1).standard_normal(1000)
    rows = [3, 50, 51, 400, 700, 998, 999]
    y[rows] = -1e6
    with pytest.warns(OutlierWarning, match=r"^7 targets lie .* \(y\[3\] = -1e\+06, y\[50\] = -1e\+06, "
                                            r"y\[51\] = -1e\+06, y\[400\] = -1e\+06, y\[700\] = -1e\+06, "
                                            r"\.\.\.\)"):
        warn_outlying_targets(y)


def test_under_data_parallelism_the_warning_names_global_rows():
    class SecondOfTwo(LocalComm):  # the first process holds 500 rows
        rank, world_size = 1, 2

        def all_gather(self, tensor):
            return torch.cat([torch.tensor([500]), tensor])

    y = np.random.default_rng(2).standard_normal(300)
    y[3] = 1e9
    with pytest.warns(OutlierWarning, match=r"\(y\[503\] = 1e\+09\)"):
        warn_outlying_targets(y, SecondOfTwo())


@pytest.mark.parametrize("seed", range(5))
def test_ordinary_targets_even_heavy_tailed_or_mostly_one_value_give_no_warning(seed):
    rng = np.random.default_rng(seed)
    _silent(rng.standard_normal(4000))
    _silent(rng.standard_t(3, 10**5))
    _silent(np.where(rng.uniform(size=10**4) < 0.8, 0.0, rng.exponential(size=10**4)))  # zero-inflated
    _silent(np.full(10, 3.0))
    _silent([0.0, 1e9])  # two values: neither is the outlier


@pytest.mark.skipif(not os.environ.get("GPSCALE_DATA"), reason="GPSCALE_DATA not set")
@pytest.mark.parametrize("name", ["pol", "solar", "forest", "elevators", "uci_pbp/yacht", "etopo"])
def test_the_targets_of_benchmark_data_sets_give_no_warning(name):
    from gpscale.data import load_dataset

    try:
        data = load_dataset(name, standardize_y=False)
    except FileNotFoundError:
        pytest.skip(f"{name} is not in $GPSCALE_DATA")
    _silent(np.concatenate([data.y_train, data.y_test]))

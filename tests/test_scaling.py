"""Scaling with training statistics (gpscale.scaling), shared by the loaders, the estimators and the benchmark."""
import numpy as np
import pytest

from gpscale.scaling import fit_scaling


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

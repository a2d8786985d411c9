"""The HVGP paper's figures (experiments.hvgp_figures) at tiny sizes: the files are written and the numbers they
record obey the decomposition (spec hkd.md §2.4-2.5, checks 3, 4, 6 and 7) and its consequences."""
import json

import pytest
import torch

from experiments.hvgp_figures import (QUARTER_TURN, _projection_covariance_errors, orbit_indices, symmetric_grid,
                                        toy_parts, toy_function)
from experiments.figures import main
from gpscale.kernels import RBF
from gpscale.kernels.harmonic import Negation, OrthogonalAction, harmonic_kernels

PNG = b"\x89PNG\r\n\x1a\n"

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_sub_process_figure_records_an_exact_decomposition(tmp_path):
    main(["hvgp-samples", "--out", str(tmp_path), "--grid-size", "14"])
    assert (tmp_path / "hvgp_samples.png").read_bytes()[:8] == PNG
    record = json.loads((tmp_path / "hvgp_samples.json").read_text())
    assert record["settings"]["grid_size"] == 14 and record["n_points"] == 196
    checks = record["checks"]
    for name in ("sum_of_sub_processes", "f0_invariance", "f1_half_turn_sign", "f2_quarter_turn_sign",
                 "sum_of_sub_kernels", "sub_kernel_asymmetry"):
        assert checks[name] < 1e-10, name
    assert checks["projection_covariance"]["within"] < 1e-10  # Cov(f_t, f_t) = K_t
    assert checks["projection_covariance"]["across"] < 1e-10  # Cov(f_t, f_t') = 0
    assert min(checks["min_eigenvalue_over_max"]) > -1e-10  # every K_t is PSD
    assert sum(checks["rank_at_1e-10"]) > 0
    # the jitter (1e-8) breaks the symmetries of the direct draws by about its square root, no more
    assert max(checks["direct_draws"].values()) < 1e-2


def test_the_covariance_check_fails_for_a_kernel_the_group_does_not_leave_invariant():
    X = symmetric_grid(8, 2.0)
    action = OrthogonalAction(QUARTER_TURN, 4)
    perm = orbit_indices(action, X)
    kernel = RBF(2, ard=True, lengthscale=0.5).double()
    with torch.no_grad():
        kernel.raw_lengthscale[0] += 1.0  # unequal lengthscales: k(Gx, Gx') != k(x, x')
        errors = _projection_covariance_errors(kernel(X, X), perm, action.weights(), torch.arange(len(X)),
                                               harmonic_kernels(kernel, action, X, X))
    assert errors["within"] > 1e-3 and errors["across"] > 1e-3


def test_the_grid_is_closed_under_quarter_turns_and_an_open_set_is_refused():
    X = symmetric_grid(5, 1.0)
    perm = orbit_indices(OrthogonalAction(QUARTER_TURN, 4), X)
    assert perm.shape == (4, 25) and torch.equal(perm[0], torch.arange(25))
    assert sorted(perm[1].tolist()) == list(range(25))  # a permutation
    with pytest.raises(ValueError, match="not closed"):
        orbit_indices(Negation(), X + 0.1)


def test_the_toy_parts_are_the_even_and_odd_parts():
    x = torch.linspace(-3, 3, 61, dtype=torch.float64)
    even, odd = toy_parts(x)
    torch.testing.assert_close(even + odd, toy_function(x))
    torch.testing.assert_close(even, even.flip(0))
    torch.testing.assert_close(odd, -odd.flip(0))


def test_the_toy_figure_splits_hvgp_into_an_even_and_an_odd_sub_gp(tmp_path):
    main(["hvgp-toy", "--out", str(tmp_path), "--n-train", "120", "--epochs", "400"])
    assert (tmp_path / "hvgp_toy.png").read_bytes()[:8] == PNG
    record = json.loads((tmp_path / "hvgp_toy.json").read_text())
    assert set(record["results"]) == {"hvgp 2x5", "svgp 5", "svgp 10"}
    assert all(value < 1e-10 for value in record["checks"].values()), record["checks"]
    r = record["results"]
    # 2 x 5 sub-GP inducing inputs carry the orbit's 10 points: no worse than SVGP with 5, close to SVGP with 10
    assert r["hvgp 2x5"]["rmse_f"] <= r["svgp 5"]["rmse_f"]
    assert r["hvgp 2x5"]["rmse_f"] < 0.1 and r["hvgp 2x5"]["nlpd"] < r["svgp 5"]["nlpd"]
    assert record["hvgp_parts"]["even_part_rmse"] < 0.1 and record["hvgp_parts"]["odd_part_rmse"] < 0.1


def test_the_nystrom_figure_orders_the_methods_and_skips_missing_data(tmp_path, monkeypatch):
    monkeypatch.delenv("GPSCALE_DATA", raising=False)
    main(["hvgp-nystrom", "--out", str(tmp_path), "--n", "400", "--inducing", "4,8,16",
          "--datasets", "synthetic,kin40k"])
    assert (tmp_path / "hvgp_nystrom.png").read_bytes()[:8] == PNG
    record = json.loads((tmp_path / "hvgp_nystrom.json").read_text())
    assert record["skipped (no data file)"] == ["kin40k"]
    r = record["results"]["synthetic"]
    errors = r["relative_trace_error"]
    assert set(errors) == {"svgp M", "svgp 2M", "svgp 8M", "hvgp 8xM, PCA negation", "hvgp 8xM, axis negation"}
    for name, values in errors.items():
        assert all(0 < e < 1 for e in values), name
        assert all(a > b for a, b in zip(values, values[1:])), name  # more inducing points, smaller error
    for hvgp in ("hvgp 8xM, PCA negation", "hvgp 8xM, axis negation"):
        # every block starts from SVGP M's k-means centres Z, and the blocks span f(G^s Z) for all s, f(Z) included
        assert all(h < s for h, s in zip(errors[hvgp], errors["svgp M"])), hvgp
    # the inputs' distribution is invariant to the PCA negations, not to the axis negations
    assert r["covariance_change"]["PCA negation"] < 1e-10 < 0.1 < r["covariance_change"]["axis negation"]

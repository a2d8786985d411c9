"""The GP-GRIEF paper's Fig. 2 (experiments.grief_figures): the rank-p factors and the optimal error are what they
claim, and ``python -m experiments.figures grief`` at a tiny size writes a figure whose GRIEF curve falls with p,
lies below random Fourier features and above the optimal rank-p curve."""
import json
import math

import numpy as np
import pytest
import torch

from experiments.grief_figures import (METHODS, figure2, grief_factor, nystrom_factor, optimal_errors, rff_factor,
                                         relative_errors, sample_inputs, se_kernel)
from experiments.figures import main

PNG = b"\x89PNG\r\n\x1a\n"

pytestmark = pytest.mark.usefixtures("one_thread")


def test_inputs_are_uniform_with_unit_variance():
    X = sample_inputs(20_000, 3, torch.Generator().manual_seed(0))
    assert X.shape == (20_000, 3) and X.dtype == torch.float64
    assert X.abs().max() <= math.sqrt(3) and X.var(0).numpy() == pytest.approx(np.ones(3), abs=0.03)


def test_optimal_error_is_the_truncated_eigendecomposition():
    A = torch.randn(30, 30, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    K = A @ A.T
    lam, V = torch.linalg.eigh(K)
    for p, error in zip((1, 5, 29), optimal_errors(K, (1, 5, 29))):
        top = V[:, -p:] * lam[-p:].sqrt()  # the best rank-p factor
        assert error == pytest.approx(relative_errors(K, top, 30)[1], rel=1e-9)


def test_nystrom_on_all_points_and_many_features_recover_the_kernel():
    generator = torch.Generator().manual_seed(2)
    X = sample_inputs(40, 2, generator)
    K = se_kernel(X, X, 1.5)
    assert K.diagonal().numpy() == pytest.approx(np.ones(40))
    assert relative_errors(K, nystrom_factor(X, X, 1.5), 40)[1] < 1e-6  # Z = X: K_XX K_XX^+ K_XX = K_XX
    assert relative_errors(K, rff_factor(X, 20_000, 1.5, generator), 40)[1] < 0.03  # Monte Carlo: error ~ 1/sqrt(p)


def test_grief_features_are_nested_in_p_and_dominated_by_the_kernel():
    X = sample_inputs(60, 3, torch.Generator().manual_seed(3))
    Phi = grief_factor(X[:30], X, 40, grid_size=6, lengthscale=1.7)
    assert Phi.shape == (60, 40)
    torch.testing.assert_close(grief_factor(X[:30], X, 12, grid_size=6, lengthscale=1.7), Phi[:, :12])
    gap = se_kernel(X, X, 1.7) - Phi @ Phi.T  # Nyström: K - Phi Phi^T is PSD, on test points too
    assert torch.linalg.eigvalsh(gap).min() > -1e-8


def test_cli_writes_the_figure_and_its_numbers_at_a_tiny_size(tmp_path, capsys):
    ps = (2, 5, 10, 20, 40)
    assert main(["grief", "--out", str(tmp_path), "--n", "120", "--d", "3", "--repeats", "2",
                 "--p", ",".join(map(str, ps)), "--grid-size", "6"]) == 0
    assert "grief_fig2_reconstruction.png" in capsys.readouterr().out
    assert (tmp_path / "grief_fig2_reconstruction.png").read_bytes().startswith(PNG)
    result = json.loads((tmp_path / "grief_fig2_reconstruction.json").read_text())
    settings = result["settings"]
    assert settings["p"] == list(ps) and settings["lengthscale"] == pytest.approx(math.sqrt(3))
    assert (settings["n"], settings["n_train"], settings["d"], settings["repeats"]) == (120, 60, 3, 2)
    for target in ("train", "joint"):
        errors = {m: np.array(result["errors"][target][m]["repeats"]) for m in METHODS}  # [repeats, p]
        assert all(e.shape == (2, len(ps)) for e in errors.values())
        grief = errors["grief"]
        assert (np.diff(grief, axis=1) <= 1e-12).all(), target  # non-increasing in p, every repeat
        assert (grief < errors["rff"]).all(), target
        for method in ("grief", "rff", "nystrom"):  # no rank-p approximation beats the optimal one
            assert (errors["optimal"] <= errors[method] + 1e-12).all(), (target, method)
        mean = np.array(result["errors"][target]["grief"]["mean"])
        assert mean == pytest.approx(grief.mean(0))


def test_bad_settings_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="every p in 1..n/2"):
        figure2(tmp_path, n=40, d=2, repeats=1, ps=(5, 30))
    with pytest.raises(ValueError, match="repeats >= 1"):
        figure2(tmp_path, n=40, d=2, repeats=0, ps=(5,))


def test_the_figures_command_needs_a_known_figure(capsys):
    assert main([]) == 2  # no figure named: the help
    assert "figures" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # argparse: invalid choice
        main(["nope"])
    assert "invalid choice: 'nope'" in capsys.readouterr().err

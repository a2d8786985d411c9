"""The Deep Basis Kernel paper's 1-D synthetic figures (experiments.dbk_figures): the data are the paper's, the
spectrum summary measures what it says, and ``python -m experiments.figures dbk`` writes every file with tiny
settings."""
import json

import numpy as np
import pytest
import torch

from experiments.dbk_figures import (MODELS, Training, build_model, make_step_data, spectrum_summary,
                                       step_function)
from experiments.figures import main

PNG = b"\x89PNG\r\n\x1a\n"


pytestmark = pytest.mark.usefixtures("one_thread")


def test_step_function_has_the_papers_plateaus_and_oscillation():
    x = torch.tensor([-0.8, -0.3, 0.2, 0.7], dtype=torch.float64)
    steps = torch.tensor([0.3, 0.9, -0.6, 0.0], dtype=torch.float64)
    oscillation = 0.01 * torch.sin(50 * torch.sin(10 * x))
    torch.testing.assert_close(step_function(x), steps + oscillation, rtol=0, atol=1e-12)
    assert step_function(torch.tensor([0.0], dtype=torch.float64)).item() == pytest.approx(0.15, abs=0.011)


def test_step_data_are_uniform_with_noise_variance_one_hundredth_and_seeded():
    x, y, x_test, y_test = make_step_data(20_000, seed=3, n_test=500)
    assert x.shape == (20_000, 1) and y.shape == (20_000,) and x_test.shape == (500, 1) and y_test.shape == (500,)
    assert x.min() >= -1 and x.max() <= 1 and abs(x.mean().item()) < 0.02
    residual = y - step_function(x[:, 0])
    assert residual.var().item() == pytest.approx(0.01, rel=0.05)
    again = make_step_data(20_000, seed=3, n_test=500)
    assert torch.equal(again[0], x) and torch.equal(again[3], y_test)
    assert not torch.equal(make_step_data(20_000, seed=4, n_test=500)[0], x)


def test_spectrum_summary_counts_the_effective_rank():
    rng = np.random.default_rng(0)
    collapsed = np.outer(rng.normal(size=50), rng.normal(size=6))  # rank 1: Theorem 1's kernel f f^T
    summary = spectrum_summary(collapsed)
    assert summary["top_share"] == pytest.approx(1.0) and summary["effective_rank"] == pytest.approx(1.0)
    Q, _ = np.linalg.qr(rng.normal(size=(50, 6)))  # orthonormal columns: six equal eigenvalues
    summary = spectrum_summary(Q)
    assert summary["effective_rank"] == pytest.approx(6.0) and summary["top_share"] == pytest.approx(1 / 6)
    np.testing.assert_allclose(summary["eigenvalues"], np.full(6, 1 / 50))


def test_models_have_the_papers_initialisation():
    training = Training(n_basis=8, width=16)
    gp, uncorrected, corrected = (build_model(name, training) for name in MODELS)
    for model in (gp, uncorrected, corrected):
        assert model.noise.item() == pytest.approx(1e-2, rel=1e-6) and model.likelihood.noise_floor == 1e-6
    assert gp.key == "exact" and gp.kernel.lengthscale.item() == pytest.approx(1.0)  # sqrt(d), d = 1
    assert corrected.correction and not uncorrected.correction and corrected.n_basis == 8
    assert not corrected.kernel.scale_basis  # the paper's: no 1/sqrt(r) unless asked for
    assert all(build_model(name, Training(n_basis=8, width=16, scale_basis=True)).kernel.scale_basis
               for name in ("dbk", "dbk-c"))
    with pytest.raises(ValueError, match="iterations to be a positive integer"):
        Training(iterations=0)


def test_cli_writes_both_figures_with_tiny_settings(tmp_path, capsys):
    out = tmp_path / "figures"
    argv = ["dbk", "--out", str(out), "--n", "40", "--sizes", "30,60", "--seeds", "2", "--n-test", "25",
            "--exact-max-n", "30", "--iterations", "3", "--n-basis", "4", "--width", "8"]
    assert main(argv) == 0
    files = {"dbk_fig1_posterior_kernel.png", "dbk_fig1_bases.png", "dbk_fig1_summary.json",
             "dbk_fig3_scaling.png", "dbk_fig3_scaling.json"}
    assert {p.name for p in out.iterdir()} == files
    assert all((out / name).read_bytes().startswith(PNG) for name in files if name.endswith(".png"))
    printed = capsys.readouterr().out
    assert all(f"wrote {out / name}" in printed for name in files)

    fig1 = json.loads((out / "dbk_fig1_summary.json").read_text())
    assert fig1["n"] == 40 and fig1["training"]["iterations"] == 3 and set(fig1["models"]) == set(MODELS)
    for name, row in fig1["models"].items():
        assert np.isfinite([row["rmse"], row["nlpd"]]).all() and 0 <= row["coverage"] <= 1
        assert ("spectrum" in row) == (name != "gp")
    assert len(fig1["models"]["dbk"]["spectrum"]["eigenvalues"]) == 4

    fig3 = json.loads((out / "dbk_fig3_scaling.json").read_text())
    runs = [(r["model"], r["n"], r["seed"]) for r in fig3["runs"]]
    expected = [(m, n, s) for n in (30, 60) for s in (0, 1) for m in MODELS if not (m == "gp" and n > 30)]
    assert runs == expected  # the exact GP only up to --exact-max-n
    assert all(r["status"] == "ok" and r["seconds"] > 0 for r in fig3["runs"])


def test_cli_draws_one_figure_on_request_and_rejects_bad_settings(tmp_path, capsys):
    out = tmp_path / "one"
    assert main(["dbk", "--out", str(out), "--only", "fig1", "--n", "30", "--n-test", "10",
                 "--iterations", "2", "--n-basis", "3", "--width", "4"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["dbk_fig1_bases.png", "dbk_fig1_posterior_kernel.png",
                                                     "dbk_fig1_summary.json"]
    assert main(["dbk", "--out", str(out), "--only", "fig3", "--seeds", "0"]) == 1
    assert "seeds >= 1" in capsys.readouterr().err

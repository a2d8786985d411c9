"""The ODVFF classification figure (experiments.odvff_figures) at a tiny size: both models classify the moons and
the files are written."""
import json

import pytest

from experiments.figures import main

PNG = b"\x89PNG\r\n\x1a\n"

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_banana_figure_is_drawn_with_both_models_scored(tmp_path):
    main(["odvff-banana", "--out", str(tmp_path), "--n-train", "200", "--epochs", "40",
          "--n-frequencies", "4"])
    assert (tmp_path / "odvff_banana.png").read_bytes()[:8] == PNG
    record = json.loads((tmp_path / "odvff_banana.json").read_text())
    assert record["settings"]["n_train"] == 200
    for name in ("odvff", "svgp"):
        assert record["results"][name]["test_accuracy"] > 0.85


def test_the_one_dimensional_figures_are_drawn(tmp_path):
    main(["odvff-1d", "--out", str(tmp_path), "--n-train", "200", "--repeats", "1", "--epochs", "5",
          "--betas", "11,31"])
    for name in ("odvff_fig1.png", "odvff_fig2.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG
    record = json.loads((tmp_path / "odvff_fig12.json").read_text())
    assert set(record["results"]) == {"odvff |beta|=11", "odvff |beta|=31", "vff (collapsed, 201 features)",
                                      "sgpr (m=200)"}
    assert all(r[0]["coverage"] > 0.5 and r[0]["rmse"] < 1.0 for r in record["results"].values())


def test_the_gp_draw_leaves_the_gap_empty():
    from experiments.odvff_figures import OneDSettings, gp_draw_1d

    X, y, X_test, y_test, f_test = gp_draw_1d(OneDSettings(n_train=500, n_test=50), seed=0)
    assert X.shape == (500, 1) and not ((X > 0.45) & (X < 0.55)).any()
    assert X_test.shape == (50, 1) and 0.05 < (y_test - f_test).var().item() < 0.3  # noise variance 0.15


def test_the_nonstationary_figure_is_drawn(tmp_path):
    main(["odvff-nonstationary", "--out", str(tmp_path), "--n-train", "200", "--n-test", "100",
          "--epochs", "10"])
    assert (tmp_path / "odvff_fig3.png").read_bytes()[:8] == PNG
    record = json.loads((tmp_path / "odvff_fig3.json").read_text())
    assert set(record["results"]) == {"odvff + periodic", "exact GP"}
    assert record["results"]["exact GP"]["rmse"] < 0.3

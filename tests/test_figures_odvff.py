"""The ODVFF classification figure (gpscale.bench.figures_odvff) at a tiny size: both models classify the moons and
the files are written."""
import json

import pytest

from gpscale.cli import main

PNG = b"\x89PNG\r\n\x1a\n"

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_banana_figure_is_drawn_with_both_models_scored(tmp_path):
    main(["figures", "odvff-banana", "--out", str(tmp_path), "--n-train", "200", "--epochs", "40",
          "--n-frequencies", "4"])
    assert (tmp_path / "odvff_banana.png").read_bytes()[:8] == PNG
    record = json.loads((tmp_path / "odvff_banana.json").read_text())
    assert record["settings"]["n_train"] == 200
    for name in ("odvff", "svgp"):
        assert record["results"][name]["test_accuracy"] > 0.85

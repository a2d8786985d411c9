"""What every figure module needs: matplotlib without a display, and an output folder."""
from __future__ import annotations

from pathlib import Path


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (files only), or an error that says how to install it."""
    try:
        import matplotlib
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise RuntimeError("The figures need matplotlib: pip install 'gpscale[bench]'.") from err
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def out_dir(path: str | Path) -> Path:
    """``path`` as a folder, created if missing."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    return out

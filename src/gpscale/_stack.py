"""Where a warning should point: at the user's line, however deep inside gpscale it was raised."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

__all__ = ["user_stacklevel"]

_INTERNAL = (str(Path(__file__).resolve().parent), str(Path(torch.__file__).resolve().parent))


def user_stacklevel() -> int:
    """The ``stacklevel`` for :func:`warnings.warn`, called in the function that warns, that names the first
    frame outside gpscale and torch (whose ``no_grad`` wrappers sit between a predict method and its caller)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and str(Path(frame.f_code.co_filename).resolve()).startswith(_INTERNAL):
        frame, level = frame.f_back, level + 1
    return level

"""The progress bar of training and of the benchmark's runs: redrawn in place in a terminal, a line a minute in a
log file."""
from __future__ import annotations

import math
import sys
import time

from tqdm.auto import tqdm

__all__ = ["progress_bar", "LinesPerMinute"]


def progress_bar(iterable=None, *, total: int | None = None, desc: str, unit: str, enabled: bool,
                 delay: float = 0.0) -> tqdm:
    """A tqdm bar on stderr, shown once ``delay`` seconds have passed. In a terminal it redraws in place; written to
    a file (a long run's log) it writes one plain line at most once a minute, so that the log shows how far the run
    has got."""
    if sys.stderr.isatty():
        return tqdm(iterable, total=total, desc=desc, unit=unit, leave=False, disable=not enabled, delay=delay)
    return tqdm(iterable, total=total, desc=desc, unit=unit, leave=False, disable=not enabled, delay=delay,
                file=LinesPerMinute(), mininterval=60.0, ascii=True, ncols=100)


class LinesPerMinute:
    """A file for tqdm that writes its redraws ("\\r" + bar) as plain lines, at most one a minute (a changed
    postfix redraws the bar every step)."""

    def __init__(self, interval: float = 60.0):
        self.interval, self.last = interval, -math.inf

    def write(self, text: str) -> None:
        line = text.replace("\r", "").strip()
        if line and time.monotonic() - self.last >= self.interval:
            self.last = time.monotonic()
            sys.stderr.write(line + "\n")

    def flush(self) -> None:
        sys.stderr.flush()

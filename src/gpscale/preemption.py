"""Stopping on a signal: SIGTERM (what SLURM and Kubernetes send before they end a job), SIGUSR1 (what SLURM sends
ahead of a job's time limit when asked with ``sbatch --signal=USR1@SECONDS``) and SIGINT (Ctrl-C).

Inside :func:`stop_signals` each of them raises :class:`Stopped` wherever the program is, as Ctrl-C raises
``KeyboardInterrupt``. Inside :func:`deferred_stop` (a training loop that can save its state) the first signal is
only recorded: the loop asks :meth:`StopRequest.pending` at each step boundary, saves its state and raises
:class:`Stopped` itself. A Ctrl-C after that raises at once, for a step that does not end; a repeated SIGTERM or
SIGUSR1 does not (under a scheduler and torchrun each worker may get one from both).

Handlers are installed only in the main thread (Python delivers signals there alone), and a signal whose handler the
program has set itself is left to it; the handlers before are restored on leaving.
"""
from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

__all__ = ["STOP_SIGNALS", "StopRequest", "Stopped", "deferred_stop", "stop_signals"]

STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGUSR1")


class Stopped(KeyboardInterrupt):
    """Work ended by a signal. ``signal_name``: which; ``checkpoint``: the file that holds the training state saved
    at the step boundary where training stopped, or None when nothing was saved; ``step``: the optimiser steps that
    state has taken. ``exit_status`` is the shell's 128 + the signal's number."""

    def __init__(self, signal_name: str, checkpoint: str | Path | None = None, step: int | None = None):
        self.signal_name, self.checkpoint, self.step = signal_name, checkpoint, step
        saved = f"; the state after {step} steps is in {checkpoint}" if checkpoint is not None else ""
        super().__init__(f"stopped by {signal_name}{saved}")

    @property
    def exit_status(self) -> int:
        return 128 + int(signal.Signals[self.signal_name])


class StopRequest:
    """The signal received while stopping is deferred, if any."""

    def __init__(self):
        self.signal_name: str | None = None

    def pending(self, comm=None) -> str | None:
        """The name of the signal that asks training to stop, or None. With ``comm`` (a data-parallel job, a
        collective) a signal received by any process counts for all, so that every process stops at the same step."""
        if comm is None or comm.world_size == 1:
            return self.signal_name
        received = comm.all_reduce_sum(torch.tensor([float(self.signal_name == name) for name in STOP_SIGNALS]))
        return next((name for name, count in zip(STOP_SIGNALS, received.tolist()) if count > 0), None)


_deferring: list[StopRequest] = []  # the innermost deferred_stop's request last


def _handle(signum: int, frame) -> None:
    name = signal.Signals(signum).name
    if _deferring:
        request = _deferring[-1]
        if request.signal_name is None:
            request.signal_name = name
            return
        if name != "SIGINT":  # a scheduler and torchrun may each send SIGTERM: only a second Ctrl-C insists
            return
    raise Stopped(name)


def _ours_to_replace(handler) -> bool:
    return handler in (signal.SIG_DFL, signal.default_int_handler, _handle)


@contextmanager
def stop_signals() -> Iterator[None]:
    """Within: SIGTERM, SIGUSR1 and SIGINT raise :class:`Stopped` (see the module docstring)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {}
    for name in STOP_SIGNALS:
        number = getattr(signal, name, None)
        if number is not None and _ours_to_replace(signal.getsignal(number)):
            before[number] = signal.signal(number, _handle)
    try:
        yield
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)


@contextmanager
def deferred_stop() -> Iterator[StopRequest]:
    """Within: the first stop signal is recorded in the yielded :class:`StopRequest` instead of raising."""
    request = StopRequest()
    with stop_signals():
        _deferring.append(request)
        try:
            yield request
        finally:
            _deferring.remove(request)

"""L-BFGS(-B) over torch parameters with autograd gradients: scipy's quasi-Newton method, which GP libraries have
long used for the handful of hyperparameters of a full-batch objective (GPy, GPflow's Scipy optimiser), robust to
points where the objective cannot be evaluated.
"""
from __future__ import annotations

import functools
import math
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch
from scipy.optimize import minimize
from threadpoolctl import ThreadpoolController
from torch import Tensor

from .distributed import LOCAL, Comm
from .linalg import NotPSDError, NumericalWarning

__all__ = ["minimise", "LbfgsResult", "FAILED_LOSS"]

# What the objective reports where the loss cannot be evaluated: far above any loss per point of a GP that can, and
# finite, since scipy's L-BFGS-B stops at once ("converged") on inf or NaN, whereas it backtracks from a large value
FAILED_LOSS = 1e10


@dataclass
class LbfgsResult:
    """The best point's loss (inf when no point could be evaluated), iterations, evaluations, failed evaluations,
    and scipy's stopping message."""

    loss: float
    iterations: int
    evaluations: int
    failures: int
    message: str

    @property
    def evaluated(self) -> bool:
        return math.isfinite(self.loss)


def minimise(loss: Callable[[], Tensor], params: list[Tensor], *, bounds: list[tuple[float, float]] | None = None,
             max_iterations: int = 1000, max_evaluations: int = 15000,
             callback: Callable[[int, float, int], None] | None = None, comm: Comm = LOCAL) -> LbfgsResult:
    """Minimise ``loss()`` over the tensors ``params`` (flattened, in order) by scipy's L-BFGS-B with autograd
    gradients, and leave them at the best point evaluated (not always scipy's last one).

    Args:
        loss: a scalar function of the current values of ``params``.
        bounds: (lower, upper) per flattened entry, or None for no box.
        max_iterations: scipy's ``maxiter``; its tolerances are the defaults (factr 1e7, pgtol 1e-5), as GPy's.
        max_evaluations: scipy's ``maxfun``, the evaluations of ``loss`` (and its gradient) the line searches may
            take in all (scipy's default 15,000): what bounds the time, each evaluation being a pass over the data.
        callback: called after each iteration with its number (from 0), the loss there and the evaluations of
            ``loss`` so far.
        comm: the processes of a data-parallel job, each minimising with ``loss()`` its share of the one loss:
            the shares' values and gradients are summed across them, so every process sees the same numbers and
            takes the same steps.

    A point where ``loss`` raises :class:`~gpscale.linalg.NotPSDError` or gives a non-finite value or gradient
    counts as ``FAILED_LOSS`` with a zero gradient, so the line search backtracks from it. Jitter added at a trial
    point (a :class:`~gpscale.linalg.NumericalWarning`) is not reported: the line search may try points far from
    where it ends, and the posterior fitted at the end warns if it needs jitter. When no point could be
    evaluated the params are left unchanged and ``result.evaluated`` is False.
    """
    start = torch.cat([p.detach().reshape(-1) for p in params]).cpu().double().numpy()
    state = {"loss": math.inf, "x": None, "evaluations": 0, "failures": 0, "iteration": 0, "last": math.inf}

    def assign(x: np.ndarray) -> None:
        values = torch.from_numpy(np.array(x, dtype=np.float64)).split([p.numel() for p in params])
        with torch.no_grad():
            for param, value in zip(params, values):
                param.copy_(value.reshape(param.shape))

    def objective(x: np.ndarray) -> tuple[float, np.ndarray]:
        assign(x)
        state["evaluations"] += 1
        try:
            with warnings.catch_warnings():  # a trial point of the line search that needs jitter is no news
                warnings.simplefilter("ignore", NumericalWarning)
                value = loss()
            grad = torch.cat([g.reshape(-1) for g in torch.autograd.grad(value, params)])
            if comm.world_size > 1:  # one collective for the value and the gradient
                value, grad = comm.all_reduce_sum(torch.cat([value.detach().reshape(1), grad])).split(
                    [1, grad.numel()])
        except NotPSDError:
            state["failures"] += 1
            return FAILED_LOSS, np.zeros_like(x)
        if not (torch.isfinite(value) and torch.isfinite(grad).all()):
            state["failures"] += 1
            return FAILED_LOSS, np.zeros_like(x)
        state["last"] = value.item()
        if value.item() < state["loss"]:
            state.update(loss=value.item(), x=np.array(x))
        return value.item(), grad.cpu().double().numpy()

    def after_iteration(_x: np.ndarray) -> None:
        if callback is not None:
            callback(state["iteration"], state["last"], state["evaluations"])
        state["iteration"] += 1

    with _scipy_blas_on_one_thread():
        out = minimize(objective, start, jac=True, method="L-BFGS-B", bounds=bounds, callback=after_iteration,
                       options={"maxiter": max_iterations, "maxfun": max_evaluations})
    assign(start if state["x"] is None else state["x"])
    return LbfgsResult(loss=state["loss"], iterations=state["iteration"], evaluations=state["evaluations"],
                       failures=state["failures"], message=str(out.message))


@contextmanager
def _scipy_blas_on_one_thread() -> Iterator[None]:
    """Run the OpenBLAS libraries that scipy and numpy bring on one thread, where torch computes with another BLAS.

    L-BFGS-B calls scipy's BLAS between two evaluations of the loss. OpenBLAS's threads, woken by such a call,
    busy-wait for more work afterwards and take the cores from torch's threads, which evaluate the loss, so that on
    a machine of few cores every evaluation runs several times slower than alone. L-BFGS-B's vectors have one entry
    per parameter, work for one thread. Nothing is limited where torch's own BLAS is OpenBLAS (some aarch64 wheels, distribution builds: the
    library may be the one torch multiplies with), nor an OpenBLAS built on OpenMP, whose thread count is the
    OpenMP runtime's that torch may share.
    """
    if _torch_uses_openblas():
        yield
        return
    with warnings.catch_warnings():  # threadpoolctl warns of every pair of OpenMP runtimes it finds loaded
        warnings.simplefilter("ignore")
        blas = ThreadpoolController().select(internal_api="openblas")
    pthreads = [lib.filepath for lib in blas.lib_controllers if lib.threading_layer != "openmp"]
    if not pthreads:
        yield
        return
    with blas.select(filepath=pthreads).limit(limits=1):
        yield


@functools.cache
def _torch_uses_openblas() -> bool:
    return "BLAS_INFO=open" in torch.__config__.show()

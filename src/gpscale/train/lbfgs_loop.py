"""L-BFGS's training loop: scipy's L-BFGS-B on a full-batch model's loss (:mod:`gpscale.lbfgs`), to its own
convergence tests or the plateau rule, or for a fixed number of iterations."""
from __future__ import annotations

import math
import time

from .. import lbfgs
from ..defaults import Convergence, Training
from ..distributed import LOCAL
from .batches import Shard
from .convergence import lbfgs_plateaued
from .epoch import Objective
from .progress import progress_bar
from .result import TrainingError

__all__ = ["optimise_lbfgs"]


def optimise_lbfgs(model, X, y, result, settings: Training, convergence: Convergence, *, progress,
                   comm=LOCAL) -> None:
    """L-BFGS-B on the full-batch loss; one history record per iteration in ``result``. With ``settings.epochs``
    None it runs to scipy's convergence tests or the plateau rule, at most ``settings.max_steps`` iterations and as
    many evaluations of the loss. Under data parallelism each rank's share is 1/W of the loss, whose statistics the
    model all-reduces, and lbfgs sums the shares' gradients."""
    model.clear_cache()
    model.train()
    params = [p for group in model.parameter_groups() for p in group["params"]]
    converging = settings.epochs is None
    iterations = settings.max_steps if converging else settings.epochs
    bar = progress_bar(total=iterations, desc=model.key or "fit", unit="it", enabled=progress and comm.rank == 0)
    clock = {"tic": time.perf_counter()}
    marks: list[tuple[int, float]] = []  # (evaluations so far, loss) at the end of each iteration

    def record(iteration: int, loss: float, evaluations: int) -> None:
        now = time.perf_counter()
        result.history.append({"epoch": iteration, "step": iteration + 1, "loss": loss, "lr": math.nan,
                               "seconds": now - clock["tic"]})
        clock["tic"] = now
        bar.update()
        bar.set_postfix(loss=f"{loss:.4g}")
        if converging and lbfgs_plateaued(marks, loss, evaluations, convergence):
            raise StopIteration  # scipy ends the run; the best point is kept
        marks.append((evaluations, loss))

    objective, n = Objective(model), Shard.of(X.shape[0], comm).n_global
    fitted = lbfgs.minimise(lambda: objective(X, y, n, 1.0 / comm.world_size, comm), params,
                            max_iterations=iterations, max_evaluations=iterations if converging else 15000,
                            callback=record, comm=comm)
    bar.close()
    model.eval()
    if converging:
        result.converged = fitted.iterations < iterations and fitted.evaluations < iterations
    if not fitted.evaluated:
        raise TrainingError(f"L-BFGS could not evaluate the loss at any of {fitted.evaluations} points.")

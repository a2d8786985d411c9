"""One training loop for every model: Adam on reshuffled minibatches (or the full batch), an optional
learning-rate schedule, validation with early stopping, restarts on numerical failure, checkpoint/resume; or, for
full-batch models, L-BFGS to convergence.

- :mod:`~gpscale.train.fitting`: the entry point :func:`fit`, its checks and restarts;
- :mod:`~gpscale.train.adam_loop` and :mod:`~gpscale.train.lbfgs_loop`: the two optimisers' loops;
- :mod:`~gpscale.train.epoch`: one epoch of Adam steps, speculated and undone where a check failed;
- :mod:`~gpscale.train.batches`: each process's rows, the epoch's minibatches, the initialisation rows;
- :mod:`~gpscale.train.convergence`: rounds, windows and the plateau rule of training to convergence;
- :mod:`~gpscale.train.validation`, :mod:`~gpscale.train.checkpointing`, :mod:`~gpscale.train.progress` and
  :mod:`~gpscale.train.result`: the validation rows, the saved state, the progress bar and what a fit returns.
"""
from .adam_loop import adam
from .batches import Shard, initialisation_rows
from .epoch import Objective, run_epoch
from .fitting import OPTIMIZERS, fit
from .progress import progress_bar
from .result import FitResult, TrainingError

__all__ = ["initialisation_rows", "fit", "adam", "FitResult", "TrainingError", "OPTIMIZERS", "Shard", "Objective",
           "run_epoch", "progress_bar"]

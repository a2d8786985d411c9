"""Benchmark reports: summaries of the stored runs, markdown tables beside the published numbers, PNG plots.

Means and standard deviations are over the successful runs of a (protocol, dataset, method) group, i.e. over
its splits and seeds; the standard deviation is the sample one (``ddof=1``), 0 for a single run. Speed is
compared with the GPyTorch peer of the same method (``sgpr`` with ``gpytorch-sgpr``, ...) as the ratio of
seconds per epoch measured in the same benchmark run. A paper that reports RMSE in the units of y (published
``rmse_original``, e.g. GP-GRIEF's Table 1) gets two more columns: our ``rmse_original`` beside the paper's. A paper
that reports total training seconds (published ``train_seconds``, e.g. the Deep Basis Kernel paper's Table 1) gets
a column of them beside our ``train s``. Runs trained to convergence get a column of their optimiser steps and how
many converged before the cap, and runs of ``method="auto"`` one naming the method it fitted. A protocol with a
``time_reference`` method gets one more table: every method's seconds per epoch on every dataset, each over the
reference's. Runs skipped because a peer's code is absent are listed with their notes, apart from failed runs.
"""
from .documents import read_runs, results_section, write_report
from .plots import PLOTS
from .summary import METRICS, mean_ranks, summarise, time_ratio
from .tables import markdown_table, print_table, time_table

__all__ = ["METRICS", "summarise", "time_ratio", "mean_ranks", "markdown_table", "time_table", "read_runs",
           "write_report", "results_section", "print_table", "PLOTS"]

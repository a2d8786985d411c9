"""Benchmarks: protocols, runner, results store, report, and the GPyTorch peer baselines (:mod:`.peers`)."""

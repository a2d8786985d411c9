"""The papers' figures, redrawn with gpscale: scripts beside the package, not installed with it.

``python -m experiments.figures --help`` lists them; each ``<paper>_figures`` module holds one paper's experiments.
"""

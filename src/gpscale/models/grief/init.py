"""GP-GRIEF's initialisation: theta from an exact SE-ARD GP on a random subset of the rows, as the paper, fitted by
the training layer's L-BFGS-B (:func:`gpscale.lbfgs.minimise`) inside a box, then sigma^2 and, optionally, a
multi-start type-II fit on the GRIEF evidence.

Three departures from the paper, each chosen on its Table 1 sets (the runs are in the GP-GRIEF notes, *Why the
code is as it is*):

- the box keeps every positive hyperparameter within a factor 10^4 of its data scale, so the line search cannot
  step where a lengthscale underflows or sigma^2 collapses onto its floor, and the lengthscale of every input with
  rows between its grid points at least a quarter of the grid's spacing, the shortest its features can represent;
- a fit that explains nothing (lengthscales far below the spacing of the rows) restarts from lengthscales spread to
  the data;
- by default sigma^2 is the maximiser of the GRIEF evidence itself at the exact GP's theta (``init_noise="grief"``),
  not the exact GP's: on near-noiseless small sets the exact GP interpolates, with sigma^2 at its floor, where the
  low-rank GRIEF kernel has a huge loss and Adam in softplus space cannot move it.
"""
from __future__ import annotations

import copy
import math
import warnings

import torch
from torch import Tensor

from ... import lbfgs
from ...kernels import Kernel, inverse_softplus
from ...kernels.grid import grid_points
from ...likelihoods import Gaussian
from ...linalg import CORE, NumericalWarning
from ..linear.engine import FeatureSpaceGP
from ..exact.gp import ExactGP

__all__ = ["initialise_from_exact_gp", "stretched_starts", "dropped_variance", "fit_exact_gp", "max_evidence_noise",
           "noise_range", "INIT_NOISE", "INIT_STRETCH", "INIT_RANGE", "MIN_GRID_FRACTION", "SPREAD_FACTORS",
           "NEGLIGIBLE_DROP"]

INIT_NOISE = ("grief", "exact")
INIT_STRETCH = (1.0, 2.0, 4.0, 8.0, 16.0)  # stretched_starts: the exact GP's lengthscales times these
# The initialisation keeps every positive hyperparameter within a factor INIT_RANGE of its data scale (lengthscale i:
# the range of input i; s_f^2 and sigma^2: mean(y^2)). Its lower end for sigma^2, 10^-4 mean(y^2) (a noise std of
# 1% of y's), is where it matters: it lies below the noise of every set in the paper's Table 1, so a model that
# fits is never held by it, while below it lie the interpolating GPs that near-noiseless small sets pull the
# evidence toward. It also keeps the raw (softplus) noise above about -9.2, where Adam moves it in tens of steps.
INIT_RANGE = 1e4
# ... and the lengthscale of every input with rows between its grid points at least this fraction of the smallest
# gap between them (an input whose grid is its own distinct values has no such rows, and no such bound). A point
# halfway between two grid points, h apart, has k(x, xg) of at most exp(-(h/2)^2 / (2 l^2)): exp(-2) = 0.14 at
# l = h/4, 3e-4 at l = h/8, so that below a quarter of the spacing the off-grid rows have next to no features. The
# exact GP knows no grid: it can drive the lengthscale of an input with few distinct values to a local optimum of
# its own evidence far below the spacing, where the GRIEF evidence is that of white noise, its gradient in that
# lengthscale 0, and no stretched start can leave it.
MIN_GRID_FRACTION = 0.25
# The exact-GP fit "explains nothing" when its loss per point is within this of the white-noise model's: it is then
# restarted from lengthscales spread to the data, since from lengthscales far below the rows' spacing (ln 2 in many
# standardised dimensions) the kernel between rows underflows and the fit cannot leave its start.
EXPLAINS_NOTHING = 1e-3
# The restart fits from the spread lengthscales times each of these and keeps the largest evidence: from the spread
# alone (sqrt(d) std_i) the fit can switch off relevant inputs (their lengthscales running far past their range),
# which a start from half of it finds.
SPREAD_FACTORS = (1.0, 0.5)
# The multi-start is skipped where the top-p truncation at the exact GP's theta drops less prior variance, on average
# over the exact GP's rows, than this fraction of its noise variance: the rank-p evidence is then the exact GP's to
# within what the noise hides, and the exact GP's theta is already where the multi-start's descents lead, so the
# starts would cost most of the fit for nothing. Where the starts matter, the dropped variance is of the order of
# sigma^2 or many times it, so the threshold separates the two cases with room on both sides.
NEGLIGIBLE_DROP = 0.1
# An exact GP on at least this many rows that sees an input take one value on all of them but one cannot fit that
# input's lengthscale; fewer rows leave every lengthscale loosely determined, with nothing specific to warn about.
BLIND_MIN_ROWS = 100


def initialise_from_exact_gp(model: FeatureSpaceGP, X: Tensor, y: Tensor, seed: int = 0) -> None:
    """Fit an exact SE-ARD GP on ``min(n, model.init_exact_points)`` random rows of (X [n, d], y [n]) and copy its
    lengthscales and s_f^2 into ``model`` (the paper's initialisation); sigma^2 as ``model.init_noise`` says (a
    learned noise only).

    L-BFGS-B over the raw (softplus) parameters, as the paper's GPy, within the box of :func:`_exact_gp_box`; for a
    handful of hyperparameters it reaches the evidence's maximum in tens of iterations, where Adam with a fixed
    budget stops short or oscillates. Points where the Cholesky fails count as a huge loss and the best point
    evaluated is kept; if not even the start can be evaluated, the constructor's hyperparameters stay, with a
    :class:`~gpscale.linalg.NumericalWarning`. float64 throughout: the n x n Cholesky at a 1000 points is where
    float32 fails.
    """
    rows = torch.randperm(X.shape[0], generator=torch.Generator().manual_seed(seed))[: model.init_exact_points]
    Xs, ys = X.detach()[rows.to(X.device)].to(CORE), y.detach()[rows.to(y.device)].to(CORE)
    exact, fitted = fit_exact_gp(model, Xs, ys, model.kernel)
    if fitted.evaluated and fitted.loss >= Gaussian.null_loss(ys) - EXPLAINS_NOTHING:
        # the fit stayed where the kernel between distinct rows is ~0 (lengthscales far below the spacing of the
        # rows, as ln 2 is in 32 standardised dimensions): restart where typical rows correlate
        spread = _spread_lengthscale(Xs, model.kernel.ard)
        for factor in SPREAD_FACTORS:
            start = copy.deepcopy(model.kernel)
            with torch.no_grad():
                start.raw_lengthscale.copy_(inverse_softplus(spread * factor))
            exact_spread, fitted_spread = fit_exact_gp(model, Xs, ys, start)
            if fitted_spread.evaluated and fitted_spread.loss < fitted.loss:
                exact, fitted = exact_spread, fitted_spread
    if fitted.evaluated:
        model.kernel.load_state_dict(exact.kernel.state_dict())
        noise = exact.noise.detach()
        if len(model.init_stretch) > 1 and dropped_variance(model, Xs) > NEGLIGIBLE_DROP * noise.item():
            stretched_starts(model, Xs, ys)
        else:
            _warn_about_blind_inputs(model, Xs)
    else:
        warnings.warn("GP-GRIEF's exact-GP initialisation failed at its starting point (the Cholesky of K + "
                      "sigma^2 I); the constructor's lengthscale, outputscale and noise are kept. Pass other "
                      "starting values, or init_exact_points=0 to skip the exact GP.", NumericalWarning,
                      stacklevel=3)
        noise = model.noise.detach()
    if model.likelihood.learn_noise:
        model.likelihood.set_noise(max_evidence_noise(model, X, y) if model.init_noise == "grief" else noise)


def stretched_starts(model: FeatureSpaceGP, Xs: Tensor, ys: Tensor) -> list[tuple[float, float]]:
    """Multi-start type-II fit on (Xs, ys), the exact GP's rows: from the model's theta with every lengthscale
    multiplied by each factor of ``model.init_stretch`` (sigma^2 at the GRIEF evidence's maximiser there), L-BFGS-B
    on the GRIEF evidence for at most ``model.init_iterations`` iterations; the fit with the largest evidence is kept
    (theta and sigma^2). Returns (factor, loss per point) of every start.

    Why: the exact GP's lengthscales suit the full kernel, and the top-p truncation then drops much of its
    variance; the rank-p evidence has other, better maxima at longer lengthscales, where fewer eigenfunctions
    carry the kernel, which a descent from the exact GP's theta does not reach (energy, p = 100, fold 0: loss
    per point -1.03 from the exact GP's lengthscales, -1.36 from 8 times them). And an input that is constant on
    (almost) all of the exact GP's rows keeps its starting lengthscale, which can lie far below its grid's
    spacing: that factor's mbar_i eigenvalues are then nearly equal and the top p of the product repeat a few
    eigenfunctions of the other inputs (keggundirected, p = 1000: Phi carries 43% of the kernel's variance
    from the exact GP's theta, 99.98% from the best start). O(init_exact_points p^2) per evaluation, a few
    hundred evaluations per start.
    """
    base = copy.deepcopy(model.kernel.state_dict())
    best, found = (math.inf, None), []
    for factor in model.init_stretch:
        model.kernel.load_state_dict(base)
        with torch.no_grad():
            model.kernel.raw_lengthscale.copy_(inverse_softplus(model.kernel.lengthscale * factor))
        if model.likelihood.learn_noise:
            model.likelihood.set_noise(max_evidence_noise(model, Xs, ys))
        params = [p for group in model.parameter_groups() for p in group["params"]]
        fitted = lbfgs.minimise(lambda: model.loss(Xs, ys, Xs.shape[0]), params,
                                max_iterations=model.init_iterations)
        found.append((factor, fitted.loss))
        if fitted.loss < best[0]:
            best = (fitted.loss, copy.deepcopy(model.state_dict()))
    if best[1] is None:  # no start could be evaluated: keep the exact GP's theta
        model.kernel.load_state_dict(base)
    else:
        model.load_state_dict(best[1])
    return found


@torch.no_grad()
def dropped_variance(model: FeatureSpaceGP, X: Tensor) -> float:
    """The prior variance the top-p truncation drops, averaged over the rows of X [n, d]:
    ``mean_x (k(x, x) - phi(x)^T phi(x))``, with k(x, x) = s_f^2 for the SE kernel. O(n p) after the features."""
    phi = model.feature_map(model.feature_state())(X)  # [n, p]
    return (model.kernel.outputscale - (phi**2).sum(1).mean()).item()


def _warn_about_blind_inputs(model: FeatureSpaceGP, Xs: Tensor) -> None:
    """Warn when some input with a grid of several points takes one value on all but at most one of the exact
    GP's rows Xs: the exact GP cannot fit its lengthscale, which keeps its start, and where that lies below the
    grid's spacing the input's mbar_i nearly equal eigenvalues crowd the top p of the product (keggundirected,
    three such inputs at p = 1000: Phi carries 43% of the kernel's variance)."""
    if Xs.shape[0] < BLIND_MIN_ROWS:
        return
    blind = [i for i, size in enumerate(model.grid_sizes.tolist())
             if size > 1 and Xs[:, i].unique(return_counts=True)[1].max() >= Xs.shape[0] - 1]
    if blind:
        lengthscale = model.kernel.lengthscale.detach().expand(model.n_features)
        warnings.warn(f"GP-GRIEF's inputs {blind} take one value on all but at most one of the exact GP's "
                      f"{Xs.shape[0]} initialisation rows, so it cannot fit their lengthscales, which stay near "
                      f"their start ({', '.join(f'{lengthscale[i].item():.3g}' for i in blind)}). Where these "
                      f"lie below the spacing of those inputs' grids, their nearly equal eigenvalues crowd out "
                      f"the others in the top n_eigen and the features carry little of the kernel's variance. "
                      f"Pass init_stretch=(1, 2, 4, 8, 16) (the multi-start, which lengthens them where that "
                      f"raises the evidence), or init_exact_points=0 with lengthscales of your own.",
                      UserWarning, stacklevel=4)


def fit_exact_gp(model: FeatureSpaceGP, Xs: Tensor, ys: Tensor, kernel: Kernel) -> tuple[ExactGP, lbfgs.LbfgsResult]:
    """An exact GP with a copy of ``kernel`` and the model's noise settings, fitted on (Xs, ys) by L-BFGS-B in the
    box of :func:`_exact_gp_box` for at most ``model.init_iterations`` iterations."""
    lik = model.likelihood
    exact = ExactGP(model.n_features, kernel=copy.deepcopy(kernel), noise=float(model.noise.detach()),
                    evidence_rows=None, learn_noise=lik.learn_noise,
                    noise_floor=lik.noise_floor).to(dtype=CORE, device=Xs.device)
    # the model's grid once init has built it from every training row; before that (a direct call), the rows' own
    grids = model.grids() if min(model.grid_sizes.tolist()) > 0 else grid_points(Xs, model.grid_size)
    params, bounds = _exact_gp_box(exact, Xs, ys, grids)
    fitted = lbfgs.minimise(lambda: exact.loss(Xs, ys, Xs.shape[0]), params, bounds=bounds,
                            max_iterations=model.init_iterations)
    return exact, fitted


@torch.no_grad()
def max_evidence_noise(model: FeatureSpaceGP, X: Tensor, y: Tensor) -> Tensor:
    """The sigma^2 that maximises the model's evidence on (X, y) at its current theta, within :func:`noise_range`
    (one statistics pass, O(n p^2), then a 1-D search)."""
    stats = model.statistics(X, y)
    bounds = noise_range(stats.yy.item() / stats.n, model.likelihood.noise_floor)
    return torch.tensor(model.evidence_optimal_noise(stats, bounds), dtype=CORE)


def noise_range(scale: float, floor: float) -> tuple[float, float]:
    """Bounds of the initial sigma^2 for targets of mean square ``scale``: ``scale`` times 10^-4 and 10^4
    (``INIT_RANGE``), the lower one at least twice the noise floor, so that the raw noise
    ``inverse_softplus(sigma^2 - floor)`` is at least ``inverse_softplus(floor)``."""
    lower = max(scale / INIT_RANGE, 2 * floor)
    return lower, max(scale, lower) * INIT_RANGE


def _spread_lengthscale(X: Tensor, ard: bool) -> Tensor:
    """Lengthscales at which the scaled squared distance between two typical rows of X is about 2 (so k between
    them is about e^-1): sqrt(d) times each column's std (1 for a constant column; their mean without ARD)."""
    std = X.std(0)
    std = torch.where(std > 0, std, torch.ones_like(std)) * math.sqrt(X.shape[1])
    return std if ard else std.mean().reshape(1)


def _off_grid_gap(column: Tensor, grid: Tensor) -> Tensor:
    """The smallest gap between the points of an input's grid [mbar_i] if some value of the input's ``column`` lies
    between them, else 0: a grid of an input's own distinct values (a categorical or binary input) holds every row,
    whose features are then exact at any lengthscale."""
    if grid.numel() < 2 or torch.isin(column, grid.to(column)).all():
        return column.new_zeros(())
    return grid.diff().min()


def _exact_gp_box(exact: ExactGP, X: Tensor, y: Tensor,
                  grids: list[Tensor]) -> tuple[list[Tensor], list[tuple[float, float]]]:
    """The raw parameters of ``exact`` and L-BFGS-B's box for them: each lengthscale within a factor ``INIT_RANGE``
    of its input's range (1 for a constant input; the largest range without ARD) and, where some of X's rows lie
    between its input's grid points in ``grids``, at least ``MIN_GRID_FRACTION`` of the grid's smallest gap (the
    largest such gap without ARD; never above the upper end), s_f^2 of mean(y^2), sigma^2 in :func:`noise_range`.
    Without the box the line search steps where a lengthscale underflows to 0 (solar fold 0: raw -887, then NaN
    features and a failed Cholesky) or sigma^2 collapses onto its floor (cancer: raw -225); with it every raw value
    lies where softplus has a usable gradient for the Adam steps of GP-GRIEF-II."""
    span = X.max(0).values - X.min(0).values
    span = torch.where(span > 0, span, torch.ones_like(span))
    gap = torch.stack([_off_grid_gap(column, grid) for column, grid in zip(X.T, grids)]).to(span)
    if not exact.kernel.ard:
        span, gap = span.max().reshape(1), gap.max().reshape(1)
    # at most the upper end: the grid comes from every training row, the span from these rows only
    lower = torch.minimum(torch.maximum(span / INIT_RANGE, MIN_GRID_FRACTION * gap), span * INIT_RANGE)
    scale = (y**2).mean().item()
    box = [(exact.kernel.raw_lengthscale, lower, span * INIT_RANGE, 0.0),
           (exact.kernel.raw_outputscale, scale / INIT_RANGE, scale * INIT_RANGE, 0.0)]
    if exact.likelihood.learn_noise:
        floor = exact.likelihood.noise_floor
        box.append((exact.likelihood.raw_noise, *noise_range(scale, floor), floor))
    bounds = []
    for param, lower, upper, floor in box:
        raw = [inverse_softplus(torch.as_tensor(v, dtype=CORE) - floor).expand(param.shape).reshape(-1).tolist()
               for v in (lower, upper)]
        bounds += list(zip(*raw))
    return [param for param, *_ in box], bounds

"""VFF: variational Fourier features (Hensman, Durrande & Solin 2018, "Variational Fourier features for
Gaussian processes", JMLR).

The inducing variables are RKHS projections of f onto a harmonic Fourier basis on a box around the data
(:mod:`gpscale.kernels.fourier`), for a separable Matérn kernel (:mod:`gpscale.kernels.separable`): additive,
D (2F + 1) features with K_uu block diagonal over dimensions, or product, (2F + 1)^D features with K_uu a Kronecker
product (D <= 3). Inside the box ``Kuf = phi(x)`` does not depend on the hyperparameters.

``vff`` plugs the features into the collapsed Titsias bound
(:class:`~gpscale.models.linear.collapsed.CollapsedGP`), trained full batch; ``odvff`` (Azzimonti et al.,
"Orthogonally decoupled variational Fourier features") makes them the covariance basis of the orthogonally
decoupled SVGP (:class:`~gpscale.models.variational.decoupled.OrthogonallyDecoupledGP`) with inducing points gamma
for the mean, trained on minibatches; ``vff-svgp`` is ``odvff`` without gamma, VFF's SVGP form.

The box is fixed at ``initialise_from_data`` from the training inputs: ``[min - margin r, max + margin r]`` per
column, r its range. The induced kernel is accurate only a few lengthscales inside the box (at its ends the
residual is about s^2 / 2 for every F: the features are periodic), so ``margin`` must exceed about 3 lengthscales
/ r, and F must grow with the box: omega_F = 2 pi F / (b - a) should exceed 3-4 lambda (lambda = sqrt(2 nu) / l).
"""
from __future__ import annotations

import warnings

import torch
from torch import Tensor

from ...defaults import MINIBATCH_TRAINING, TrainingDefaults
from ...distributed import LOCAL, Comm
from ...kernels import SOFTPLUS_ZERO, Kernel, Periodic, Sum
from ...kernels.fourier import box_with_margin, row_kronecker, vff_Kuf, vff_Kuu
from ...kernels.separable import AdditiveMatern, ProductMatern
from ...operators import DiagPlusLowRank, Kronecker
from ...linalg import CORE
from ...options import check_options
from ..linear.collapsed import CollapsedGP
from ..variational.decoupled import OrthogonallyDecoupledGP
from ..base import BenchSize, register
from ..inducing import InducingFeatures, InducingPoints, StackedFeatures, kmeans_centers

__all__ = ["FourierFeatures", "VFF", "ODVFF", "VFFSVGP", "STRUCTURES", "separable_kernel"]

STRUCTURES = ("additive", "product")
_NUS = {"matern12": 0.5, "matern32": 1.5, "matern52": 2.5}


# The jitter on the Kuu of the extra component's inducing points. A periodic kernel's is near singular whenever two
# points sit about a period apart: with 1e-6 the natural-gradient steps on q(beta) diverged on the ODVFF paper's
# Fig. 3 data, with 1e-4 they did not (the ODVFF lab notes give the run).
EXTRA_JITTER = 1e-4
_EXTRA_KERNELS = ("periodic",)


def _extra_kernel(kernel: str | Kernel | None, n_features: int, n_inducing: int) -> Kernel | None:
    """The kernel of the component outside the Fourier features' reach (paper App. C), or None."""
    if kernel is None:
        if n_inducing:
            raise ValueError("n_extra_inducing needs an extra_kernel (e.g. extra_kernel='periodic').")
        return None
    if int(n_inducing) != n_inducing or n_inducing < 1:
        raise ValueError(f"extra_kernel needs n_extra_inducing >= 1 inducing points, got {n_inducing}.")
    if isinstance(kernel, Kernel):
        return kernel
    if kernel not in _EXTRA_KERNELS:
        raise ValueError(f"Unknown extra_kernel {kernel!r}; use one of {_EXTRA_KERNELS} or a Kernel.")
    return Periodic(n_features)


def _check_fourier_options(n_features: int, n_frequencies: int, structure: str, margin: float) -> None:
    check_options({"n_frequencies": n_frequencies, "margin": margin})
    if structure == "product" and n_features > 3:
        raise ValueError(f"structure='product' has (2F + 1)^D features: not usable for D = {n_features} > 3. "
                         "Use structure='additive'.")


def separable_kernel(kernel: str | Kernel, structure: str, n_features: int, lengthscale: float,
                     outputscale: float) -> AdditiveMatern | ProductMatern:
    """The separable Matérn of ``structure`` for a kernel name (``'matern12'``, ``'matern32'``, ``'matern52'``), or
    ``kernel`` itself if it already is one."""
    if structure not in STRUCTURES:
        raise ValueError(f"structure must be one of {STRUCTURES}, got {structure!r}.")
    cls = AdditiveMatern if structure == "additive" else ProductMatern
    if isinstance(kernel, Kernel):
        if not isinstance(kernel, cls):
            raise ValueError(f"structure={structure!r} needs a {cls.__name__} kernel, got {type(kernel).__name__}.")
        return kernel
    kernel = kernel.removeprefix(f"{structure}_") if isinstance(kernel, str) else kernel
    if kernel not in _NUS:
        raise ValueError(f"Variational Fourier features need a Matérn kernel ('matern12', 'matern32' or "
                         f"'matern52'): the RBF's RKHS does not contain the Fourier basis. Got kernel={kernel!r}.")
    return cls(n_features, nu=_NUS[kernel], lengthscale=lengthscale, outputscale=outputscale)


class FourierFeatures(InducingFeatures):
    """``zeta = <f, phi>_H`` for a separable Matérn kernel on the box ``[lower, upper]`` (set by :meth:`set_box`).

    Args:
        kernel: an :class:`AdditiveMatern` (D independent feature sets) or a :class:`ProductMatern` (tensor-product
            features).
        n_frequencies: F per dimension: 2F + 1 features per dimension (cos m = 0..F, sin m = 1..F).
    """

    def __init__(self, kernel: AdditiveMatern | ProductMatern, n_frequencies: int):
        super().__init__()
        self.kernel = kernel
        self.n_frequencies = int(n_frequencies)
        D, per_dim = kernel.n_features, 2 * self.n_frequencies + 1
        self.additive = isinstance(kernel, AdditiveMatern)
        self.num_inducing = D * per_dim if self.additive else per_dim**D
        self.register_buffer("lower", torch.zeros(D, dtype=CORE))
        self.register_buffer("upper", torch.ones(D, dtype=CORE))

    def set_box(self, lower: Tensor, upper: Tensor) -> None:
        """The interval [lower_d, upper_d] of every dimension [D]."""
        if not bool((upper > lower).all()):
            raise ValueError("Every interval of the VFF box needs upper > lower.")
        self.lower.copy_(lower)
        self.upper.copy_(upper)

    def Kuu_operator(self, jitter: float = 0.0) -> DiagPlusLowRank | Kronecker:
        """K_uu in its structure (float64): blocks per dimension (additive; one diagonal plus low rank with a block-
        diagonal W) or a Kronecker product (product, with s^2 on the first factor). It needs no jitter (its
        diagonal is bounded below by the integral term); a ``jitter`` is added to the additive diagonal."""
        ls = self.kernel.lengthscale.to(CORE)
        if self.additive:  # every dimension's blocks in one call
            return vff_Kuu(self.kernel.nu, self.lower, self.upper, self.n_frequencies, ls,
                           self.kernel.variance.to(CORE)).with_jitter(jitter)
        if jitter:
            raise ValueError("A product-kernel K_uu takes no jitter (it would not stay a Kronecker product).")
        one = torch.ones((), dtype=CORE, device=ls.device)
        return Kronecker([vff_Kuu(self.kernel.nu, self.lower[d], self.upper[d], self.n_frequencies, ls[d],
                                  self.kernel.outputscale.to(CORE) if d == 0 else one)
                          for d in range(self.kernel.n_features)])

    def Kuu(self) -> Tensor:
        return self.Kuu_operator().to_dense()

    def Kuf(self, X: Tensor) -> Tensor:
        """[M, c]: phi(x) inside the box, the edge forms outside (float64)."""
        X, ls = X.to(CORE), self.kernel.lengthscale.to(CORE)
        per_dim = vff_Kuf(self.kernel.nu, X.T, self.lower, self.upper, self.n_frequencies, ls)  # [D, 2F + 1, c]
        return per_dim.flatten(0, 1) if self.additive else row_kronecker(list(per_dim))

    def Kff_diag(self, X: Tensor) -> Tensor:
        return self.kernel.diag(X)

    def check_margin(self, X: Tensor) -> None:
        """Warn where the rows of X come closer than 2 lengthscales to an end of the box in a dimension that
        carries at least 1% of an additive kernel's variance: there the features miss more than about 2% of the
        kernel's variance, and at the ends half of it."""
        lowest, highest = (values.to(dtype=CORE, device=self.lower.device) for values in X.aminmax(dim=0))
        room = torch.minimum(lowest - self.lower, self.upper - highest)
        short = room < 2 * self.kernel.lengthscale.detach().to(CORE)
        if self.additive:
            variance = self.kernel.variance.detach()
            short &= (variance >= 0.01 * variance.sum()).to(short.device)
        dims = short.nonzero().flatten().tolist()
        if dims:
            warnings.warn(f"VFF: in dimension(s) {dims} the data come within 2 lengthscales of the box's ends, "
                          "where the Fourier features do not reproduce the kernel (their residual there is about "
                          "s^2 / 2). Refit with a larger margin and more frequencies (n_frequencies).", UserWarning,
                          stacklevel=3)


@register("vff")
class VFF(CollapsedGP):
    """Variational Fourier features with the collapsed (Titsias) bound, trained full batch.

    Args:
        n_frequencies: F: 2F + 1 features per dimension (default 32).
        structure: ``'additive'`` (default; D (2F + 1) features) or ``'product'`` ((2F + 1)^D; D <= 3).
        margin: the box extends this fraction of each column's range beyond its training data (default 1: the box
            is three times the data's range, room for lengthscales up to a third of the range; with F = 32 the
            features resolve lengthscales down to about a tenth of it).
        kernel: ``'matern12'``, ``'matern32'`` (default) or ``'matern52'``, made separable per ``structure``;
            or an :class:`AdditiveMatern` / :class:`ProductMatern`. Initial total variance ``outputscale``
            (default 1, the variance of standardised y; split evenly over dimensions when additive).
        solver: ``'auto'`` (default), ``'cholesky'`` or ``'qr'``; see
            :class:`~gpscale.models.linear.engine.FeatureSpaceGP`. K_uu needs no jitter.
        **kwargs: the likelihood and chunking options of :class:`~gpscale.models.base.GPModel`.
    """

    default_training = TrainingDefaults("lbfgs", lr=0.1, max_steps=100)  # a step is dear (many additive features)
    lengthscale_starts_at_median = False  # separable Matérns, one lengthscale per input
    floor_sizes = {"small": BenchSize(2000, 2), "paper": BenchSize(15000, 4)}

    def __init__(self, n_features: int, n_frequencies: int = 32, structure: str = "additive",
                 margin: float = 1.0, kernel: str | Kernel = "matern32", *, solver: str = "auto", **kwargs):
        _check_fourier_options(n_features, n_frequencies, structure, margin)
        base = separable_kernel(kernel, structure, n_features, kwargs.pop("lengthscale", SOFTPLUS_ZERO),
                                kwargs.pop("outputscale", 1.0))
        kwargs.pop("ard", None)  # separable kernels have a lengthscale per dimension
        super().__init__(n_features, kernel=base, **kwargs)
        self.set_engine_options(solver=solver)
        self.margin = float(margin)
        self.structure = structure
        self.fourier = FourierFeatures(self.kernel, int(n_frequencies))
        self.features = self.fourier  # as ODVFF's: the engine's name and the method's

    def initialise_from_data(self, X: Tensor, y: Tensor, seed: int = 0) -> None:
        self.fourier.set_box(*box_with_margin(X, self.margin))

    def fit_posterior(self, X: Tensor, y: Tensor, comm: Comm = LOCAL) -> None:
        self.fourier.check_margin(X)
        super().fit_posterior(X, y, comm)


@register("odvff")
class ODVFF(OrthogonallyDecoupledGP):
    """Orthogonally decoupled variational Fourier features: Fourier features for the covariance (and part of the
    mean), inducing points gamma for the rest of the mean; minibatch training with natural gradients on q(beta).

    Args:
        n_frequencies: F: 2F + 1 features per dimension (default 16).
        n_mean_inducing: M_g, the inducing points of the mean basis (default 300, the paper's |gamma|).
        structure, margin, kernel: as :class:`VFF`.
        extra_kernel: a component of f the Fourier features cannot represent (paper App. C): ``'periodic'`` or a
            :class:`~gpscale.kernels.Kernel`; the prior is then ``kernel + extra_kernel`` and the covariance basis
            adds ``n_extra_inducing`` inducing points of the extra component (their Kuu block diagonal to the
            features', since the components are independent). Default None.
        n_extra_inducing: those inducing points (k-means initialised, learned with ``learn_inducing``).
        learn_inducing: optimise gamma (and the extra inducing points).
        **kwargs: ``natural_gradients``, ``natgrad_step``, ``jitter`` (default 0: K_uu needs none) and the options
            of :class:`GPModel`.
    """

    default_training = TrainingDefaults("adam", lr=0.01, max_steps=500)  # fewer steps, since a step is dear
    auto_dtype = "float32"  # faster than float64 at the same accuracy
    sizes_capped_by_rows = ("n_mean_inducing", "n_extra_inducing")
    lengthscale_starts_at_median = False  # separable Matérns, one lengthscale per input
    floor_sizes = {"small": BenchSize(2000, 4, {"kernel": "additive_matern32", "n_frequencies": 10,
                                                "n_mean_inducing": 100}, 400),
                   "paper": BenchSize(15641, 17, {"kernel": "additive_matern32", "n_frequencies": 50,
                                                  "n_mean_inducing": 300}, 400)}

    def __init__(self, n_features: int, n_frequencies: int = 16, n_mean_inducing: int = 300,
                 structure: str = "additive", margin: float = 1.0, kernel: str | Kernel = "matern32",
                 extra_kernel: str | Kernel | None = None, n_extra_inducing: int = 0, learn_inducing: bool = True,
                 jitter: float = 0.0, **kwargs):
        _check_fourier_options(n_features, n_frequencies, structure, margin)
        base = separable_kernel(kernel, structure, n_features, kwargs.pop("lengthscale", SOFTPLUS_ZERO),
                                kwargs.pop("outputscale", 1.0))
        kwargs.pop("ard", None)
        extra = _extra_kernel(extra_kernel, n_features, n_extra_inducing)
        super().__init__(n_features, kernel=base if extra is None else Sum(base, extra),
                         n_mean_inducing=n_mean_inducing, jitter=jitter, **kwargs)
        self.margin = float(margin)
        self.structure = structure
        self.fourier = FourierFeatures(base, int(n_frequencies))
        if extra is None:
            self.features = self.fourier
        else:  # paper App. C: inducing points of the extra component join the covariance basis
            self.extra = InducingPoints(extra, int(n_extra_inducing), n_features, learn=learn_inducing)
            self.features = StackedFeatures([self.fourier, self.extra], jitters=(jitter, EXTRA_JITTER))
        self.gamma.requires_grad_(learn_inducing)
        self.initialise_q(self.features.num_inducing)

    def initialise_from_data(self, X: Tensor, y: Tensor, seed: int = 0) -> None:
        self.fourier.set_box(*box_with_margin(X, self.margin))
        if self.features is not self.fourier:
            with torch.no_grad():
                self.extra.Z.copy_(kmeans_centers(X, self.extra.num_inducing, seed + 2))
        self.initialise_mean_basis(X, seed)
        self.initialise_q_at_prior()

    def fit_posterior(self, X: Tensor, y: Tensor, comm: Comm = LOCAL) -> None:
        self.fourier.check_margin(X)
        super().fit_posterior(X, y, comm)


@register("vff-svgp")
class VFFSVGP(ODVFF):
    """VFF in its SVGP form: :class:`ODVFF` without the mean basis (n_mean_inducing = 0), q(beta) = N(m, S) full."""

    default_training = MINIBATCH_TRAINING
    auto_dtype = "float64"  # as fast as float32: its Fourier features are float64 either way
    floor_sizes = {"small": BenchSize(2000, 2, {}, 256), "paper": BenchSize(15000, 4, {}, 1024)}

    def __init__(self, n_features: int, n_mean_inducing: int = 0, **kwargs):
        if n_mean_inducing:
            raise ValueError("vff-svgp has no mean basis; use method='odvff' for n_mean_inducing > 0.")
        super().__init__(n_features, n_mean_inducing=0, **kwargs)


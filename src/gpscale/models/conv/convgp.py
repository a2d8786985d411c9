"""Convolutional variational GPs on images: ``conv-svgp`` (plain inducing patches) and ``conv-hvgp`` (harmonic
inducing patches), both on the SVGP engine with :class:`~gpscale.models.conv.features.ConvolutionalFeatures`.

The latent function of an image x is the weighted average over its P patches of one patch response function
g ~ GP(0, k_patch) (van der Wilk, Rasmussen & Hensman, "Convolutional Gaussian Processes", NeurIPS 2017), with
TICK's location kernel by default (Dutordoir, van der Wilk, Artemev, Tomczak & Hensman, "Translation
Insensitivity for Deep Convolutional Gaussian Processes", arXiv:1902.05888, 2019). The inducing variables are g at
M inducing patches; ``conv-hvgp`` splits g into T independent parts along a group of patch negations and gives
each its own M inducing patches and its own q (Sun, Shi, Wilson & Grosse, "Scalable Variational Gaussian
Processes via Harmonic Kernel Decomposition", ICML 2021): the paper's 2xM (``group='negation'``) and 4xM
(``group='checkerboard'``) models, whose Kuu is block diagonal, T blocks of M x M.

Rows of X are images flattened row-major over [height, width, channels] (channels last); ``image_shape`` says how
to fold them back. These are the single-layer models of that paper's CIFAR-10 table (its "384x0, 1K" rows); the
deep model, with its identity-filter mean function, is :mod:`gpscale.models.conv.deep_conv`.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ...defaults import TrainingDefaults
from ...kernels import SOFTPLUS_ZERO, Kernel, Stationary, inverse_softplus
from ...kernels.harmonic import GroupAction
from ...kernels.patches import CHUNK_ENTRIES, PADDINGS, PatchGeometry, checkerboard_negation, patch_negation
from ...options import check_options
from ..variational.engine import VariationalGP
from ..base import BenchSize, register
from .features import ConvolutionalFeatures
from .from_options import conv_kernel, resolve_image_shape

__all__ = ["ConvSVGP", "ConvHVGP", "CONV_GROUPS", "conv_geometry", "patch_group", "patch_median_distance"]

CONV_GROUPS = ("negation", "checkerboard")
# the patch kernel's initial variance: the HKD paper's (its CIFAR-10 models start lengthscale and variance at 5). An
# image's prior variance is an average of k_patch over pairs of its patches, most of them far apart in patch space,
# so it is a fraction of k_patch's variance: ln 2, the other methods' start, would leave f nearly flat
PAPER_OUTPUTSCALE = 5.0


def conv_geometry(image_shape, n_features: int, filter_size, stride, padding: str, key: str) -> PatchGeometry:
    """The :class:`~gpscale.kernels.patches.PatchGeometry` of the options, with errors that name the option, the
    value and the remedy."""
    shape = resolve_image_shape(image_shape, n_features, key)
    if padding not in PADDINGS:
        raise ValueError(f"{key}: padding must be one of {PADDINGS}, got {padding!r}.")
    try:
        return PatchGeometry(shape, filter_size, stride, padding)
    except (ValueError, TypeError) as error:
        raise ValueError(f"{key}: filter_size={filter_size!r}, stride={stride!r} and padding={padding!r} do not fit "
                         f"the {shape[0]} x {shape[1]} images of n_features = {n_features} columns ({error}): pass a "
                         "filter_size (and stride) of at most the image's height and width, or padding='same'.") \
            from None


def patch_median_distance(X: Tensor, geometry: PatchGeometry, seed: int = 0, n_patches: int = 1000) -> float:
    """The median distance between distinct patches of the images X, from ``n_patches`` sampled patches (seeded):
    the median heuristic on the patch kernel's own inputs. Identical patches (a blank background) are left out, as
    they say nothing about the scale on which patches differ; 1 if every sampled patch is the same."""
    patches, _ = geometry.sample(X, n_patches, seed)
    distances = torch.nn.functional.pdist(patches.to(torch.float64))
    distances = distances[distances > 0]
    return distances.median().item() if distances.numel() else 1.0


class _ConvolutionalGP(VariationalGP):
    """What conv-svgp and conv-hvgp share: the convolutional kernel from the options, the inducing patches'
    initialisation and the median heuristic on patches.

    Args:
        image_shape: the images' (H, W) or (H, W, C); one entry may be -1, inferred from the columns of X; H W C
            must be the number of columns. None (default): square single-channel images, as MNIST's rows of 784.
        filter_size: the patch's side, or (height, width). Default 5: the 5 x 5 patches of van der Wilk et al.
            (2017) on MNIST's 28 x 28 grey images and of the first layer of every model in the HKD paper.
        stride, padding: the step between patches (default 1, as both papers) and ``'valid'`` (default: patches
            inside the image) or ``'same'`` (zero padding, as many patch rows as image rows over the stride).
        n_inducing: inducing patches M (default 512, svgp's; per block for conv-hvgp): k-means centres of a
            seeded sample of min(100 M, 10,000) of the training images' patches, the HKD paper's initialisation.
        location_weights: learn a weight per patch position (van der Wilk et al.'s weighted convolutional kernel).
            Default False: TICK's location kernel already lets the response depend on where a patch lies.
        tick: multiply the patch kernel by a Matérn-3/2 kernel on patch positions (lengthscale 3 pixels, variance
            1: the HKD authors' code); inducing patches then carry a position too. Default True: the HKD paper's
            output layer, which is the whole of its single-layer model.
        kernel: the patch kernel: a name (default ``'rbf'``, the HKD paper's), a kernel on patch vectors of
            length fh fw C, or a whole :class:`~gpscale.kernels.patches.ConvKernel`, which is used as it is (its
            geometry, weights and TICK must then agree with the options).
        ard: one lengthscale per patch pixel (default False: the paper's shared lengthscale).
        lengthscale: the patch kernel's initial lengthscale, or ``'median'``: the median distance between sampled
            patches of the training images (what the estimators start from when given none). The HKD paper starts
            at 5, on pixels scaled to [0, 1] less their mean; the median adapts to any scaling of X.
        outputscale: the patch kernel's initial variance (default 5, the HKD paper's).
        **kwargs: ``likelihood`` (gaussian, bernoulli, robustmax, softmax), ``n_classes``, ``jitter``,
            ``natural_gradients``, ``natgrad_step``, ``whiten`` and the other options of
            :class:`~gpscale.models.variational.engine.VariationalGP`. ``chunk_size`` defaults to the images whose patches
            [c, P, fh fw C] hold about 2^22 numbers (32 MB in float64).
    """

    def __init__(self, n_features: int, image_shape=None, filter_size=5, stride=1, padding: str = "valid",
                 n_inducing: int = 512, location_weights: bool = False, tick: bool = True, *,
                 kernel: str | Kernel = "rbf", ard: bool = False, lengthscale: float | str = SOFTPLUS_ZERO,
                 outputscale: float = PAPER_OUTPUTSCALE, **kwargs):
        key = self.key or type(self).__name__
        check_options({"n_inducing": n_inducing, "filter_size": filter_size, "stride": stride,
                       "lengthscale": lengthscale, "outputscale": outputscale})
        for name, value in (("location_weights", location_weights), ("tick", tick), ("ard", ard)):
            if not isinstance(value, bool):
                raise ValueError(f"{key}: {name} must be True or False, got {value!r}.")
        geometry = conv_geometry(image_shape, n_features, filter_size, stride, padding, key)
        conv = conv_kernel(kernel, geometry, location_weights, tick, key, ard=ard, outputscale=outputscale,
                           lengthscale=SOFTPLUS_ZERO if lengthscale == "median" else lengthscale)
        chunk_given = "chunk_size" in kwargs
        super().__init__(n_features, kernel=conv, **kwargs)
        self.median_lengthscale = lengthscale == "median"  # on patches: see initialise
        self.image_shape = (geometry.height, geometry.width, geometry.channels)
        self.n_inducing = int(n_inducing)
        self.features = ConvolutionalFeatures(self.kernel, self.n_inducing, self._action(), **self._shared())
        self.initialise_q(self.n_inducing, blocks=self.features.blocks)
        if not chunk_given:  # a chunk's patches [c, P, d] near 2^22 numbers, as its K_uf's chunks
            per_image = geometry.n_patches * max(geometry.patch_dim, 1)
            self.chunk_size = int(max(16, min(self.chunk_size, CHUNK_ENTRIES // per_image)))

    def _action(self) -> GroupAction | None:
        """The group on inducing patches: None for plain ones."""
        return None

    def _shared(self) -> dict:
        return {}

    @property
    def geometry(self) -> PatchGeometry:
        return self.kernel.geometry

    def start_lengthscale_at_median(self) -> bool:
        """Start the patch kernel's lengthscale at the median distance between patches if it is stationary."""
        self.median_lengthscale = self.median_lengthscale or isinstance(self.kernel.patch_kernel, Stationary)
        return self.median_lengthscale

    @torch.no_grad()
    def initialise(self, X: Tensor, y: Tensor, seed: int = 0) -> None:
        """The median heuristic on the training images' patches (if asked for), then :meth:`initialise_from_data`."""
        if self.median_lengthscale:
            raw = inverse_softplus(torch.tensor(patch_median_distance(X, self.geometry, seed), dtype=torch.float64))
            self.kernel.patch_kernel.raw_lengthscale.fill_(raw.item())
        self.initialise_from_data(X, y, seed)

    def initialise_from_data(self, X: Tensor, y: Tensor, seed: int = 0) -> None:
        """Inducing patches (and positions) at k-means centres of a seeded sample of the images' patches, the same
        for every block; q at the prior."""
        self.features.initialise_from_images(X, seed)
        self.initialise_q_at_prior()


def patch_group(group: str, geometry: PatchGeometry, key: str, option: str = "filter_size") -> GroupAction:
    """The group of patch negations called ``group`` (:data:`CONV_GROUPS`) on the patches of ``geometry``; a
    checkerboard needs a patch of 2 pixels or more (``option`` names the option that sets the patch)."""
    if group == "negation":
        return patch_negation()
    if geometry.filter[0] * geometry.filter[1] < 2:
        raise ValueError(f"{key}: group='checkerboard' splits a patch's pixels in two, but the patch is "
                         f"{geometry.filter}: pass a larger {option} or group='negation'.")
    return checkerboard_negation(geometry.filter, geometry.channels)


@register("conv-svgp")
class ConvSVGP(_ConvolutionalGP):
    """Convolutional SVGP: M inducing patches, Kuu [M, M], Kuf [M, n] (the HKD paper's "M" model). Options as
    :class:`_ConvolutionalGP`."""

    # batches of 64 images, the HKD paper's, since each brings its patches to every kernel evaluation; Adam moves the
    # inducing patches and the kernel at lr 0.01, between svgp's 0.1 and the paper's 0.003; a step is dear
    default_training = TrainingDefaults("adam", lr=0.01, batch_size=64, max_steps=400)
    auto_dtype = "float32"  # faster than float64 at the same accuracy
    floor_sizes = {"small": BenchSize(2000, 64, {"image_shape": (8, 8), "filter_size": 3, "n_inducing": 64}, 64),
                   "paper": BenchSize(10000, 784, {"image_shape": (28, 28)}, 64)}


@register("conv-hvgp")
class ConvHVGP(_ConvolutionalGP):
    """Harmonic convolutional GP: T blocks of M inducing patches, Kuu [T, M, M] block diagonal, Kuf [T, M, n].

    Args:
        group: the patch negations that split g into T independent parts: ``'negation'`` (default; z -> -z, T = 2:
            the HKD paper's 2xM model) or ``'checkerboard'`` (the patch's pixels in a checkerboard, each half
            negated or not, T = 4: its 4xM model). The paper's CIFAR-10 table puts 4xM ahead at the same M per
            block, where 4xM has twice the inducing variables and four times the orbit points a patch meets; at the
            same number of inducing variables the default's blocks hold twice the patches each, and a step is
            cheaper (the HVGP notes compare the two on MNIST and Fashion-MNIST). A checkerboard needs a patch of 2
            pixels or more.
        shared_inducing: every block has the same M inducing patches (and positions), instead of its own.
        n_inducing: M, inducing patches per block (T M in all). Default 256: the 2 x 256 = 512 inducing variables
            of the default negation match conv-svgp's default M = 512; each block's K_uf takes the orbit of its
            patches, S T M = 1,024 points a patch (twice conv-svgp's 512).
        **kwargs: the options of :class:`_ConvolutionalGP`.

    Patch negation is about the origin, so the images should be centred (gpscale's standardisation does this);
    the patch kernel must be invariant to the group (any stationary kernel is, ARD too: both groups negate whole
    coordinates), which the initialisation checks.
    """

    # conv-svgp's rate and batch; twice its cap, as the harmonic blocks learn more slowly per step than conv-svgp's
    # 512 patches (the HVGP notes' MNIST runs chose it)
    default_training = TrainingDefaults("adam", lr=0.01, batch_size=64, max_steps=800)
    auto_dtype = "float32"  # faster than float64 at the same accuracy
    floor_sizes = {"small": BenchSize(2000, 64, {"image_shape": (8, 8), "filter_size": 3, "n_inducing": 16}, 64),
                   "paper": BenchSize(10000, 784, {"image_shape": (28, 28)}, 64)}

    def __init__(self, n_features: int, n_inducing: int = 256, group: str = "negation",
                 shared_inducing: bool = False, **kwargs):
        if group not in CONV_GROUPS:
            raise ValueError(f"{self.key}: group must be one of {CONV_GROUPS} ('negation': T = 2 blocks, "
                             f"'checkerboard': T = 4), got {group!r}.")
        if not isinstance(shared_inducing, bool):
            raise ValueError(f"{self.key}: shared_inducing must be True or False, got {shared_inducing!r}.")
        self.group, self.shared_inducing = group, shared_inducing
        super().__init__(n_features, n_inducing=n_inducing, **kwargs)

    def _action(self) -> GroupAction:
        return patch_group(self.group, self.geometry, self.key)

    def _shared(self) -> dict:
        return {"shared": self.shared_inducing}

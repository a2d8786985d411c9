"""Inducing patches of convolutional GPs, plain or harmonic, as inducing features for the variational engine.

With f(x) = (1/P) sum_p w_p g(x^[p]) and g ~ GP(0, k_patch) (:class:`~gpscale.kernels.patches.ConvKernel`), the
inducing variables are g at M inducing patches Z [M, d] (van der Wilk, Rasmussen & Hensman, "Convolutional
Gaussian Processes", NeurIPS 2017):

    Kuu = k_patch(Z, Z)  [M, M],    Kuf[m, x] = (1/P) sum_p w_p k_patch(z_m, x^[p])  [M, n],    Kff_diag = k(x, x).

With TICK the inducing points are (patch, position) pairs and every k_patch is multiplied by k_loc.

Harmonic inducing patches (Sun, Shi, Wilson & Grosse, "Scalable Variational Gaussian Processes via Harmonic Kernel
Decomposition", ICML 2021): for a group G of patch maps that k_patch is invariant to (negation, T = 2; checkerboard
negation, T = 4: :mod:`gpscale.kernels.patches`), g = sum_t g_t with independent g_t ~ GP(0, k_patch,t), and
block t has inducing variables ``u_t = sum_s W[t, s] g(G^s z_t)``. Then

    Cov(u_t, u_t') = 0 (t != t'),    Cov(u_t, u_t) = k_patch,t(Z_t, Z_t),
    Cov(u_t, f(x)) = (1/P) sum_p w_p k_patch,t(Z_t, x^[p]),      k_patch,t(z, x) = sum_s W[t, s] k_patch(x, G^s z),

so Kuu is block diagonal [T, M, M] and Kuf [T, M, n]: exactly the blocks of
:class:`~gpscale.models.harmonic.hvgp.HarmonicFeatures` over patches, each averaged over an image's patches. G acts on the
patch only, never on a TICK position (k_loc is unchanged by it, so the product kernel stays invariant).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ...kernels.harmonic import GroupAction, check_invariant
from ...kernels.patches import CHUNK_ENTRIES, ConvKernel, PatchGeometry
from ..harmonic.hvgp import HarmonicFeatures
from ..inducing import InducingFeatures, InducingPoints, kmeans_centers

__all__ = ["ConvolutionalFeatures", "kmeans_patches"]


def kmeans_patches(X: Tensor, geometry: PatchGeometry, m: int, seed: int = 0,
                   n_sample: int | None = None) -> tuple[Tensor, Tensor]:
    """``m`` inducing patches [m, d] and positions [m, 2]: k-means centres of a seeded sample of the images' patches.

    The sample has ``n_sample`` patches (default ``min(100 m, 10000)``, at least m, as the HKD paper's CIFAR-10
    models), drawn uniformly from all (image, patch) pairs of X [n, ...]. The k-means runs on the patches alone, so
    the pixel values, not the positions' scale, decide the clusters; each centre takes the position of its nearest
    sampled patch (for TICK), so the positions follow where such patches occur. An all-zero centre (a dark
    background) is a fixed point of negation: its odd harmonic block vanishes, and only the jitter keeps that
    block's Kuu factorisable.
    """
    m = int(m)
    n_sample = max(m, min(100 * m, 10_000)) if n_sample is None else max(m, int(n_sample))
    patches, locations = geometry.sample(X, n_sample, seed)
    Z = kmeans_centers(patches, m, seed)
    nearest = torch.cdist(Z, patches).argmin(-1)
    return Z, locations[nearest]


class ConvolutionalFeatures(InducingFeatures):
    """Inducing patches of a convolutional GP: Kuu [M, M], Kuf [M, n] (plain), or [T, M, M], [T, M, n] (harmonic).

    Args:
        kernel: the :class:`~gpscale.kernels.patches.ConvKernel` (its patch kernel, geometry, weights and TICK).
        m: inducing patches (per block, when harmonic).
        action: a group of patch maps (:func:`~gpscale.kernels.patches.patch_negation`,
            :func:`~gpscale.kernels.patches.checkerboard_negation`, any
            :class:`~gpscale.kernels.harmonic.GroupAction` on patch vectors), or None for plain inducing patches.
        shared: harmonic blocks share one Z [M, d] (and positions) instead of Z [T, M, d].
        images_per_chunk: images per chunk of :meth:`Kuf`; default: as many as keep its largest intermediate,
            c P times the points the patches meet (M; S T M for harmonic blocks, S M shared), near 2^22 entries,
            and at least one image.

    ``blocks`` is T for harmonic features and None otherwise: the engine's
    :meth:`~gpscale.models.variational.engine.VariationalGP.initialise_q` takes it.
    """

    def __init__(self, kernel: ConvKernel, m: int, action: GroupAction | None = None, shared: bool = False,
                 images_per_chunk: int | None = None):
        super().__init__()
        self.kernel = kernel
        geometry = kernel.geometry
        d = geometry.patch_dim
        if action is None:
            self.patches = InducingPoints(kernel.patch_kernel, m, d)
            self.blocks = None
            orbit_points = int(m)
        else:
            self.patches = HarmonicFeatures(kernel.patch_kernel, action, m, d, shared=shared)
            self.blocks = self.patches.blocks
            orbit_points = action.order * (int(m) if shared else self.patches.num_inducing)
        self.num_inducing = self.patches.num_inducing
        if images_per_chunk is None:
            images_per_chunk = CHUNK_ENTRIES // (geometry.n_patches * orbit_points)
        self.images_per_chunk = max(1, int(images_per_chunk))
        if kernel.tick:  # the inducing positions: one per inducing patch
            self.locations = nn.Parameter(torch.zeros(*self.Z.shape[:-1], 2))

    @property
    def Z(self) -> Tensor:
        """The inducing patches: [M, d], or [T, M, d] for harmonic blocks of their own."""
        return self.patches.Z

    @property
    def action(self) -> GroupAction | None:
        return None if self.blocks is None else self.patches.action

    def Kuu(self) -> Tensor:
        """``k_patch(Z, Z) [* k_loc(L, L)]`` [M, M], or ``k_patch,t(Z_t, Z_t) [* k_loc(L_t, L_t)]`` [T, M, M];
        symmetric, and PSD as an element-wise product of PSD matrices."""
        K = self.patches.Kuu()
        if not self.kernel.tick:
            return K
        k_loc = self.kernel.location_kernel
        L = self.locations.to(K.dtype)
        if L.ndim == 2:  # one set of positions, for every block if blocks share Z
            return K * k_loc(L, L)
        return K * torch.stack([k_loc(Lt, Lt) for Lt in L])

    def Kuf(self, X: Tensor) -> Tensor:
        """``(1/P) sum_p w_p k_patch[,t](Z, x^[p]) [* k_loc(L, l_p)]`` [(T,) M, n] for images X [n, H W C], in
        chunks of images (:meth:`~gpscale.kernels.patches.ConvKernel.lift`; memory bound in the class doc)."""
        locations = self.locations if self.kernel.tick else None
        if locations is not None and self.blocks is not None and locations.ndim == 2:
            locations = locations.expand(self.blocks, *locations.shape)  # shared positions, every block
        return self.kernel.lift(self.patches.Kuf, X, locations, self.images_per_chunk)

    def Kff_diag(self, X: Tensor) -> Tensor:
        """k(x, x) [n] of the full convolutional kernel (= the sum over blocks of the sub-kernels' variances)."""
        return self.kernel.diag(X)

    @torch.no_grad()
    def initialise_from_images(self, X: Tensor, seed: int = 0, n_sample: int | None = None,
                         check: bool = True) -> None:
        """Inducing patches (and positions) from :func:`kmeans_patches` of the images X, the same for every block;
        for harmonic features, first check on a sample of patches that the patch kernel is invariant to the group
        (:func:`~gpscale.kernels.harmonic.check_invariant`), since otherwise the blocks are not independent."""
        geometry = self.kernel.geometry
        Z, L = kmeans_patches(X, geometry, self.Z.shape[-2], seed, n_sample)
        if check and self.blocks is not None:
            sample, _ = geometry.sample(X, 64, seed + 1)
            atol = 1e-10 if X.dtype == torch.float64 else 1e-4
            check_invariant(self.kernel.patch_kernel, self.action, sample.to(self.Z.dtype), atol=atol)
        self.Z.copy_(Z.to(self.Z).expand_as(self.Z))
        if self.kernel.tick:
            self.locations.copy_(L.to(self.locations).expand_as(self.locations))

"""Image patches, the convolutional kernel and the patch groups of harmonic convolutional GPs.

A convolutional GP (van der Wilk, Rasmussen & Hensman, "Convolutional Gaussian Processes", NeurIPS 2017) applies
one patch response function g ~ GP(0, k_patch) to each of the P patches x^[p] of an image x and averages:

    f(x) = (1/P) sum_p w_p g(x^[p]),      K_ff[x, x'] = (1/P^2) sum_{p, p'} w_p w_p' k_patch(x^[p], x'^[p']),

with location weights w_p (1, or learned). The TICK kernel (Dutordoir, van der Wilk, Artemev, Tomczak & Hensman,
"Translation Insensitivity for Deep Convolutional Gaussian Processes", arXiv:1902.05888, 2019) lets g also depend
on where the patch sits: g ~ GP(0, k_patch(p, p') k_loc(l, l')) on (patch, location) pairs, with l_p the patch's
pixel position.

Inducing patches u = g(z) (or u = g(z, l_z) with TICK) are inter-domain inducing variables of f:
``Cov(u, u') = k_patch(z, z') [k_loc(l_z, l_z')]`` and ``Cov(u, f(x)) = (1/P) sum_p w_p k_patch(z, x^[p])
[k_loc(l_z, l_p)]`` (:class:`ConvKernel` computes the second from any patch cross-covariance by :meth:`ConvKernel.
lift`). An isotropic patch kernel is invariant to negating the patch, or any set of its pixels, so the harmonic
kernel decomposition of Sun, Shi, Wilson & Grosse ("Scalable Variational Gaussian Processes via Harmonic Kernel
Decomposition", ICML 2021) applies to the inducing patches: :func:`patch_negation` (T = 2) and
:func:`checkerboard_negation` (T = 4) are their groups, for :mod:`gpscale.kernels.harmonic`.

Layout: images are stored as rows of X [n, H W C], flattened row-major over [height, width, channels] (channels
last, as :class:`~gpscale.kernels.harmonic.ImageRoll` and ``ImageFlip`` read them); a patch is a vector
[fh fw C] flattened the same way, so a patch of a flattened image is laid out like a small image.
"""
from __future__ import annotations

import operator

import torch
from torch import Tensor, nn
from torch.nn import functional

from ..device import HostConstants
from ..linalg import weighted_sum
from .harmonic import Negation, Product
from .stationary import Kernel, Matern

__all__ = ["PADDINGS", "PatchGeometry", "extract_patches", "ConvKernel", "tick_location_kernel", "patch_negation",
           "checkerboard_negation", "CHUNK_ENTRIES"]

PADDINGS = ("valid", "same")
# the largest intermediate a chunked pass builds, in entries: 2^22 (32 MB in float64), as HVGP's chunks
CHUNK_ENTRIES = 2**22
# the patch Gram matrices [c, P, P] of one call in ConvKernel.diag, in entries: 2^21 (six 28 x 28 images, P = 576):
# enough images a call to spread the per-call cost, few enough that the call's passes stay in a CPU's L2 cache
# (the timings behind the choice are on the Performance page)
DIAG_ENTRIES = 2**21


def _pair(value, name: str) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2:
        raise ValueError(f"{name} must be an int or a (height, width) pair, got {value!r}.")
    pair = tuple(operator.index(v) for v in pair)
    if min(pair) < 1:
        raise ValueError(f"{name} must be >= 1, got {value!r}.")
    return pair


class PatchGeometry:
    """Where the patches of an image lie: image shape, filter size, stride and padding.

    Args:
        image_shape: (H, W) or (H, W, C).
        filter_size: the patch's (fh, fw), or one int for a square patch.
        stride: the step between patches, (sh, sw) or one int.
        padding: ``'valid'`` (default): only patches inside the image, ``(H - fh) // sh + 1`` rows of them;
            ``'same'``: zero padding so that there are ``ceil(H / sh)`` rows of patches, the padding split as
            TensorFlow does (``floor`` of the total before, the rest after). The HKD paper's table of CIFAR-10
            architectures lists SAME, but its released code runs the 1-3-layer nets, which produced those rows of
            its results, with VALID; VALID is also the convolutional GP of van der Wilk et al. (2017), and it adds
            no artificial zero pixels (patches that are mostly padding lie near the origin, where the odd
            sub-kernels of the negation groups vanish).

    Attributes: ``n_patches`` P, ``patch_dim`` d = fh fw C, ``n_pixels`` H W C (the flattened image's length),
    ``out_shape`` (rows, columns of patches), ``pads`` (top, bottom, left, right), ``index`` [P, fh fw] (each
    patch's pixels in the padded image flattened over [rows, columns]) and ``locations`` [P, 2] (float64: the
    (row, column) of each patch's top-left pixel in the unpadded image, negative inside the padding; the HKD
    authors' code counts from the padded image's corner, a constant shift that a stationary location kernel does
    not see).
    """

    def __init__(self, image_shape, filter_size, stride=1, padding: str = "valid"):
        shape = tuple(operator.index(s) for s in image_shape)
        if len(shape) == 2:
            shape = (*shape, 1)
        if len(shape) != 3 or min(shape) < 1:
            raise ValueError(f"image_shape must be (H, W) or (H, W, C) of positive sizes, got {image_shape!r}.")
        if padding not in PADDINGS:
            raise ValueError(f"padding must be one of {PADDINGS}, got {padding!r}.")
        self.height, self.width, self.channels = shape
        self.filter = _pair(filter_size, "filter_size")
        self.stride = _pair(stride, "stride")
        self.padding = padding
        pads, out = [], []
        for size, f, s in zip((self.height, self.width), self.filter, self.stride):
            if padding == "valid":
                if f > size:
                    raise ValueError(f"A {self.filter} filter does not fit a {self.height} x {self.width} image with "
                                     "padding='valid'.")
                out.append((size - f) // s + 1)
                pads += [0, 0]
            else:
                out.append(-(-size // s))
                total = max((out[-1] - 1) * s + f - size, 0)
                pads += [total // 2, total - total // 2]
        self.out_shape = tuple(out)
        self.pads = tuple(pads)  # (top, bottom, left, right)
        self.n_patches = out[0] * out[1]
        self.patch_dim = self.filter[0] * self.filter[1] * self.channels
        self.n_pixels = self.height * self.width * self.channels
        self.index = self._index()
        self.constants = HostConstants()  # index and locations, copied once to each device (and dtype) they serve
        rows = torch.arange(out[0], dtype=torch.float64) * self.stride[0] - self.pads[0]
        cols = torch.arange(out[1], dtype=torch.float64) * self.stride[1] - self.pads[2]
        self.locations = torch.cartesian_prod(rows, cols)  # [P, 2], patch p = (row r, column c) at r * out_w + c

    def index_on(self, device) -> Tensor:
        """:attr:`index` on ``device``, copied there once."""
        return self.constants.get("index", lambda: self.index, torch.long, device)

    def locations_on(self, dtype: torch.dtype, device) -> Tensor:
        """:attr:`locations` in ``dtype`` on ``device``, copied there once."""
        return self.constants.get("locations", lambda: self.locations, dtype, device)

    def _index(self) -> Tensor:
        """[P, fh fw]: pixel (r s_h + i, c s_w + j) of the padded image for patch (r, c), pixel (i, j) of the patch."""
        padded_width = self.width + self.pads[2] + self.pads[3]
        rows = torch.arange(self.out_shape[0]) * self.stride[0]
        cols = torch.arange(self.out_shape[1]) * self.stride[1]
        i, j = torch.arange(self.filter[0]), torch.arange(self.filter[1])
        pixel_rows = rows[:, None, None, None] + i[None, None, :, None]  # [out_h, 1, fh, 1]
        pixel_cols = cols[None, :, None, None] + j[None, None, None, :]  # [1, out_w, 1, fw]
        return (pixel_rows * padded_width + pixel_cols).reshape(self.n_patches, -1)

    def images(self, X: Tensor) -> Tensor:
        """X as images [n, H, W, C]. X may be flattened rows [n, H W C] (channels last), [n, H, W] (C = 1) or
        [n, C, H, W] (torch's convolution layout); its shape is checked against the geometry's."""
        n = X.shape[0]
        H, W, C = self.height, self.width, self.channels
        if X.ndim == 2 and X.shape[1] == self.n_pixels:
            return X.reshape(n, H, W, C)
        if X.ndim == 3 and C == 1 and tuple(X.shape[1:]) == (H, W):
            return X.unsqueeze(-1)
        if X.ndim == 4 and tuple(X.shape[1:]) == (C, H, W):
            return X.permute(0, 2, 3, 1)
        raise ValueError(f"Expected images as [n, {H * W * C}] (flattened [H, W, C] = [{H}, {W}, {C}]), "
                         f"{'[n, H, W] or ' if C == 1 else ''}[n, C, H, W] = [n, {C}, {H}, {W}]; "
                         f"got shape {tuple(X.shape)}.")

    def _padded_pixels(self, X: Tensor) -> Tensor:
        """The zero-padded images' pixels [n, Hp Wp, C]."""
        images = self.images(X)
        top, bottom, left, right = self.pads
        if any(self.pads):  # F.pad pads the last axes first: channels (none), columns, rows
            images = functional.pad(images, (0, 0, left, right, top, bottom))
        return images.reshape(X.shape[0], -1, self.channels)

    def extract(self, X: Tensor) -> Tensor:
        """The patches [n, P, d] of the images X (any layout of :meth:`images`): patch p = (r, c) is row
        ``r * out_w + c``, each patch flattened over [fh, fw, C]. One gather: memory n P d."""
        pixels = self._padded_pixels(X)  # [n, Hp Wp, C]
        index = self.index_on(X.device)
        return pixels[:, index.reshape(-1)].reshape(X.shape[0], self.n_patches, self.patch_dim)

    def patch(self, X: Tensor, images: Tensor, patches: Tensor) -> Tensor:
        """Patch ``patches[k]`` of image ``images[k]`` [k, d]: only those images are padded and read."""
        pixels = self._padded_pixels(X[images])  # [k, Hp Wp, C]
        index = self.index_on(X.device)[patches]  # [k, fh fw]
        rows = torch.arange(len(images), device=X.device).unsqueeze(-1)
        return pixels[rows, index].reshape(len(images), self.patch_dim)

    def sample(self, X: Tensor, n: int, seed: int = 0) -> tuple[Tensor, Tensor]:
        """``n`` patches [n, d] drawn uniformly (with replacement) from all (image, patch) pairs of X, and their
        locations [n, 2]; seeded, so the same seed gives the same patches."""
        g = torch.Generator().manual_seed(seed)
        images = torch.randint(X.shape[0], (n,), generator=g)
        patches = torch.randint(self.n_patches, (n,), generator=g)
        return (self.patch(X, images.to(X.device), patches.to(X.device)),
                self.locations[patches].to(device=X.device, dtype=X.dtype))

    def config(self) -> dict:
        """The constructor's arguments as JSON values: ``PatchGeometry(**geometry.config())`` is the same
        geometry."""
        return {"image_shape": [self.height, self.width, self.channels], "filter_size": list(self.filter),
                "stride": list(self.stride), "padding": self.padding}

    def __eq__(self, other) -> bool:
        return isinstance(other, PatchGeometry) and self.config() == other.config()

    __hash__ = None  # mutable tensors inside: equal by value, not hashable

    def __repr__(self) -> str:
        return (f"PatchGeometry(image_shape={(self.height, self.width, self.channels)}, filter_size={self.filter}, "
                f"stride={self.stride}, padding={self.padding!r})")


def extract_patches(X: Tensor, image_shape, filter_size, stride=1, padding: str = "valid") -> Tensor:
    """The patches [n, P, fh fw C] of images X (see :meth:`PatchGeometry.images` for the layouts)."""
    return PatchGeometry(image_shape, filter_size, stride, padding).extract(X)


def tick_location_kernel(lengthscale: float = 3.0, outputscale: float = 1.0) -> Matern:
    """The TICK location kernel: Matérn-3/2 on patch positions (in pixels), one shared lengthscale.

    The defaults are the HKD authors' released code (lengthscale 3, variance 1); their paper's text says
    lengthscale 1 and variance 3. Only the product of the patch and location variances is identified, so the
    lengthscale is the difference that matters: 3 pixels lets neighbouring positions share more of g."""
    return Matern(2, nu=1.5, ard=False, lengthscale=lengthscale, outputscale=outputscale)


class ConvKernel(Kernel):
    """The convolutional kernel on images (see the module docstring):

        k(x, x') = (1/P^2) sum_{p, p'} w_p w_p' k_patch(x^[p], x'^[p']) [k_loc(l_p, l_p')]

    Args:
        patch_kernel: k_patch on patch vectors [r, d].
        geometry: the :class:`PatchGeometry` (image shape, filter, stride, padding), or its
            :meth:`PatchGeometry.config` (a dict of its arguments).
        location_weights: learn the weights w [P] (start at 1), else w = 1.
        location_kernel: k_loc on patch positions [r, 2] (TICK, e.g. :func:`tick_location_kernel`), or None.

    Inputs X are images in any layout of :meth:`PatchGeometry.images`; the model engines pass rows [n, H W C].
    """

    def __init__(self, patch_kernel: Kernel, geometry: PatchGeometry | dict, location_weights: bool = False,
                 location_kernel: Kernel | None = None):
        super().__init__()
        self.patch_kernel = patch_kernel
        self.geometry = geometry if isinstance(geometry, PatchGeometry) else PatchGeometry(**geometry)
        self.location_kernel = location_kernel
        weights = torch.ones(self.geometry.n_patches)
        if location_weights:
            self.patch_weights = nn.Parameter(weights)
        else:
            self.register_buffer("patch_weights", weights)

    @property
    def tick(self) -> bool:
        return self.location_kernel is not None

    @property
    def location_weights(self) -> bool:
        """Whether the weights w are learned (a parameter) rather than fixed at 1 (a buffer)."""
        return isinstance(self.patch_weights, nn.Parameter)

    def config(self) -> dict:
        """The constructor's arguments (the geometry as its dict), so that a model file rebuilds the kernel's
        structure (:func:`gpscale.kernels.kernel_spec`); the weights and hyperparameters come from the state."""
        return {"patch_kernel": self.patch_kernel, "geometry": self.geometry.config(),
                "location_weights": self.location_weights, "location_kernel": self.location_kernel}

    def scaled_weights(self, X: Tensor) -> Tensor:
        """w / P [P], in X's dtype and device: the average over patches with the location weights."""
        return self.patch_weights.to(device=X.device, dtype=X.dtype) / self.geometry.n_patches

    def locations(self, X: Tensor) -> Tensor:
        """The patch positions l_p [P, 2] in X's dtype and device."""
        return self.geometry.locations_on(X.dtype, X.device)

    def location_gram(self, L: Tensor, X: Tensor) -> Tensor:
        """``k_loc(L, l_p)`` [..., m, P] for positions L [..., m, 2] (TICK only)."""
        K = self.location_kernel(L.reshape(-1, 2).to(X.dtype), self.locations(X))
        return K.reshape(*L.shape[:-1], self.geometry.n_patches)

    def lift(self, patch_cross, X: Tensor, locations: Tensor | None = None, images_per_chunk: int = 1) -> Tensor:
        """``(1/P) sum_p w_p c(x^[p]) [* k_loc(L, l_p)]`` [..., m, n]: an inducing patch's covariance with g at
        each patch, averaged into its covariance with f(x).

        Args:
            patch_cross: the inducing variables' covariance with g at patches, ``patches [r, d] -> [..., m, r]``
                (``k_patch(Z, .)``, or the harmonic sub-kernels [T, m, r]).
            X: images [n, ...].
            locations: the inducing positions L [..., m, 2] (TICK), else None.
            images_per_chunk: images whose patches go through ``patch_cross`` at once. The largest intermediates
                are that call's output and its product with k_loc, [..., m, c P] for c images per chunk: memory
                O(c P m) (times the orbit for harmonic features), never [n, P, m].
        """
        if self.tick != (locations is not None):
            raise ValueError("Inducing positions are needed exactly when the kernel has a location kernel (TICK).")
        w = self.scaled_weights(X)  # [P]
        # the weights over the patches: w [P], or with TICK each inducing variable's w_p k_loc(l, l_p) [..., m, P]
        v = w if locations is None else self.location_gram(locations, X) * w
        columns = []
        for Xc in torch.split(X, max(1, int(images_per_chunk))):
            patches = self.geometry.extract(Xc)  # [c, P, d]
            K = patch_cross(patches.reshape(-1, self.geometry.patch_dim))  # [..., m, c P]
            K = K.reshape(*K.shape[:-1], Xc.shape[0], self.geometry.n_patches)  # [..., m, c, P]
            # sum_p v_p K[..., c, p] as one product a row of v, whose backward multiplies v into dL/dK: (K * k_loc)
            # @ w formed an [..., m, c, P] product and took dL/dK through a product of inner dimension 1
            columns.append(weighted_sum(v.expand(*K.shape[:-2], v.shape[-1]), K.mT))  # [..., m, c]
        return torch.cat(columns, -1)

    def patch_gram(self, patches: Tensor, location_gram: Tensor | None = None) -> Tensor:
        """``k_patch(x^[p], x^[p']) [k_loc(l_p, l_p')]`` [P, P] for one image's patches [P, d]; ``location_gram``
        [P, P] is k_loc(l, l), the same for every image (computed here when not given)."""
        K = self.patch_kernel(patches, patches)
        if self.tick:
            K = K * (self.location_self_gram(patches) if location_gram is None else location_gram)
        return K

    def location_self_gram(self, X: Tensor) -> Tensor:
        """``k_loc(l_p, l_p')`` [P, P] between the patch positions, in X's dtype and device (TICK only)."""
        locations = self.locations(X)
        return self.location_kernel(locations, locations)

    def forward(self, X1: Tensor, X2: Tensor) -> Tensor:
        """The dense K_ff [n1, n2]; memory O(c P n2 P) for chunks of c = max(1, 2^22 / (P n2 P)) rows of X1."""
        P, d = self.geometry.n_patches, self.geometry.patch_dim
        patches2 = self.geometry.extract(X2).reshape(-1, d)  # [n2 P, d]
        w = self.scaled_weights(X2)
        K_loc = None
        if self.tick:
            locations = self.locations(X2)
            K_loc = self.location_kernel(locations, locations).unsqueeze(1)  # [P, 1, P]
        rows = []
        for X1c in torch.split(X1, max(1, CHUNK_ENTRIES // (P * P * max(1, X2.shape[0])))):
            K = self.patch_kernel(self.geometry.extract(X1c).reshape(-1, d), patches2)  # [c P, n2 P]
            K = K.reshape(X1c.shape[0], P, X2.shape[0], P)
            if K_loc is not None:
                K = K * K_loc
            rows.append(torch.einsum("apbq,p,q->ab", K, w, w))
        return torch.cat(rows)

    def diag(self, X: Tensor) -> Tensor:
        """``k(x, x) = w^T K_pp(x) w / P^2`` [n] from each image's [P, P] patch Gram matrix (the Gram matrices
        differ between images, so this is the cost of the exact variance), c = max(1, 2^21 / P^2) images at a time
        through the patch kernel's :meth:`~gpscale.kernels.Kernel.weighted_self_grams` with weights ``w w^T / P^2``
        (times k_loc(l, l) for TICK; one batched call with its own backward for a stationary kernel): memory
        O(c P^2)."""
        if not len(X):
            return X.new_zeros(0)
        P = self.geometry.n_patches
        w = self.scaled_weights(X)
        weights = torch.outer(w, w)
        if self.tick:  # once: the positions are every image's
            weights = weights * self.location_self_gram(X)
        values = [self.patch_kernel.weighted_self_grams(self.geometry.extract(Xc), weights)
                  for Xc in torch.split(X, max(1, DIAG_ENTRIES // P**2))]
        return torch.cat(values)


def patch_negation() -> Negation:
    """``z -> -z`` on inducing patches, T = 2 (even and odd parts of g): the HKD paper's 2 x M convolutional
    model. Invariant kernels: stationary and inner-product patch kernels."""
    return Negation()


def checkerboard_negation(filter_size, channels: int = 1) -> Product:
    """Two commuting negations of a patch [fh, fw, C]'s pixels split in a checkerboard: way 0 negates the pixels
    (i, j) with i + j even, way 1 those with i + j odd, every channel of a pixel with its pixel. S = T = 4, the
    HKD paper's 4 x M convolutional model. Both negate whole coordinates, so any stationary patch kernel (even ARD)
    is invariant."""
    fh, fw = _pair(filter_size, "filter_size")
    if fh * fw < 2:
        raise ValueError("A checkerboard split needs a patch of at least 2 pixels.")
    C = operator.index(channels)
    parity = (torch.arange(fh)[:, None] + torch.arange(fw)[None, :]) % 2  # [fh, fw]
    coordinate_parity = parity.repeat_interleave(C).reshape(-1)  # [fh fw C], flattened like the patch
    ways = [Negation(dims=(coordinate_parity == p).nonzero().reshape(-1).tolist()) for p in (0, 1)]
    for way in ways:  # acting on patches of this size only: a patch of another size is refused, not misread
        way.n_features = fh * fw * C
    return Product(ways)

"""Deep convolutional GPs: ``deep-conv-hvgp``, hidden convolutional GP layers under the single-layer convolutional
GP of :mod:`gpscale.models.conv.convgp`, trained by doubly stochastic variational inference.

A model of L layers maps an image X_0 = x [H, W, C_0] through L - 1 hidden layers to feature maps, and the last
layer's convolutional GP (TICK by default) to the latent f that the likelihood sees (Blomqvist, Kaski & Heinonen,
"Deep Convolutional Gaussian Processes", ECML-PKDD 2019; Dutordoir, van der Wilk, Artemev, Tomczak & Hensman,
"Translation Insensitivity for Deep Convolutional Gaussian Processes", arXiv:1902.05888, 2019). Hidden layer l
applies C_l output GPs g_c ~ GP(0, k_patch) to each patch of its input, which share the kernel and the inducing
patches Z [M, d]:

    X_l[p, c] = m_c(X_{l-1}^[p]) + g_c(X_{l-1}^[p]),     p over the patches, c over the C_l channels,

with the identity-filter mean m_c(patch) = the patch's centre pixel in channel c (zero for c >= C_{l-1}), a fixed
convolution, so that a deep model starts near the shallow one on its input (Sun, Shi, Wilson & Grosse, "Scalable
Variational Gaussian Processes via Harmonic Kernel Decomposition", ICML 2021, whose CIFAR-10 models these are).

q over a hidden layer's inducing outputs V [M, C] (whitened, U = L V with L L^T = Kuu) is matrix normal,
``vec V ~ N(vec Mu, Sigma_o (x) Sigma_i)`` with Sigma_i [M, M] over inducing patches and Sigma_o [C, C] over
channels (Park, Tagade & Choi, "Deep Matrix-Variate Gaussian Processes", 2018), per harmonic block t with harmonic
inducing patches (:mod:`gpscale.models.conv.features`). Each patch location's output is then Gaussian over the channels:

    mean = m(x^[p]) + sum_t A_t^T Mu_t,    cov = sum_t |Li_t^T a_t|^2 Sigma_o,t + (k(x^[p], x^[p]) - sum_t |a_t|^2) I,

with a_t = L_t^{-1} k_t(Z_t, x^[p]), and every location is drawn from it independently (as the HKD authors' code
and Blomqvist et al.'s): the reparameterised draws carry an image through the layers (Salimbeni & Deisenroth,
"Doubly Stochastic Variational Inference for Deep Gaussian Processes", NeurIPS 2017). The ELBO is

    num_data / b sum_{i in batch} 1/S sum_s E_{q(f | X_{L-1}^(s))} log p(y_i | f)  -  KL_out  -  sum_{l, t} KL_l,t,

the output layer's expected log-likelihood in closed form or by quadrature on each draw, as the single-layer
engine computes it (:class:`~gpscale.models.variational.engine.VariationalGP`), and KL_l,t the matrix-normal KL. The
latent predictive is an equal-weight mixture over ``predict_samples`` draws, over which the estimators average the
likelihood's predictive.

The draws of a row are a function of the row (its bytes in float32) and a key alone
(:func:`~gpscale.models.conv.hashed_draws.row_noise`), so that a row's objective and prediction do not depend on
the batch, chunk or process it comes in, nor on the dtype.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ...defaults import TrainingDefaults
from ...distributed import LOCAL, Comm
from ...kernels import SOFTPLUS_ZERO, Stationary, inverse_softplus, make_kernel
from ...kernels.harmonic import GroupAction, check_invariant
from ...kernels.patches import CHUNK_ENTRIES, PatchGeometry
from ...linalg import CORE, logdet_from_cholesky, solve_lower
from ...memory import check_tensors_fit_once
from ...options import check_options
from ..variational.engine import VariationalGP
from ..base import BenchSize, NotFittedPosteriorError, PredictiveFactors, mixture_moments, register
from .features import ConvolutionalFeatures, kmeans_patches
from .architecture import architecture, layer_geometries
from .convgp import CONV_GROUPS, PAPER_OUTPUTSCALE, patch_group, patch_median_distance
from .from_options import conv_kernel
from .hashed_draws import PRIME, row_noise
from ..harmonic.hvgp import HarmonicFeatures
from ..inducing import InducingPoints, jittered_cholesky

__all__ = ["DeepConvHVGP", "HiddenConvLayer", "identity_filter", "matrix_normal_kl"]

def identity_filter(geometry: PatchGeometry, channels: int) -> Tensor:
    """The identity-filter mean as a fixed linear map of patches [d, C]: output channel c is input channel c of the
    patch's centre pixel (row fh // 2, column fw // 2, as the HKD authors' code), for c < min(C_in, C); the other
    output channels have mean zero."""
    fh, fw = geometry.filter
    c_in = geometry.channels
    centre = ((fh // 2) * fw + fw // 2) * c_in  # the centre pixel's first coordinate in a patch [fh, fw, C_in]
    W = torch.zeros(geometry.patch_dim, channels)
    for c in range(min(c_in, channels)):
        W[centre + c, c] = 1.0
    return W


def matrix_normal_kl(q_mu: Tensor, L_in: Tensor, L_out: Tensor) -> Tensor:
    """``KL(MN(Mu, Sigma_i, Sigma_o) || N(0, I))`` for ``vec V ~ N(vec Mu, Sigma_o (x) Sigma_i)``, summed over leading
    (block) axes, with Mu [..., M, C], Sigma_i = L_in L_in^T [..., M, M], Sigma_o = L_out L_out^T [..., C, C]:

        1/2 (tr Sigma_o tr Sigma_i + |Mu|_F^2 - M C - C log|Sigma_i| - M log|Sigma_o|),

    the Gaussian KL with ``tr(A (x) B) = tr A tr B`` and ``log|A (x) B| = C log|A| + M log|B|``."""
    m, c = q_mu.shape[-2:]
    trace = (L_in**2).sum((-2, -1)) * (L_out**2).sum((-2, -1))
    logdet = c * logdet_from_cholesky(L_in) + m * logdet_from_cholesky(L_out)
    return 0.5 * (trace.sum() + (q_mu**2).sum() - q_mu.numel() - logdet.sum())


class HiddenConvLayer(nn.Module):
    """A hidden convolutional GP layer: images [n, H W C_in] -> feature maps [n, H' W' C] (rows flattened
    row-major over [H', W', C], as images are), C output GPs over the input's patches with a matrix-normal q per
    block (see the module docstring).

    Args:
        geometry: the patches of the layer's input image (its shape, filter, stride, padding).
        channels: C, the output channels.
        m: inducing patches (per block).
        action: a group of patch negations (T blocks of harmonic inducing patches), or None (plain, T = 1).
        patch_kernel: k_patch on patch vectors [r, fh fw C_in].
        jitter: added to Kuu's diagonal.
        q_scale: Sigma_o's Cholesky factor starts at ``q_scale I`` (the HKD authors' code: 1e-5), so the layer starts
            near its mean and its q near a point mass; Sigma_i's starts at I, Mu at 0.

    Parameters: the features' Z [(T,) M, d], ``q_mu`` [T, M, C], ``q_in_sqrt_raw`` [T, M, M] and ``q_out_sqrt_raw``
    [T, C, C] (lower triangles used); buffer ``mean_filter`` [d, C] (:func:`identity_filter`, not trained).
    """

    def __init__(self, geometry: PatchGeometry, channels: int, m: int, action: GroupAction | None, patch_kernel,
                 jitter: float, q_scale: float):
        super().__init__()
        self.geometry = geometry
        self.channels = int(channels)
        self.jitter = float(jitter)
        d, m = geometry.patch_dim, int(m)
        if action is None:
            self.features = InducingPoints(patch_kernel, m, d)
            self.blocks = 1
        else:
            self.features = HarmonicFeatures(patch_kernel, action, m, d)
            self.blocks = self.features.blocks
        T, C = self.blocks, self.channels
        self.q_mu = nn.Parameter(torch.zeros(T, m, C))
        self.q_in_sqrt_raw = nn.Parameter(torch.eye(m).expand(T, m, m).clone())
        self.q_out_sqrt_raw = nn.Parameter(q_scale * torch.eye(C).expand(T, C, C).clone())
        self.register_buffer("mean_filter", identity_filter(geometry, C))

    @property
    def out_shape(self) -> tuple[int, int, int]:
        """(H', W', C) of the feature map."""
        return (*self.geometry.out_shape, self.channels)

    @property
    def noise_dim(self) -> int:
        """Standard normal numbers one draw of an image's feature map takes: (T + 1) P C (a C-vector per block and
        one for the Nyström residual, at each of the P locations)."""
        return (self.blocks + 1) * self.geometry.n_patches * self.channels

    @property
    def patch_kernel(self):
        return self.features.kernel

    @property
    def q_in_sqrt(self) -> Tensor:
        return torch.tril(self.q_in_sqrt_raw)

    @property
    def q_out_sqrt(self) -> Tensor:
        return torch.tril(self.q_out_sqrt_raw)

    def kl(self) -> Tensor:
        """The sum over blocks of the matrix-normal KL of q from the whitened prior N(0, I), float64."""
        return matrix_normal_kl(self.q_mu.to(CORE), self.q_in_sqrt.to(CORE), self.q_out_sqrt.to(CORE))

    def patches(self, X: Tensor) -> Tensor:
        """The patches [n P, d] of the images X [n, H W C_in]."""
        return self.geometry.extract(X).reshape(-1, self.geometry.patch_dim)

    def mean_map(self, X: Tensor) -> Tensor:
        """The identity-filter mean of the feature map [n, P C] of images X [n, H W C_in]."""
        return (self.patches(X) @ self.mean_filter.to(X.dtype)).reshape(X.shape[0], -1)

    def moments(self, patches: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """At patches [r, d]: the mean [r, C] (identity filter plus ``sum_t A_t^T Mu_t``), the blocks' variance
        factors ``|Li_t^T a_t|^2`` [T, r] (block t's covariance over channels is this times Sigma_o,t) and the
        Nyström residual ``k(x, x) - sum_t |a_t|^2`` [r] (times I over channels)."""
        T, m = self.blocks, self.q_mu.shape[-2]
        check_tensors_fit_once(self.__dict__.setdefault("_batch_shapes_fit", set()), (T * m, patches.shape[0]),
                               patches.dtype, copies=3, device=self.q_mu.device,
                               what=f"The hidden layer's covariance K_uf of {T * m:,} inducing patches with the "
                                    f"{patches.shape[0]:,} patches of a batch (and L^-1 K_uf and S^T L^-1 K_uf)",
                               advice="Use a smaller batch_size= (training) or chunk_size= (prediction), or fewer "
                                      "hidden inducing patches (hidden_inducing=...).")
        Lu = jittered_cholesky(self.features.Kuu(), self.jitter).reshape(T, m, m)  # [T, M, M]
        Kuf = self.features.Kuf(patches).reshape(T, m, -1)  # [T, M, r]
        A = solve_lower(Lu.to(patches.dtype), Kuf)  # L_t^{-1} Kuf, [T, M, r]
        mean = patches @ self.mean_filter.to(patches.dtype) + torch.einsum("tmr,tmc->rc", A, self.q_mu)
        LA = self.q_in_sqrt.mT @ A  # [T, M, r]
        # k(x, x) - sum_t |a_t|^2 >= 0 in exact arithmetic: the clamp removes round-off only
        residual = (self.features.Kff_diag(patches) - (A * A).sum((0, 1))).clamp_min(0.0)
        return mean, (LA * LA).sum(1), residual

    def sample(self, X: Tensor, noise: Tensor) -> Tensor:
        """A draw of the feature maps [n, P C] of images X [n, H W C_in] from standard normal ``noise``
        [n, (T + 1) P C]: at each location, ``mean + sum_t sqrt(v_t) L_out,t e_t + sqrt(residual) e_0``."""
        n, P, C, T = X.shape[0], self.geometry.n_patches, self.channels, self.blocks
        mean, variance, residual = self.moments(self.patches(X))
        e = noise.reshape(n, T + 1, P, C).transpose(0, 1).reshape(T + 1, n * P, C)
        # a square root's gradient is infinite at 0: the floor keeps it finite where a variance vanishes
        tiny = torch.finfo(X.dtype).tiny
        blocks = variance.clamp_min(tiny).sqrt().unsqueeze(-1) * (e[:T] @ self.q_out_sqrt.mT)  # [T, n P, C]
        draw = mean + blocks.sum(0) + residual.clamp_min(tiny).sqrt().unsqueeze(-1) * e[T]
        return draw.reshape(n, P * C)

    @torch.no_grad()
    def initialise_from_images(self, X: Tensor, seed: int = 0) -> None:
        """Inducing patches at k-means centres of a seeded sample of the patches of X (the same for every block);
        for harmonic blocks, first check that the patch kernel is invariant to the group on a sample of patches."""
        Z, _ = kmeans_patches(X, self.geometry, self.q_mu.shape[-2], seed)
        if self.blocks > 1:
            sample, _ = self.geometry.sample(X, 64, seed + 1)
            atol = 1e-10 if X.dtype == torch.float64 else 1e-4
            check_invariant(self.patch_kernel, self.features.action, sample.to(self.features.Z.dtype), atol=atol)
        self.features.Z.copy_(Z.to(self.features.Z).expand_as(self.features.Z))

    @torch.no_grad()
    def initialise_lengthscale_at_median(self, X: Tensor, seed: int = 0) -> None:
        """The patch kernel's lengthscale at the median distance between sampled patches of X."""
        median = torch.tensor(patch_median_distance(X, self.geometry, seed), dtype=torch.float64)
        self.patch_kernel.raw_lengthscale.fill_(inverse_softplus(median).item())


@register("deep-conv-hvgp")
class DeepConvHVGP(VariationalGP):
    """Deep convolutional GP with harmonic inducing patches in every layer (or plain ones: ``group=None``), trained
    by doubly stochastic variational inference (see the module docstring).

    The HKD paper's CIFAR-10 rows "384xl, 1K": l hidden layers of 384 inducing patches (per block) and 1,000 in the
    output layer, patch kernels RBF (lengthscale and variance 5), 270,000 Adam steps on P100 GPUs. The defaults
    keep its architectures (Table 3) and sample counts, and scale the inducing patches down for a CPU.

    Args:
        image_shape: the images' (H, W) or (H, W, C), one entry may be -1; None: square single-channel images (as
            conv-hvgp's).
        n_layers: L, the layers (L - 1 hidden ones and the output layer). Default 2: the paper's 2-layer net.
        filter_sizes, strides: one per layer (an int or a (height, width) pair each), the input's first. None: the
            paper's Table 3 for n_layers 1 to 3: filters 5 / 5, 4 / 5, 4, 5 and strides 1 / 1, 2 / 1, 2, 1.
        hidden_channels: the output channels of the hidden layers, an int for all or one per hidden layer. None:
            10 each (the paper's 2- and 3-layer nets).
        padding: ``'valid'`` (default: the HKD authors' code for these nets) or ``'same'``, every layer.
        n_inducing: inducing patches of the output layer, per block (paper 1,000; default 128).
        hidden_inducing: inducing patches of each hidden layer, per block (paper 384; default 16: with the default
            checkerboard, 4 x 16 = 64 inducing variables a layer, whose orbits of 4 patch maps give 256 patches to
            evaluate each input patch against; pass more with group=None, which has one block). Every layer's
            start at k-means centres of its input's patches, the hidden layers' inputs being the images through
            the identity-filter means of the layers below (the paper forwards them through a random Xavier
            convolutional net instead: the means are what a layer sees at the start, apart from the GPs' part).
        group: ``'checkerboard'`` (default; T = 4 blocks per layer, the paper's 4xM, its best NLL at every depth),
            ``'negation'`` (T = 2, its 2xM) or None: plain inducing patches in every layer, the paper's "M" rows
            (a deep convolutional SVGP). One option instead of a second registered key: the architectures, q and
            training are the same, and the group is what the paper's rows vary.
        tick, location_weights: the output layer's TICK location kernel (default True: the paper's) and learned
            location weights (default False), as conv-hvgp's.
        train_samples: draws of the hidden layers per image in each step (default 1, the paper's).
        predict_samples: draws per image that the predictive averages over (default 5, the paper's).
        predict_seed: the key of the prediction draws (default 0): a prediction is a function of the image and
            the trained model alone.
        hidden_q_scale: the start of each hidden layer's Sigma_o Cholesky factor, times I (default 1e-5, the
            authors' code): the layers start near their means.
        kernel, ard, lengthscale, outputscale: every layer's patch kernel (a name: default ``'rbf'`` with one
            lengthscale; ``'median'`` or the estimators' default start each layer's lengthscale at the median
            distance between its input's patches; outputscale 5, the paper's).
        **kwargs: ``likelihood``, ``n_classes``, ``jitter``, ``natural_gradients`` (for the output layer's q; the
            hidden layers' q move with Adam), ``natgrad_step``, ``chunk_size`` and the other options of
            :class:`~gpscale.models.variational.engine.VariationalGP` (q is whitened in every layer).
    """

    default_training = TrainingDefaults("adam", lr=0.01, batch_size=64, max_steps=200)  # conv-hvgp's rate and batch
    auto_dtype = "float32"  # faster than float64 at the same accuracy
    floor_sizes = {"small": BenchSize(2000, 64, {"image_shape": (8, 8), "filter_sizes": (3, 3), "strides": (1, 1),
                                                 "hidden_channels": 4, "hidden_inducing": 16, "n_inducing": 16}, 64),
                   "paper": BenchSize(10000, 784, {"image_shape": (28, 28)}, 64)}

    def __init__(self, n_features: int, image_shape=None, n_layers: int = 2, filter_sizes=None, strides=None,
                 hidden_channels=None, padding: str = "valid", n_inducing: int = 128, hidden_inducing: int = 16,
                 group: str | None = "checkerboard", tick: bool = True, location_weights: bool = False,
                 train_samples: int = 1, predict_samples: int = 5, predict_seed: int = 0,
                 hidden_q_scale: float = 1e-5, *, kernel: str = "rbf", ard: bool = False,
                 lengthscale: float | str = SOFTPLUS_ZERO, outputscale: float = PAPER_OUTPUTSCALE, **kwargs):
        key = self.key
        check_options({"n_layers": n_layers, "n_inducing": n_inducing, "hidden_inducing": hidden_inducing,
                       "train_samples": train_samples, "predict_samples": predict_samples,
                       "predict_seed": predict_seed, "hidden_q_scale": hidden_q_scale, "lengthscale": lengthscale,
                       "outputscale": outputscale})
        for name, value in (("tick", tick), ("location_weights", location_weights), ("ard", ard)):
            if not isinstance(value, bool):
                raise ValueError(f"{key}: {name} must be True or False, got {value!r}.")
        if group is not None and group not in CONV_GROUPS:
            raise ValueError(f"{key}: group must be one of {CONV_GROUPS} ('negation': T = 2 blocks per layer, "
                             f"'checkerboard': T = 4) or None (plain inducing patches), got {group!r}.")
        if not isinstance(kernel, str):
            raise ValueError(f"{key}: kernel must be a kernel's name (e.g. 'rbf'), from which every layer builds its "
                             f"patch kernel for its own patch size; got a {type(kernel).__name__}.")
        if kwargs.get("whiten", True) is not True:
            raise ValueError(f"{key}: q is whitened in every layer; whiten={kwargs['whiten']!r} is not available.")
        filters, steps, channels = architecture(n_layers, filter_sizes, strides, hidden_channels, key)
        geometries = layer_geometries(image_shape, n_features, filters, steps, channels, padding, key)
        start = SOFTPLUS_ZERO if lengthscale == "median" else lengthscale
        patch_options = {"ard": ard, "outputscale": outputscale, "lengthscale": start}
        output = conv_kernel(kernel, geometries[-1], location_weights, tick, key, **patch_options)
        chunk_given = "chunk_size" in kwargs
        super().__init__(n_features, kernel=output, **kwargs)
        self.median_lengthscale = lengthscale == "median"
        self.group = group
        self.n_inducing, self.hidden_inducing = int(n_inducing), int(hidden_inducing)
        self.train_samples, self.predict_samples = int(train_samples), int(predict_samples)
        self.predict_seed = int(predict_seed)
        self.hidden = nn.ModuleList([
            HiddenConvLayer(geometry, c, self.hidden_inducing, self._action(geometry, layer),
                            make_kernel(kernel, geometry.patch_dim, **patch_options), self.jitter, hidden_q_scale)
            for layer, (geometry, c) in enumerate(zip(geometries, channels))])
        self.features = ConvolutionalFeatures(self.kernel, self.n_inducing, self._action(geometries[-1], -1))
        self.initialise_q(self.n_inducing, blocks=self.features.blocks)
        if not chunk_given:  # a chunk's patches over every layer and prediction draw near 2^22 numbers
            per_image = self.predict_samples * sum(g.n_patches * g.patch_dim for g in geometries)
            self.chunk_size = int(max(16, min(self.chunk_size, CHUNK_ENTRIES // per_image)))

    def _action(self, geometry: PatchGeometry, layer: int) -> GroupAction | None:
        if self.group is None:
            return None
        return patch_group(self.group, geometry, self.key, option=f"filter_sizes[{layer}]")

    @property
    def noise_dim(self) -> int:
        """Standard normal numbers one draw of an image through the hidden layers takes."""
        return sum(layer.noise_dim for layer in self.hidden)

    # --- draws through the hidden layers ------------------------------------------------------------------
    def propagate(self, X: Tensor, samples: int, key: int | Tensor) -> Tensor:
        """``samples`` draws of the last hidden layer's feature maps [samples n, D] for images X [n, H W C], draw s
        of row i at row ``s n + i``, from :func:`row_noise` with ``key``; X itself without hidden layers."""
        if not self.hidden:
            return X
        n = X.shape[0]
        noise = row_noise(X, key, samples * self.noise_dim).to(X.dtype)
        noise = noise.reshape(n, samples, self.noise_dim).transpose(0, 1).reshape(samples * n, self.noise_dim)
        H, offset = X.repeat(samples, 1), 0
        for layer in self.hidden:
            H = layer.sample(H, noise[:, offset:offset + layer.noise_dim])
            offset += layer.noise_dim
        return H

    def draw_key(self, X: Tensor) -> Tensor:
        """A fresh key for a training draw (a 0-dim int64 tensor on X's device), from torch's generator there
        (seeded by training, and the same on every process of a data-parallel job, so that they draw alike)."""
        return torch.randint(PRIME, (), device=X.device)

    def hidden_kl(self) -> Tensor:
        """The sum of the hidden layers' matrix-normal KLs (float64)."""
        return sum((layer.kl() for layer in self.hidden), torch.zeros((), dtype=CORE, device=self.q_mu.device))

    # --- the objective ------------------------------------------------------------------------------------
    def elbo(self, X: Tensor, y: Tensor, num_data: int, q_mu: Tensor | None = None,
             q_sqrt: Tensor | None = None) -> Tensor:
        """Unbiased estimate of the ELBO from ``train_samples`` draws of the minibatch's hidden layers: the output
        layer's ELBO on the draws (each row's expected log-likelihood averaged over its draws) less the hidden
        layers' KLs."""
        if self.hidden:
            key = self.draw_key(X)  # drawn on every process, rows or not, to keep their generators alike
            if X.shape[0]:
                X, y = self.propagate(X, self.train_samples, key), y.repeat(self.train_samples)
        return super().elbo(X, y, num_data, q_mu, q_sqrt) - self.hidden_kl()

    def natural_gradient_step(self, X: Tensor, y: Tensor, num_data: int, comm: Comm = LOCAL,
                              share: float = 1.0) -> None:
        """The engine's natural-gradient step on the output layer's q, at a draw of the batch's hidden layers."""
        if not self.natural_gradients:
            return
        if self.hidden:
            key = self.draw_key(X)
            if X.shape[0]:
                with torch.no_grad():
                    X, y = self.propagate(X, self.train_samples, key), y.repeat(self.train_samples)
        super().natural_gradient_step(X, y, num_data, comm, share)

    # --- initialisation -----------------------------------------------------------------------------------
    def start_lengthscale_at_median(self) -> bool:
        """Start every layer's patch lengthscale at the median distance between its input's patches if every patch
        kernel is stationary."""
        kernels = [self.kernel.patch_kernel, *(layer.patch_kernel for layer in self.hidden)]
        self.median_lengthscale = self.median_lengthscale or all(isinstance(k, Stationary) for k in kernels)
        return self.median_lengthscale

    @torch.no_grad()
    def initialise(self, X: Tensor, y: Tensor, seed: int = 0) -> None:
        """Layer by layer from the input: the median heuristic on the layer's input patches (if asked for), then
        its inducing patches by k-means; the next layer's input is this one's identity-filter mean."""
        for layer in self.hidden:
            if self.median_lengthscale:
                layer.initialise_lengthscale_at_median(X, seed)
            layer.initialise_from_images(X, seed)
            X = layer.mean_map(X)
        if self.median_lengthscale:
            median = patch_median_distance(X, self.kernel.geometry, seed)
            self.kernel.patch_kernel.raw_lengthscale.fill_(inverse_softplus(torch.tensor(median)).item())
        self.features.initialise_from_images(X, seed)
        self.initialise_q_at_prior()

    def initialise_from_data(self, X: Tensor, y: Tensor, seed: int = 0) -> None:
        median, self.median_lengthscale = self.median_lengthscale, False
        try:
            self.initialise(X, y, seed)
        finally:
            self.median_lengthscale = median

    # --- prediction ---------------------------------------------------------------------------------------
    def mixture_chunk(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """The latent predictive at images X [c, ...] as ``predict_samples`` Gaussians: means and variances
        [S, c] (or [S, c, C]), one per draw of the hidden layers (S = 1 without hidden layers)."""
        samples = self.predict_samples if self.hidden else 1
        mean, variance = super().predict_chunk(self.propagate(X, samples, self.predict_seed))
        shape = (samples, X.shape[0], *mean.shape[1:])
        return mean.reshape(shape), variance.reshape(shape)

    def predict_chunk(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """The mixture's mean and variance (:func:`mixture_moments`)."""
        return mixture_moments(*self.mixture_chunk(X))

    @torch.no_grad()
    def predict_mixture(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """The latent predictive at X [n*, ...] as an equal-weight mixture: means and variances [S, n*] (or
        [S, n*, C]), chunked as :meth:`predict`."""
        if not self.cache:
            raise NotFittedPosteriorError(
                f"The {self.key} model has no posterior yet: call fit_posterior(X, y) after training.")
        return self.in_chunks(self.mixture_chunk, X, self.chunk_size, dim=1)

    def predictive_factors(self, X: Tensor) -> PredictiveFactors:
        if self.hidden:
            raise NotImplementedError(f"{self.key} with hidden layers has a mixture for its latent predictive, not a "
                                      "joint Gaussian: use the marginal predictive (predict) instead.")
        return super().predictive_factors(X)

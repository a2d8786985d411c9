"""HVGP: the harmonic variational GP (Sun, Shi, Wilson & Grosse 2021, "Scalable Variational Gaussian
Processes via Harmonic Kernel Decomposition", ICML).

A kernel invariant under a finite abelian group of input maps G splits into T real sub-kernels
``k_t(x, x') = sum_s W[t, s] k(x, G^s x')`` (:mod:`gpscale.kernels.harmonic`) that sum to k and have orthogonal
RKHSs, so f = sum_t f_t with independent f_t ~ GP(0, k_t). HVGP gives each f_t its own inducing inputs Z_t
[m, d] and its own whitened q(v_t), u_t = L_t v_t with L_t L_t^T = k_t(Z_t, Z_t): K_uu is block diagonal, and
T m inducing variables cost O(T m^3) instead of O(T^3 m^3). The blocks run through the SVGP engine
(:class:`~gpscale.models.variational.engine.VariationalGP` with T blocks):

    q(f(x)) = N(sum_t a_t^T m_t,  k(x, x) - sum_t a_t^T a_t + sum_t |S_t^T a_t|^2),   a_t = L_t^{-1} k_t(Z_t, x)

With ``shared_inducing=True`` every block uses the same Z (the paper's TRAN-S): one orbit of Z serves all blocks.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import Tensor, nn

from ...defaults import CONVERGENCE, TrainingDefaults
from ...kernels import Kernel
from ...kernels.harmonic import (CyclicShift, GroupAction, Identity, ImageFlip, ImageRoll, LongitudeRotation, Negation,
                                Product, block_harmonic_grams, check_invariant, harmonic_gram, negation_basis,
                                orbit_gram, pca_directions)
from ...kernels.stationary import weighted_grams
from ...linalg import solve_lower
from ..variational.engine import VariationalGP
from ..base import BenchSize, register
from ..inducing import InducingFeatures, kmeans_centers

__all__ = ["HarmonicFeatures", "HVGP"]


ALL = slice(None)
KUF_CHUNK_BYTES = 8 << 20  # on the CPU: a quarter of glibc's largest mmap threshold (see HarmonicFeatures.Kuf)
DEVICE_KUF_CHUNK_BYTES = 256 << 20  # elsewhere: chunks bound memory only, and each costs its own kernel launches


def kernel_on(kernel: Kernel, device: torch.device):
    """k with its hyperparameters copied, differentiably, to ``device``: the kernel itself where they are there."""
    state = dict(kernel.named_parameters()) | dict(kernel.named_buffers())
    if all(t.device == device for t in state.values()):
        return kernel
    moved = {name: t.to(device) for name, t in state.items()}
    return lambda X1, X2: torch.func.functional_call(kernel, moved, (X1, X2))


class HarmonicFeatures(InducingFeatures):
    """``u_t = sum_s W[t, s] f(G^s z_t)`` for T blocks of m inducing inputs: Kuu [T, m, m], Kuf [T, m, c].

    Args:
        kernel: a kernel invariant under ``action``.
        action: the group (:class:`~gpscale.kernels.harmonic.GroupAction`).
        m: inducing inputs per block; d: input dimension.
        shared: one Z [m, d] for every block, else Z [T, m, d].
        rotated: the kernel, the group and Z act on the inputs' coordinates in an orthonormal basis B [d, d] (the
            buffer ``basis``, the identity until set): k(B^T x, B^T x') with u_t built on Z_t in those coordinates.
    """

    def __init__(self, kernel: Kernel, action: GroupAction, m: int, d: int, shared: bool = False,
                 rotated: bool = False):
        super().__init__()
        self.kernel = kernel
        self.action = action
        self.blocks = action.n_subkernels
        self.num_inducing = self.blocks * int(m)
        self.shared = bool(shared)
        self.Z = nn.Parameter(torch.zeros(m, d) if shared else torch.zeros(self.blocks, m, d))
        self.register_buffer("basis", torch.eye(d) if rotated else None)

    def coordinates(self, X: Tensor) -> Tensor:
        """X [n, d] in the coordinates the features work in: X B where ``rotated``, else X."""
        return X if self.basis is None else X @ self.basis.to(X)

    def Kuf(self, X: Tensor, blocks: slice = ALL) -> Tensor:
        """``k_t(Z_t, X)`` [T, m, c] for the blocks t in ``blocks``, on X's device: the sub-kernel of each block,
        never k; the orbit is taken of Z (k_t is symmetric), so its size does not grow with the batch.

        Formed in chunks of blocks (and of rows, where one block's would be too large) whose kernel matrix
        against the orbits holds at most :data:`KUF_CHUNK_BYTES`: the kernel's element-wise passes each make a temporary
        of that size, and glibc's malloc maps every block above its threshold (32 MiB at most) afresh and unmaps it
        when freed, so the kernel faults in and zeroes its pages again in every step; below it, freed memory is
        reused, and a step is shorter with fewer page faults and a lower peak. On other devices (a GPU's caching
        allocator keeps freed memory) the chunks hold up to :data:`DEVICE_KUF_CHUNK_BYTES`: there a step costs about
        a kernel launch per operator, and chunks of one block would about double a step's operators (the
        measurements behind both sizes are on the HVGP lab notes page)."""
        kernel = kernel_on(self.kernel, X.device)
        X = self.coordinates(X)
        W = self.action.weights(X.dtype, X.device)[blocks]  # block t takes row t
        if self.shared:  # one orbit serves every block
            return torch.einsum("ts,sij->tji", W, orbit_gram(kernel, self.action, X, self.Z.to(X.device)))
        Z = self.Z[blocks].to(X.device)
        T, m, d = Z.shape
        orbits = self.action.orbit(Z.reshape(T * m, d)).view(-1, T, m, d).transpose(0, 1)  # [T, S, m, d]
        budget = KUF_CHUNK_BYTES if X.device.type == "cpu" else DEVICE_KUF_CHUNK_BYTES
        rows = max(1, budget // (orbits.shape[1] * m * X.element_size()))  # against one block's orbit
        row_chunks = X.split(rows) if rows < X.shape[0] else (X,)
        per_chunk = max(1, rows // max(1, X.shape[0]))  # blocks in a chunk (a rank may hold no rows of a batch)

        def blocks_from(t: int) -> Tensor:  # blocks t .. t + per_chunk - 1, against every chunk of rows
            parts = [_weighted_orbit_gram(kernel, part, orbits[t:t + per_chunk], W[t:t + per_chunk])
                     for part in row_chunks]
            return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

        chunks = [blocks_from(t) for t in range(0, T, per_chunk)]
        return chunks[0] if len(chunks) == 1 else torch.cat(chunks)

    def Kuu(self, blocks: slice = ALL, device: torch.device | None = None) -> Tensor:
        """``k_t(Z_t, Z_t)`` [T, m, m] for the blocks in ``blocks``, on ``device`` (default: Z's), from half the
        orbit and symmetric by construction (Cholesky reads only one triangle, so an asymmetric K_uu would give a
        silently wrong factor)."""
        device = self.Z.device if device is None else device
        kernel = kernel_on(self.kernel, device)
        if self.shared:
            return harmonic_gram(kernel, self.action, self.Z.to(device))[blocks]
        ts = list(range(self.blocks)[blocks])  # each block against its own orbit only
        Z = self.Z[blocks].to(device)
        if self.kernel.takes_batches:
            return block_harmonic_grams(kernel, self.action, Z, ts)
        return torch.stack([harmonic_gram(kernel, self.action, Zt, t) for t, Zt in zip(ts, Z)])

    def Kff_diag(self, X: Tensor) -> Tensor:
        return self.kernel.diag(self.coordinates(X))  # k(x, x) = sum_t k_t(x, x)


def _weighted_orbit_gram(kernel, X: Tensor, orbits: Tensor, W: Tensor) -> Tensor:
    """``sum_s W[t, s] k(G^s Z_t, X)`` [T, m, c] from the orbits [T, S, m, d] of T blocks, in one kernel evaluation
    (:meth:`~gpscale.kernels.Kernel.weighted_grams`; ``kernel`` may be :func:`kernel_on`'s copy on another device)."""
    if isinstance(kernel, Kernel):
        return kernel.weighted_grams(orbits, X, W)
    return weighted_grams(kernel, orbits, X, W)


GROUPS = ("auto", "negation", "pca_negation", "pixel_negation", "cyclic_shift", "longitude", "image_roll",
          "image_flip", "identity")
# the groups whose kernel, group and Z act on the inputs' coordinates in a basis taken from the training inputs
_ROTATED_GROUPS = ("auto", "pca_negation")
# an ARD kernel is not invariant to these: they mix coordinates
_ISOTROPIC_GROUPS = ("cyclic_shift", "longitude", "image_roll", "image_flip")


def make_group(name: str, n_features: int, *, n_ways: int, period: int, image_shape: tuple[int, int],
               step: int) -> GroupAction:
    """The action called ``name`` (:data:`GROUPS`) on R^d, in the coordinates the features work in (for
    ``'auto'`` and ``'pca_negation'``, those of the basis :meth:`HVGP.initialise_from_data` picks)."""
    if name in ("pixel_negation", "auto", "pca_negation"):
        # way j negates the coordinates j, J + j, 2J + j, ... (interleaved sets)
        if not 1 <= n_ways <= n_features:
            raise ValueError(f"n_ways={n_ways} must be between 1 and the {n_features} input columns.")
        return Product([Negation(dims=range(j, n_features, n_ways)) for j in range(n_ways)])
    if name == "longitude":
        if n_features != 3:
            raise ValueError(f"group='longitude' rotates 3-D unit vectors (the sphere embedding of (lon, lat)); the "
                             f"inputs have {n_features} columns.")
        return LongitudeRotation(period)
    if name in ("image_roll", "image_flip"):
        height, width = image_shape
        if height * width != n_features:
            raise ValueError(f"group={name!r} acts on flattened {height} x {width} images, but the inputs have "
                             f"{n_features} columns: pass image_shape=(height, width).")
        if name == "image_roll":  # translations by step pixels along rows and columns, on the torus
            return Product([ImageRoll(height, width, step, axis) for axis in (0, 1)])
        return Product([ImageFlip(height, width, axis) for axis in (0, 1)])
    return {"negation": Negation, "identity": Identity,
            "cyclic_shift": lambda: CyclicShift(n_features=n_features)}[name]()


@register("hvgp")
class HVGP(VariationalGP):
    """Harmonic variational GP: T sub-GPs with their own inducing inputs and independent whitened q.

    Args:
        n_inducing: m, inducing inputs per sub-GP (T m in all; k-means initialised, the same for every block).
        group: the symmetry the kernel and, ideally, the inputs' distribution share (Thm 4.2):
            ``'auto'`` (default; ``n_ways`` negations of interleaved coordinate sets in the basis the training
            inputs pick, :func:`~gpscale.kernels.harmonic.negation_basis`: their axes where the columns are nearly
            uncorrelated, else their principal directions), ``'pca_negation'`` (``n_ways`` negations of interleaved
            PCA subspaces of the training inputs, T = 2^n_ways: the paper's regression benchmarks, with one shared
            lengthscale). Under both the kernel, the group and Z act on the inputs' coordinates in that basis, B^T x,
            so an ARD kernel stays invariant;
            ``'negation'`` (x -> -x, T = 2), ``'pixel_negation'``
            (``n_ways`` negations of interleaved coordinate sets: the paper's NEG on images), ``'cyclic_shift'``
            (roll the coordinates, P = d), ``'longitude'`` (rotate 3-D unit vectors about the z axis by
            360 / ``period`` degrees: the paper's Earth data), ``'image_roll'`` (cyclic translations of flattened
            images by ``step`` pixels along rows and columns: the paper's TRAN, T = 16 for 28 x 28 and step 4),
            ``'image_flip'`` (up-down and left-right flips, T = 4), ``'identity'`` (T = 1: SVGP); or a
            :class:`~gpscale.kernels.harmonic.GroupAction`.
        n_ways: J for ``'auto'``, ``'pca_negation'`` and ``'pixel_negation'`` (default None: 3, or d for inputs of
            fewer columns).
        period: P for ``'longitude'`` (default 12).
        image_shape, step: the images' (height, width) and the roll's step for the image groups (default (28, 28)
            and 4).
        shared_inducing: one Z for every block (the paper's TRAN-S), else one per block.
        devices: place the blocks on these devices (e.g. ``['cuda:0', 'cuda:1']``), in contiguous groups of
            near-equal size: each group's K_uu, Cholesky factor, K_uf and solves run on its device, and only the
            [c]-sized moments return to the model's device, where the parameters stay (the paper runs its 8 x M
            models on 8 GPUs). Each step copies the groups' Z and q there: T m (d + m) numbers.
        kernel, ard: default ``'matern32'``, with ARD lengthscales (``ard=None``) under ``group='auto'`` and
            one shared lengthscale under every other group (the paper's); an ARD kernel is refused under the groups
            that mix coordinates (shifts, rotations, image rolls and flips), to which it is not invariant.
        **kwargs: ``jitter`` and the options of :class:`GPModel`.

    Inputs should be centred (negation is about the origin): gpscale's standardisation does this.
    """

    # natural-gradient q and the cap as svgp's: a default fit is meant to end on the plateau rule, not the cap
    default_training = TrainingDefaults("adam", lr=0.1, max_steps=5000)
    # ARD lengthscales in the group's basis pass through long slow phases (the noise held high while they move):
    # a patience of 2 windows ends fits inside them, far from where they go on to
    default_convergence = replace(CONVERGENCE, patience=10)
    auto_dtype = "float32"  # faster than float64 at the same accuracy
    floor_sizes = {"small": BenchSize(2000, 8, {"n_inducing": 64}, 256),
                   "paper": BenchSize(13500, 26, {"n_inducing": 256}, 1024)}

    def __init__(self, n_features: int, n_inducing: int = 128, group: str | GroupAction = "auto",
                 n_ways: int | None = None, period: int = 12, image_shape: tuple[int, int] = (28, 28), step: int = 4,
                 shared_inducing: bool = False, devices: Sequence[str | torch.device] | None = None, *,
                 kernel: str | Kernel = "matern32", ard: bool | None = None, **kwargs):
        chunk_given = "chunk_size" in kwargs
        ard = isinstance(group, str) and group == "auto" if ard is None else ard
        super().__init__(n_features, kernel=kernel, ard=ard, **kwargs)
        if not isinstance(group, GroupAction) and group not in GROUPS:
            raise ValueError(f"group must be one of {GROUPS} or a GroupAction, got {group!r}.")
        if group in _ISOTROPIC_GROUPS and getattr(self.kernel, "ard", False) and self.n_features > 1:
            raise ValueError(f"group={group!r} mixes the input coordinates, so the kernel must have one shared "
                             "lengthscale to stay invariant: pass ard=False (the default for hvgp).")
        self.n_inducing = int(n_inducing)
        self.n_ways = min(3, self.n_features) if n_ways is None else int(n_ways)
        self.group, self.period = group, int(period)
        self.image_shape, self.step = tuple(int(n) for n in image_shape), int(step)
        self.features = HarmonicFeatures(self.kernel, self._action(), self.n_inducing, self.n_features,
                                         shared=shared_inducing, rotated=group in _ROTATED_GROUPS)
        self.initialise_q(self.n_inducing, blocks=self.features.blocks)
        self.devices = None if devices is None else tuple(torch.device(d) for d in devices)
        if self.devices is not None and not 1 <= len(self.devices) <= self.features.blocks:
            raise ValueError(f"devices must list 1 to T = {self.features.blocks} devices (one group of blocks "
                             f"each), got {len(self.devices)}.")
        if not chunk_given:
            # a chunk's kernel against every block's orbit is [c, S T m]: keep it near 2^22 entries (32 MB in
            # float64), so that a large orbit does not make a chunk of rows a kernel block of gigabytes
            orbit_points = self.features.action.order * self.features.num_inducing
            self.chunk_size = int(max(64, min(self.chunk_size, 2**22 // orbit_points)))

    # --- blocks placed on several devices --------------------------------------------------------------------
    def placement(self) -> list[tuple[slice, torch.device]]:
        """The blocks of each device in :attr:`devices`: contiguous groups whose sizes differ by at most one."""
        bounds = torch.linspace(0, self.features.blocks, len(self.devices) + 1).round().long().tolist()
        return [(slice(a, b), device) for a, b, device in zip(bounds, bounds[1:], self.devices)]

    def Lu(self) -> Tensor | list[Tensor]:
        """The factors of K_uu [T, m, m]; placed, one [T_g, m, m] per group, on its device."""
        if self.devices is None:
            return super().Lu()
        return [self.cholesky_Kuu(self.features.Kuu(blocks, device)) for blocks, device in self.placement()]

    def conditional(self, X: Tensor, Lu, q_mu: Tensor, q_sqrt: Tensor) -> tuple[Tensor, Tensor]:
        if self.devices is None:
            return super().conditional(X, Lu, q_mu, q_sqrt)
        moments = []
        for (blocks, device), L in zip(self.placement(), Lu):
            A = solve_lower(L.to(device=device, dtype=X.dtype), self.features.Kuf(X.to(device), blocks))
            group = self.whitened_moments(A, q_mu[blocks].to(device), q_sqrt[blocks].to(device))
            moments.append([t.to(X.device) for t in group])
        return self.marginals(self.features.Kff_diag(X), *(sum(parts) for parts in zip(*moments)))

    def projects(self, X: Tensor) -> bool:
        return self.devices is None and super().projects(X)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """As :meth:`GPModel.load_state_dict`; also reads the layout of earlier model files, which hold the PCA
        directions as ``pca_basis`` and a ``'pca_negation'`` model's Z in the inputs' coordinates: B = pca_basis
        and Z B for Z."""
        state = dict(state_dict)
        directions = state.pop("pca_basis", None)
        if directions is not None and self.features.basis is not None and "features.basis" not in state:
            state["features.basis"] = directions
            if "features.Z" in state:
                state["features.Z"] = state["features.Z"] @ directions.to(state["features.Z"])
        return super().load_state_dict(state, strict=strict, assign=assign)

    def _action(self) -> GroupAction:
        if isinstance(self.group, GroupAction):
            return self.group
        return make_group(self.group, self.n_features, n_ways=self.n_ways, period=self.period,
                          image_shape=self.image_shape, step=self.step)

    def initialise_from_data(self, X: Tensor, y: Tensor, seed: int = 0) -> None:
        with torch.no_grad():
            if self.features.basis is not None:  # the kernel, the group and Z see X B
                basis = pca_directions(X) if self.group == "pca_negation" else negation_basis(X, self.n_ways)
                self.features.basis.copy_(basis.to(self.features.basis))
                X = self.features.coordinates(X)
            # float32 kernels reproduce k(G x, G x') only to about 1e-6 of k
            atol = 1e-10 if X.dtype == torch.float64 else 1e-4
            check_invariant(self.kernel, self.features.action, X[: min(len(X), 64)], atol=atol)
            Z = kmeans_centers(X, self.n_inducing, seed)
            self.features.Z.copy_(Z if self.features.shared else Z.expand_as(self.features.Z))

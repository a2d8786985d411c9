"""Group actions and the real harmonic sub-kernels of the Harmonic Kernel Decomposition (HKD; Sun, Shi, Wilson &
Grosse, "Scalable Variational Gaussian Processes via Harmonic Kernel Decomposition", ICML 2021).

A finite abelian group acts on R^d through J commuting cyclic "ways" G_1..G_J with periods P_1..P_J
(``G_j^{P_j} = id``). Its S = prod_j P_j elements are numbered row-major over the multi-index (s_1..s_J),

    G^s = G_1^{s_1} o ... o G_J^{s_J},    s = ravel((s_1..s_J), (P_1..P_J)).

If k is invariant, ``k(G x, G x') = k(x, x')``, the discrete Fourier transform of ``s -> k(x, G^s x')`` splits it
into sub-kernels. Pairing the complex frequencies t and P - t gives the real form used here (the paper's Section 3.4):

    k_t(x, x') = sum_s W[t, s] k(x, G^s x'),    W = W(P_1) ⊗ ... ⊗ W(P_J)  [T, S],
    W(P)[t, s] = (c_t / P) cos(2 pi t s / P),   c_t = 1 if t = 0 or 2t = P else 2,   t = 0..floor(P/2),

so T = prod_j (floor(P_j / 2) + 1). Because ``sum_t W[t, s] = delta_{s0}``, ``sum_t k_t = k`` for any G; only
invariance makes each k_t symmetric and PSD and their RKHSs mutually orthogonal, so that f ~ GP(0, k) is a sum of
independent f_t ~ GP(0, k_t) (the HVGP sub-processes). :func:`check_invariant` tests it on sample points: an ARD
kernel is not invariant to PCA negations, rotations, coordinate shifts or image actions.

The orbit is always applied to the second argument (the inducing points, in HVGP), and every action is made of
differentiable tensor operations, so gradients reach the kernel hyperparameters and X2. Inputs are X [n, d];
images are flattened row-major over [height, width, channels] (channels last). Work in float64: k_t is a signed
sum of similar numbers, and in float32 the cancellation can cost the sub-kernel matrices their positive
semi-definiteness.
"""
from __future__ import annotations

import math
import operator

import torch
from torch import Tensor

from ..device import HostConstants
from .stationary import Kernel

__all__ = ["GroupAction", "Identity", "Negation", "SubspaceNegation", "pca_directions", "subspace_negations",
           "pca_negations", "CyclicShift", "OrthogonalAction", "LongitudeRotation", "sphere_embedding", "ImageRoll",
           "ImageFlip", "Product", "real_weights", "orbit_gram", "harmonic_kernels", "harmonic_kernel",
           "harmonic_gram", "block_harmonic_grams", "check_invariant"]


# the most numbers a linear action's orbit maps [S, d, d] may hold (64 MB in float64): beyond, the orbit is taken one
# element at a time (8 maps of 784 x 784, PCA negations of flattened MNIST images, are 4.9 million)
MAPS_ENTRIES = 2**23


def real_weights(P: int) -> Tensor:
    """The real-resolved DFT weights W(P) [floor(P/2) + 1, P] of one cyclic way (float64)."""
    P = operator.index(P)
    if P < 1:
        raise ValueError(f"A cyclic way has period P >= 1, got P={P}.")
    t = torch.arange(P // 2 + 1, dtype=torch.float64)
    s = torch.arange(P, dtype=torch.float64)
    # c_t = 2 pairs frequency t with P - t; t = 0 and t = P/2 are their own partners
    c = torch.full_like(t, 2.0)
    c[(t == 0) | (2 * t == P)] = 1.0
    # reducing t s mod P keeps the angle in [0, 2 pi), where cos is most accurate
    return c.unsqueeze(-1) / P * torch.cos(2 * math.pi * torch.remainder(t.outer(s), P) / P)


class GroupAction:
    """A finite abelian group acting on inputs X [n, d], as J commuting cyclic ways with ``periods`` (P_1..P_J).

    Subclasses set ``periods`` (and ``n_features``, the d they require, where they fix one) and implement
    ``_power(X, s)``, the element G^s for 0 <= s < S on already validated X.
    """

    periods: tuple[int, ...] = (1,)
    n_features: int | None = None

    @property
    def order(self) -> int:
        """S = prod_j P_j, the number of group elements."""
        return math.prod(self.periods)

    @property
    def n_subkernels(self) -> int:
        """T = prod_j (floor(P_j / 2) + 1), the number of real sub-kernels."""
        return math.prod(P // 2 + 1 for P in self.periods)

    def apply(self, X: Tensor, s: int) -> Tensor:
        """``G^s X`` [n, d] for X [n, d] and s in 0..S-1 (row-major over the ways' exponents)."""
        s = self._element(s)
        self._check_input(X)
        return self._power(X, s)

    def orbit(self, X: Tensor, elements: list[int] | None = None) -> Tensor:
        """``[G^s X for s in elements]`` [len(elements), n, d] (default: the whole orbit, s = 0..S-1): one batched
        product where the action is linear (:meth:`linear_maps`) and its maps hold at most :data:`MAPS_ENTRIES`
        numbers, else one application per element."""
        self._check_input(X)
        elements = list(range(self.order)) if elements is None else [self._element(s) for s in elements]
        d = X.shape[-1]
        if not self.is_linear or self.order * d * d > MAPS_ENTRIES:
            return torch.stack([self._power(X, s) for s in elements])
        maps = self.constants.get(("linear_maps", d, *elements), lambda: self.linear_maps(d)[elements], X.dtype,
                                  X.device)
        return X @ maps

    def _element(self, s: int) -> int:
        s = operator.index(s)
        if not 0 <= s < self.order:
            raise ValueError(f"Group element s={s} is outside 0..{self.order - 1} for {self!r}.")
        return s

    @property
    def is_linear(self) -> bool:
        """Whether the orbit is taken as dense matrix products on the rows, the matrices from :meth:`linear_maps`:
        for actions that are such products (:meth:`linear_rank` not None) and whose d x d map per element costs
        about what their own operations do. Reflections of total rank K take about 4 d K multiply-adds a row for
        each element's half of the ways, 2 d K on average, against d^2 for a map: linear where 2 K >= d (a PCA
        basis split among a few ways), not for a reflection of low rank in many dimensions. A subclass that changes
        ``_power`` must not inherit a rank, or its ``_power`` goes unused."""
        rank = self.linear_rank()
        return rank is not None and 2 * rank >= self.n_features

    def linear_rank(self) -> int | None:
        """The total rank of the ways' own products (d for a rotation, k for a reflection in span(U), U [d, k]);
        None for actions that are not dense matrix products (the default)."""
        return None

    def linear_maps(self, d: int) -> Tensor:
        """M [S, d, d] (float64) with ``G^s X = X M[s]`` for rows of d features, where :attr:`is_linear`: the orbit
        is then one batched product, where applying each element in turn took S chains of a few small operators
        each (with J subspace negations, 3 J products and passes for each of 2^J elements, and as many again
        backward)."""
        raise NotImplementedError(f"{self!r} is not a dense matrix product")

    def inverse(self, s: int) -> int:
        """The index of ``G^{-s}``: every way's exponent negated mod its period."""
        inverse, stride = 0, 1
        for P in reversed(self.periods):
            s, exponent = divmod(s, P)
            inverse += (-exponent % P) * stride
            stride *= P
        return inverse

    @property
    def constants(self) -> HostConstants:
        """The action's tensors, made on the host once and copied once to each device it acts on."""
        return vars(self).setdefault("_constants", HostConstants())

    def weights(self, dtype: torch.dtype = torch.float64, device=None) -> Tensor:
        """W = W(P_1) ⊗ ... ⊗ W(P_J) [T, S]: the Kronecker product matches the row-major numbering of s."""
        return self.constants.get("weights", self._kron_weights, dtype, device)

    def _kron_weights(self) -> Tensor:
        W = torch.ones(1, 1, dtype=torch.float64)
        for P in self.periods:
            W = torch.kron(W, real_weights(P))
        return W

    def half_orbit(self) -> list[int]:
        """The elements s with s <= the index of G^{-s}: one of each pair s, -s (and the self-inverse ones)."""
        return [s for s in range(self.order) if s <= self.inverse(s)]

    def half_orbit_weights(self, dtype: torch.dtype, device) -> Tensor:
        """W over :meth:`half_orbit` [T, H], doubled where s and -s differ (their blocks are each other's
        transposes, see :func:`harmonic_gram`)."""
        def make() -> Tensor:
            half = self.half_orbit()
            pairs = torch.tensor([1.0 if s == self.inverse(s) else 2.0 for s in half], dtype=torch.float64)
            return self._kron_weights()[:, half] * pairs

        return self.constants.get("half_orbit_weights", make, dtype, device)

    def product(self, other: GroupAction) -> Product:
        """The product group, with this action's ways first (the two must commute)."""
        return Product([self, other])

    def _check_input(self, X: Tensor) -> None:
        if X.ndim != 2:
            raise ValueError(f"{self!r} acts on inputs X [n, d]; got shape {tuple(X.shape)}.")
        if self.n_features is not None and X.shape[-1] != self.n_features:
            raise ValueError(f"{self!r} acts on d={self.n_features} inputs; got X with d={X.shape[-1]}.")

    def _power(self, X: Tensor, s: int) -> Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(periods={self.periods})"


class Identity(GroupAction):
    """The trivial group (P = 1, T = 1): HVGP reduces to SVGP."""

    def _power(self, X: Tensor, s: int) -> Tensor:
        return X


def _coordinates(dims: tuple[int, ...] | None, d: int, action: GroupAction) -> list[int]:
    """The coordinates ``dims`` (all d if None), checked against X's dimension d."""
    if dims is None:
        return list(range(d))
    if max(dims) >= d:
        raise ValueError(f"{action!r} acts on coordinates {list(dims)}, but X has only d={d}.")
    return list(dims)


def _distinct_coordinates(dims) -> tuple[int, ...]:
    dims = tuple(operator.index(i) for i in dims)
    if not dims or min(dims) < 0 or len(set(dims)) != len(dims):
        raise ValueError(f"dims must be distinct non-negative coordinates, got {list(dims)}.")
    return dims


class Negation(GroupAction):
    """``x -> x`` with the coordinates ``dims`` negated (all if None), P = 2. Reflects about the origin, so centre
    the inputs first; axis-aligned, so ARD kernels stay invariant."""

    periods = (2,)

    def __init__(self, dims=None):
        self.dims = None if dims is None else _distinct_coordinates(dims)

    def _power(self, X: Tensor, s: int) -> Tensor:
        if s == 0:
            return X
        d = X.shape[-1]

        def make() -> Tensor:
            sign = torch.ones(d, dtype=torch.float64)
            sign[_coordinates(self.dims, d, self)] = -1.0
            return sign

        return X * self.constants.get(("sign", d), make, X.dtype, X.device)


class SubspaceNegation(GroupAction):
    """``x -> x - 2 U U^T x``: negates the components in span(U), U [d, k] with orthonormal columns, P = 2.

    ``atol`` bounds ``|U^T U - I|``; it admits float32 round-off, which the float64 QR below then removes.
    """

    periods = (2,)

    def __init__(self, U: Tensor, atol: float = 1e-5):
        U = torch.as_tensor(U, dtype=torch.float64).detach().cpu()  # on the host, as every action's constants
        if U.ndim != 2 or U.shape[1] < 1:
            raise ValueError(f"U must be [d, k] with k >= 1 columns; got shape {tuple(U.shape)}.")
        gram_error = (U.T @ U - torch.eye(U.shape[1], dtype=U.dtype, device=U.device)).abs().max().item()
        if gram_error > atol:
            raise ValueError(f"The columns of U must be orthonormal: max |U^T U - I| = {gram_error:.2e}. Take them "
                             "from an eigendecomposition or a QR factorisation.")
        # same span, orthonormal to float64 precision, so that G is an exact involution and k stays invariant
        self.U = torch.linalg.qr(U).Q
        self.n_features = U.shape[0]

    def _power(self, X: Tensor, s: int) -> Tensor:
        if s == 0:
            return X
        U = self.constants.get("U", lambda: self.U, X.dtype, X.device)
        return X - 2 * (X @ U) @ U.T

    def linear_rank(self) -> int:
        return self.U.shape[1]

    def linear_maps(self, d: int) -> Tensor:
        eye = torch.eye(self.n_features, dtype=torch.float64)
        return torch.stack([eye, eye - 2 * self.U @ self.U.T])


def pca_directions(X: Tensor) -> Tensor:
    """The principal directions of the training inputs X [n, d]: the eigenvectors of their covariance as columns
    [d, d], by descending eigenvalue (float64)."""
    if X.ndim != 2 or X.shape[0] < 2:
        raise ValueError(f"PCA needs training inputs X [n, d] with n >= 2; got shape {tuple(X.shape)}.")
    Xc = X.detach().to(torch.float64)
    Xc = Xc - Xc.mean(0)
    eigenvalues, U = torch.linalg.eigh(Xc.T @ Xc / (X.shape[0] - 1))
    return U[:, eigenvalues.argsort(descending=True)]


def subspace_negations(basis: Tensor, n_ways: int) -> Product:
    """The J-way product of :class:`SubspaceNegation`: way j negates the orthonormal columns j, J + j, 2J + j, ...
    of ``basis`` [d, k]. S = T = 2^J."""
    if not 1 <= n_ways <= basis.shape[-1]:
        raise ValueError(f"n_ways={n_ways} must be between 1 and the {basis.shape[-1]} directions: every way "
                         "negates at least one.")
    return Product([SubspaceNegation(basis[:, j::n_ways]) for j in range(n_ways)])


def pca_negations(X: Tensor, n_ways: int) -> Product:
    """:func:`subspace_negations` over the :func:`pca_directions` of the training inputs X [n, d]: direction i (by
    descending variance) goes to way i mod J, so every way gets large and small directions alike.

    The negations reflect about the origin: X should be centred (standardised) already.
    """
    return subspace_negations(pca_directions(X), n_ways)


class CyclicShift(GroupAction):
    """Rolls the coordinates ``dims`` one place, ``(x_a, x_b, .., x_z) -> (x_z, x_a, .., x_y)``; P = len(dims).

    With ``dims=None`` all coordinates shift, so ``n_features`` (d) must be given to fix the period.
    """

    def __init__(self, dims=None, n_features: int | None = None):
        if dims is None:
            if n_features is None:
                raise ValueError("CyclicShift(dims=None) shifts all coordinates: pass n_features=d to fix P = d.")
            dims = range(n_features)
        self.dims = _distinct_coordinates(dims)
        self.n_features = n_features
        self.periods = (len(self.dims),)

    def _power(self, X: Tensor, s: int) -> Tensor:
        d = X.shape[-1]

        def make() -> Tensor:
            dims = _coordinates(self.dims, d, self)
            # coordinate dims[i] of G^s x is coordinate dims[i - s] of x
            source = list(range(d))
            for i, target in enumerate(dims):
                source[target] = dims[(i - s) % len(dims)]
            return torch.tensor(source)

        return X[:, self.constants.get(("source", d, s), make, torch.long, X.device)]


class OrthogonalAction(GroupAction):
    """``x -> R x`` for an orthogonal R [d, d] of order P (R^P = I, and no smaller power is I). Invariant kernels:
    isotropic stationary and inner-product kernels."""

    def __init__(self, R: Tensor, P: int, atol: float = 1e-10):
        R = torch.as_tensor(R, dtype=torch.float64).detach()
        P = operator.index(P)
        if R.ndim != 2 or R.shape[0] != R.shape[1] or P < 1:
            raise ValueError(f"R must be square [d, d] and P >= 1; got shape {tuple(R.shape)} and P={P}.")
        eye = torch.eye(R.shape[0], dtype=R.dtype, device=R.device)
        if not torch.allclose(R.T @ R, eye, rtol=0, atol=atol):
            raise ValueError("R must be orthogonal (R^T R = I).")
        powers = [eye]
        for _ in range(P):
            powers.append(R @ powers[-1])
        if not torch.allclose(powers[P], eye, rtol=0, atol=atol):
            raise ValueError(f"R^{P} != I: R does not have period P={P}.")
        period = next(p for p in range(1, P + 1) if torch.allclose(powers[p], eye, rtol=0, atol=atol))
        if period < P:
            raise ValueError(f"R already has period {period} < P={P}: the orbit would repeat; use P={period}.")
        self.powers = torch.stack(powers[:P])  # [P, d, d], R^s
        self.n_features = R.shape[0]
        self.periods = (P,)

    def _power(self, X: Tensor, s: int) -> Tensor:
        return X @ self.constants.get("powers", lambda: self.powers, X.dtype, X.device)[s].T

    def linear_rank(self) -> int:
        return self.n_features

    def linear_maps(self, d: int) -> Tensor:
        return self.powers.mT  # G^s X = X (R^s)^T


class LongitudeRotation(OrthogonalAction):
    """Rotation of 3-D unit-sphere embeddings (:func:`sphere_embedding`) about the z axis by 2 pi / P: longitude
    + 360 / P degrees, latitude fixed. (A Euclidean kernel on raw (lon, lat) is not invariant to it.)"""

    def __init__(self, P: int):
        P = operator.index(P)
        if P < 1:
            raise ValueError(f"LongitudeRotation needs P >= 1, got P={P}.")
        angle = 2 * math.pi / P
        c, s = math.cos(angle), math.sin(angle)
        super().__init__(torch.tensor([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64), P)


def sphere_embedding(longitude: Tensor, latitude: Tensor) -> Tensor:
    """``(cos lat cos lon, cos lat sin lon, sin lat)`` [n, 3] for angles in degrees [n]."""
    lon, lat = torch.deg2rad(longitude), torch.deg2rad(latitude)
    return torch.stack([torch.cos(lat) * torch.cos(lon), torch.cos(lat) * torch.sin(lon), torch.sin(lat)], -1)


class _ImageAction(GroupAction):
    """Acts on images flattened row-major over [height, width, channels]: X [n, height * width * channels]."""

    def __init__(self, height: int, width: int, axis: int, channels: int = 1):
        if axis not in (0, 1):
            raise ValueError(f"axis must be 0 (rows, up-down) or 1 (columns, left-right), got {axis}.")
        self.shape = (operator.index(height), operator.index(width), operator.index(channels))
        if min(self.shape) < 1:
            raise ValueError(f"height, width and channels must be >= 1, got {self.shape}.")
        self.axis = axis
        self.n_features = math.prod(self.shape)

    def _images(self, X: Tensor) -> Tensor:
        """[n, height, width, channels]"""
        return X.reshape(X.shape[0], *self.shape)


class ImageRoll(_ImageAction):
    """Cyclic translation (a torus roll, wrapping around) by ``step`` pixels along axis 0 (pixel (i, j) moves to
    row i + step) or axis 1 (to column j + step); P = size / step. Zero-padded shifts are not group actions."""

    def __init__(self, height: int, width: int, step: int, axis: int, channels: int = 1):
        super().__init__(height, width, axis, channels)
        size, self.step = self.shape[axis], operator.index(step)
        if not 1 <= self.step <= size or size % self.step:
            raise ValueError(f"step={self.step} must divide the image size {size} along axis {axis}, or the roll "
                             "would not be periodic.")
        self.periods = (size // self.step,)

    def _power(self, X: Tensor, s: int) -> Tensor:
        return self._images(X).roll(s * self.step, dims=1 + self.axis).reshape(X.shape)


class ImageFlip(_ImageAction):
    """Up-down (axis 0) or left-right (axis 1) flip, P = 2."""

    periods = (2,)

    def _power(self, X: Tensor, s: int) -> Tensor:
        return X if s == 0 else self._images(X).flip(1 + self.axis).reshape(X.shape)


class Product(GroupAction):
    """The product of commuting actions: their periods concatenated, s row-major over (s_1..s_J). E.g. the code's
    flip orbit ``[Z, LR(Z), UD(Z), UD(LR(Z))]`` is ``Product([ImageFlip(h, w, 0), ImageFlip(h, w, 1)])``."""

    def __init__(self, actions):
        self.actions = tuple(actions)
        if not self.actions or not all(isinstance(a, GroupAction) for a in self.actions):
            raise ValueError("Product needs a non-empty sequence of GroupActions.")
        dims = {a.n_features for a in self.actions} - {None}
        if len(dims) > 1:
            raise ValueError(f"The actions act on different input dimensions {sorted(dims)}.")
        self.n_features = dims.pop() if dims else None
        self.periods = tuple(P for a in self.actions for P in a.periods)

    def _check_input(self, X: Tensor) -> None:
        for action in self.actions:
            action._check_input(X)

    def _power(self, X: Tensor, s: int) -> Tensor:
        # row-major numbering nests: s = s_first * (S / S_first) + (index within the later actions)
        for action in reversed(self.actions):
            s, s_action = divmod(s, action.order)
            X = action._power(X, s_action)
        return X

    def linear_rank(self) -> int | None:
        ranks = [action.linear_rank() for action in self.actions]
        return None if None in ranks else sum(ranks)

    def linear_maps(self, d: int) -> Tensor:
        """The ways' matrices multiplied in the row-major numbering of s (they commute, so in any order)."""
        maps = torch.eye(d, dtype=torch.float64).unsqueeze(0)
        for action in self.actions:
            maps = (maps.unsqueeze(1) @ action.linear_maps(d).unsqueeze(0)).flatten(0, 1)
        return maps

    def __repr__(self) -> str:
        return f"Product([{', '.join(map(repr, self.actions))}])"


def orbit_gram(kernel: Kernel, action: GroupAction, X1: Tensor, X2: Tensor) -> Tensor:
    """``k(X1, G^s X2)`` [S, n1, n2], from one kernel call on the stacked orbit."""
    if X1.ndim != 2 or X1.shape[-1] != X2.shape[-1]:
        raise ValueError(f"X1 [n1, d] and X2 [n2, d] must share d; got {tuple(X1.shape)} and {tuple(X2.shape)}.")
    orbit = action.orbit(X2)  # [S, n2, d]
    K = kernel(X1, orbit.reshape(-1, X2.shape[-1]))  # [n1, S * n2]
    return K.reshape(X1.shape[0], action.order, X2.shape[0]).movedim(1, 0)


def harmonic_kernels(kernel: Kernel, action: GroupAction, X1: Tensor, X2: Tensor) -> Tensor:
    """All real sub-kernels ``k_t(X1, X2) = sum_s W[t, s] k(X1, G^s X2)`` [T, n1, n2] from one orbit of X2."""
    K_orbit = orbit_gram(kernel, action, X1, X2)
    return torch.einsum("ts,sij->tij", action.weights(K_orbit.dtype, K_orbit.device), K_orbit)


def harmonic_kernel(kernel: Kernel, action: GroupAction, t: int, X1: Tensor, X2: Tensor) -> Tensor:
    """One real sub-kernel ``k_t(X1, X2)`` [n1, n2], t in 0..T-1 (row-major over the ways' frequencies)."""
    t = operator.index(t)
    if not 0 <= t < action.n_subkernels:
        raise ValueError(f"Sub-kernel t={t} is outside 0..{action.n_subkernels - 1} for {action!r}.")
    K_orbit = orbit_gram(kernel, action, X1, X2)
    return torch.einsum("s,sij->ij", action.weights(K_orbit.dtype, K_orbit.device)[t], K_orbit)


def harmonic_gram(kernel: Kernel, action: GroupAction, X: Tensor, t: int | None = None) -> Tensor:
    """``k_t(X, X)`` [T, n, n] (or [n, n] for one t), symmetric, from half the orbit of X.

    Invariance gives ``k(x, G^{-s} x') = k(G^s x, x') = k(x', G^s x)``, so K_{-s} = K_s^T, and the real weights are
    even in s: ``k_t = sym(sum_s W[t, s] K_s)`` needs K_s only for one of s and -s, with weight 2 W[t, s] where
    they differ. That is S / 2 + 1 kernel blocks instead of S for a cyclic group."""
    if t is not None and not 0 <= operator.index(t) < action.n_subkernels:
        raise ValueError(f"Sub-kernel t={t} is outside 0..{action.n_subkernels - 1} for {action!r}.")
    K = _half_orbit_grams(kernel, action, X)  # [n, H, n]
    W = action.half_orbit_weights(K.dtype, K.device)
    K_t = _symmetric(torch.einsum("th,ihj->tij", W if t is None else W[t:t + 1], K))
    return K_t if t is None else K_t[0]


def block_harmonic_grams(kernel: Kernel, action: GroupAction, Z: Tensor, ts: list[int]) -> Tensor:
    """``k_{t_b}(Z_b, Z_b)`` [B, m, m] for blocks of points Z [B, m, d], block b's own sub-kernel ``ts[b]``, as
    :func:`harmonic_gram` forms each: every block's half orbit in one product and their Gram matrices in one call
    of the kernel over a leading batch axis, which the kernel must take (:attr:`Kernel.takes_batches`), where a
    call per block took a dozen operators forward and backward for each."""
    K = _half_orbit_grams(kernel, action, Z)  # [B, m, H, m]
    # [B, H], its rows picked on the host: on a GPU, indexing with a list copies the list from the host
    W = action.constants.get(("half_orbit_weights", *ts),
                             lambda: action.half_orbit_weights(torch.float64, None)[list(ts)], K.dtype, K.device)
    return _symmetric(torch.einsum("bh,bihj->bij", W, K))


def _half_orbit_grams(kernel: Kernel, action: GroupAction, X: Tensor) -> Tensor:
    """``k(X_b, G^s X_b)`` [..., n, H, n] for s over the half orbit, for points X [n, d] (one kernel call on rows)
    or blocks X [B, n, d] (one over a batch axis)."""
    *batch, n, d = X.shape
    half = action.half_orbit()
    orbit = action.orbit(X.reshape(-1, d), half).view(len(half), *batch, n, d).movedim(0, -3)  # [..., H, n, d]
    return kernel(X, orbit.reshape(*batch, len(half) * n, d)).view(*batch, n, len(half), n)


def _symmetric(K: Tensor) -> Tensor:
    return 0.5 * (K + K.mT)


def check_invariant(kernel: Kernel, action: GroupAction, X: Tensor, atol: float = 1e-10) -> None:
    """Raise ValueError unless ``k(G_j X, G_j X) = k(X, X)`` to ``atol`` for every generator G_j (which gives
    invariance to the whole group) on the sample points X [n, d]."""
    with torch.no_grad():
        K = kernel(X, X)
        stride = action.order
        for j, P in enumerate(action.periods):
            stride //= P  # G_j is the element with s_j = 1 and every other exponent 0
            if P == 1:
                continue
            GX = action.apply(X, stride)
            error = (kernel(GX, GX) - K).abs().max().item()
            if error > atol:
                raise ValueError(
                    f"{type(kernel).__name__} is not invariant to way {j} (period {P}) of {action!r}: "
                    f"max |k(G X, G X') - k(X, X')| = {error:.2e} > atol={atol:g}, so its harmonic sub-kernels "
                    "would be neither symmetric nor PSD. Use hyperparameters the group respects: ard=False (one "
                    "shared lengthscale) for PCA negations, rotations, coordinate shifts and image actions, and "
                    "sphere embeddings rather than raw (lon, lat) for longitude rotations.")

"""The group actions on inputs X [n, d]: negations of coordinates or of a subspace (PCA directions), cyclic shifts of
coordinates, orthogonal maps (rotations of sphere embeddings), and rolls and flips of flattened images."""
from __future__ import annotations

import math
import operator

import torch
from torch import Tensor

from .group import GroupAction, Product


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
    return _directions_of(_covariance(X))


def _covariance(X: Tensor) -> Tensor:
    """The sample covariance [d, d] of the rows of X [n, d], in float64."""
    Xc = X.detach().to(torch.float64)
    Xc = Xc - Xc.mean(0)
    return Xc.T @ Xc / (X.shape[0] - 1)


def _directions_of(covariance: Tensor) -> Tensor:
    eigenvalues, U = torch.linalg.eigh(covariance)
    return U[:, eigenvalues.argsort(descending=True)]


def negation_basis(X: Tensor, n_ways: int, tolerance: float = 0.25) -> Tensor:
    """The orthonormal basis [d, d] (columns) whose ``n_ways`` interleaved negations (way j negates columns j,
    J + j, 2J + j, ...) leave the distribution of the training inputs X [n, d] (nearly) invariant, as the harmonic
    decomposition wants (Sun et al. 2021, Thm 4.2): the input axes (the identity) where each way's coordinate
    negation D_j changes the inputs' correlation matrix C by less than ``tolerance`` of its norm,
    ``||D_j C D_j - C||_F < tolerance ||C||_F`` (inputs with nearly uncorrelated columns, whose principal directions
    the data do not determine), else the :func:`pca_directions`, whose negations leave C unchanged by construction.
    Negations of the axes keep an ARD kernel invariant, those of other directions an ARD kernel in their basis."""
    covariance = _covariance(X)
    sd = covariance.diagonal().sqrt().clamp_min(torch.finfo(torch.float64).tiny)
    C = covariance / sd[:, None] / sd  # correlations; a constant column is uncorrelated with the rest
    d = X.shape[-1]
    for j in range(min(n_ways, d)):
        sign = torch.ones(d, dtype=torch.float64)
        sign[j::n_ways] = -1.0
        if torch.linalg.norm(sign[:, None] * C * sign - C) >= tolerance * torch.linalg.norm(C):
            return _directions_of(covariance)
    return torch.eye(d, dtype=torch.float64)


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

"""A finite abelian group acting on inputs, as J commuting cyclic ways: the element numbering, the orbit, the real
DFT weights W [T, S] that resolve a kernel into sub-kernels, and the product of actions.

Subclasses (:mod:`~gpscale.kernels.harmonic.actions`) say what one element does to the inputs; everything that
depends only on the periods lives here.
"""
from __future__ import annotations

import math
import operator

import torch
from torch import Tensor

from ...device import HostConstants

# the most numbers a linear action's orbit maps [S, d, d] may hold: beyond, the orbit is taken one element at a
# time (8 maps of 784 x 784, PCA negations of flattened MNIST images, are 4.9 million)
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

"""Inducing features, the definition both engines take: the covariances between inducing variables u and f.

An :class:`InducingFeatures` module gives ``Kuu()`` [m, m], ``Kuf(X)`` [m, c] and ``Kff_diag(X)`` [c]. The collapsed
bound (:class:`~gpscale.models.linear.collapsed.CollapsedGP`) whitens ``Kuf`` into the features of a Bayesian
linear model; the variational engine (:mod:`gpscale.models.variational.engine`) keeps a q(u) over them. Inducing
points (u = f(Z)) are the common case; Fourier features, harmonic blocks and stacks of several kinds are others.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from ..kernels import Kernel
from ..linalg import CORE, cholesky
from ..operators import BlockDiagonal, DenseSPD

__all__ = ["InducingFeatures", "InducingPoints", "StackedFeatures", "add_jitter", "jittered_cholesky",
           "kmeans_centers"]


def add_jitter(Kuu: Tensor, jitter: float) -> Tensor:
    """``Kuu + jitter I`` [..., m, m] in float64: ``jitter`` is absolute (the kernel's units), the one convention of
    every inducing covariance in gpscale."""
    Kuu = Kuu.to(CORE)
    return Kuu + jitter * torch.eye(Kuu.shape[-1], dtype=CORE, device=Kuu.device)


def jittered_cholesky(Kuu: Tensor, jitter: float) -> Tensor:
    """The lower Cholesky factor of :func:`add_jitter` ``(Kuu, jitter)`` [..., m, m] in float64;
    :func:`~gpscale.linalg.cholesky` adds more only if the factorisation fails, and warns."""
    return cholesky(add_jitter(Kuu, jitter), what="inducing covariance Kuu")


class InducingFeatures(nn.Module):
    """Inter-domain inducing features: the covariances the engines need."""

    num_inducing: int

    def Kuu(self) -> Tensor:  # pragma: no cover - interface
        """[m, m]"""
        raise NotImplementedError

    def Kuf(self, X: Tensor) -> Tensor:  # pragma: no cover - interface
        """[m, c]"""
        raise NotImplementedError

    def Kff_diag(self, X: Tensor) -> Tensor:  # pragma: no cover - interface
        """[c]"""
        raise NotImplementedError

    def Kuu_operator(self, jitter: float = 0.0):
        """Kuu (float64) as an operator with ``solve``, ``logdet``, ``to_dense`` (:mod:`gpscale.operators`).
        Default: dense, through its Cholesky factor, with ``jitter`` on the diagonal; structured features override
        this."""
        Kuu = self.Kuu().to(CORE)
        return DenseSPD(Kuu + jitter * torch.eye(Kuu.shape[0], dtype=CORE, device=Kuu.device),
                        what="inducing covariance Kuu")


class InducingPoints(InducingFeatures):
    """u = f(Z) for inducing inputs Z [m, d] (set by :func:`kmeans_centers` at a model's ``initialise_from_data``)."""

    def __init__(self, kernel: Kernel, m: int, d: int, learn: bool = True):
        super().__init__()
        self.kernel = kernel
        self.num_inducing = int(m)
        self.Z = nn.Parameter(torch.zeros(m, d), requires_grad=learn)

    def Kuu(self) -> Tensor:
        return self.kernel(self.Z, self.Z)

    def Kuf(self, X: Tensor) -> Tensor:
        return self.kernel(self.Z, X)

    def Kff_diag(self, X: Tensor) -> Tensor:
        return self.kernel.diag(X)


class StackedFeatures(InducingFeatures):
    """The features of several independent components of f = f_1 + f_2 + ... stacked: Kuf is their rows stacked,
    Kuu block diagonal (no cross-covariance between independent components), Kff_diag the sum of the components'.

    Args:
        parts: one :class:`InducingFeatures` per component, each over its own component's kernel.
        jitters: the jitter each part's Kuu takes (inducing points need some; Fourier features none).
    """

    def __init__(self, parts: list[InducingFeatures], jitters: tuple[float, ...]):
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.jitters = tuple(float(j) for j in jitters)
        self.num_inducing = sum(part.num_inducing for part in parts)

    def Kuu_operator(self, jitter: float = 0.0) -> BlockDiagonal:
        """Each part's Kuu with that part's own jitter (``jitter`` is not used)."""
        return BlockDiagonal([part.Kuu_operator(j) for part, j in zip(self.parts, self.jitters)])

    def Kuu(self) -> Tensor:
        return self.Kuu_operator().to_dense()

    def Kuf(self, X: Tensor) -> Tensor:
        return torch.cat([part.Kuf(X).to(CORE) for part in self.parts])

    def Kff_diag(self, X: Tensor) -> Tensor:
        return sum(part.Kff_diag(X) for part in self.parts)


def kmeans_centers(X: Tensor, m: int, seed: int = 0) -> Tensor:
    """``m`` k-means centres [m, d] of the rows of X [n, d] (scikit-learn's MiniBatchKMeans, seeded).

    With ``m >= n`` the data points themselves are the centres. k-means runs on at most 100,000 rows
    sampled with the same seed, which is plenty to place m centres and keeps the cost bounded.
    """
    from sklearn.cluster import MiniBatchKMeans

    n = X.shape[0]
    if m >= n:
        return X.clone()
    Xnp = X.detach().cpu().numpy().astype(np.float64)
    rng = np.random.default_rng(seed)
    if n > 100_000:
        Xnp = Xnp[rng.choice(n, 100_000, replace=False)]
    km = MiniBatchKMeans(n_clusters=m, random_state=seed, batch_size=max(1024, 3 * m), n_init=1,
                         max_iter=100)
    km.fit(Xnp)
    return torch.as_tensor(km.cluster_centers_, dtype=X.dtype, device=X.device)

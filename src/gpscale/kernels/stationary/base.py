"""The kernel interface, the sum of two kernels, and the softplus parameterisation of positive hyperparameters."""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ...linalg import weighted_sum

# The starting value of every positive hyperparameter (lengthscales, outputscale, noise): softplus(0) = ln 2, as
# in GPyTorch. A noise started well below it can end in a worse optimum, because the noise first has to grow
# through a region where the kernel explains little.
SOFTPLUS_ZERO = math.log(2.0)


def inverse_softplus(x: Tensor | float) -> Tensor:
    """The unconstrained value whose softplus is ``x`` (> 0)."""
    x = torch.as_tensor(x, dtype=torch.get_default_dtype() if not torch.is_tensor(x) else x.dtype)
    return x + torch.log(-torch.expm1(-x))


def median_distance(X: Tensor, max_rows: int = 1000, seed: int = 0) -> float:
    """The median of the pairwise distances between the rows of X [n, d] (the median heuristic for a lengthscale),
    from a seeded random subset of at most ``max_rows`` rows: O(max_rows^2 d)."""
    if len(X) > max_rows:
        X = X[torch.randperm(len(X), generator=torch.Generator().manual_seed(seed))[:max_rows].to(X.device)]
    D = torch.cdist(X, X)
    return D[torch.triu_indices(len(X), len(X), offset=1, device=X.device).unbind()].median().item()


class Kernel(nn.Module):
    """A covariance function. Subclasses implement ``forward(X1, X2) -> K [n1, n2]`` and ``diag(X) -> [n]``, and
    gpscale's own kernels ``config()``: their constructor's arguments, from which a saved model rebuilds them
    (:func:`gpscale.kernels.kernel_spec`)."""

    #: whether ``forward`` also takes inputs with a leading batch axis, X1 [B, n1, d] and X2 [B, n2, d] -> [B, n1, n2]
    #: (a subclass of a kernel that does, whose ``forward`` does not, sets it False)
    takes_batches: bool = False

    def config(self) -> dict | None:
        """The constructor arguments (JSON values; nested kernels as kernels) that rebuild this kernel's structure,
        its values then coming from ``state_dict``; None for a kernel gpscale cannot rebuild."""
        return None

    def forward(self, X1: Tensor, X2: Tensor) -> Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def diag(self, X: Tensor) -> Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def matvec(self, X1: Tensor, X2: Tensor, v: Tensor) -> Tensor:
        """``K(X1, X2) v`` [n1] in v's dtype; a kernel with structure (:class:`AdditiveMatern`) may take it without
        forming K."""
        return self(X1, X2).to(v.dtype) @ v

    def weighted_self_grams(self, A: Tensor, weights: Tensor) -> Tensor:
        """``sum_pq W_pq k(a_ip, a_iq)`` [c] for each of c point sets A [c, r, d], with a symmetric W [r, r] (the
        variance of a weighted sum of f over each set): one Gram matrix per set here; :class:`Stationary` forms
        them all in one call, with a backward of its own."""
        return torch.stack([(self(a, a) * weights).sum() for a in A])

    def weighted_grams(self, A: Tensor, B: Tensor, weights: Tensor) -> Tensor:
        """``sum_s W[t, s] k(a_tsi, b_j)`` [T, m, c] for T groups of S point sets A [T, S, m, d], points B [c, d] and
        weights W [T, S] (HVGP's sub-kernels against a batch, from the orbits of each block's inducing points): one
        kernel matrix and a weighted sum here (:func:`weighted_grams`); :class:`Stationary` takes them in one call,
        with a backward of its own."""
        return weighted_grams(self, A, B, weights)


def weighted_grams(kernel, A: Tensor, B: Tensor, weights: Tensor) -> Tensor:
    """:meth:`Kernel.weighted_grams` for any callable ``kernel(X1, X2) -> K``: K [T S m, c] and its weighted sum over
    s, laid out [T, S, m c] so that the sum reads K's own memory."""
    T, S, m, d = A.shape
    K = kernel(A.reshape(T * S * m, d), B)
    return weighted_sum(weights, K.view(T, S, m * B.shape[0])).view(T, m, B.shape[0])



class Sum(Kernel):
    """``k_1 + k_2``: the covariance of the sum of two independent GPs."""

    def __init__(self, first: Kernel, second: Kernel):
        super().__init__()
        self.first, self.second = first, second

    def config(self) -> dict | None:
        if self.first.config() is None or self.second.config() is None:
            return None
        return {"first": self.first, "second": self.second}

    def forward(self, X1: Tensor, X2: Tensor) -> Tensor:
        return self.first(X1, X2) + self.second(X1, X2)

    def diag(self, X: Tensor) -> Tensor:
        return self.first.diag(X) + self.second.diag(X)


def hyperparameter_repr(t: Tensor) -> str:
    """A hyperparameter for a repr: a number, or a list of numbers, to 4 significant digits."""
    values = t.detach().double().cpu().reshape(-1).tolist()
    shown = [f"{v:.4g}" for v in values]
    return shown[0] if len(shown) == 1 else "[" + ", ".join(shown) + "]"

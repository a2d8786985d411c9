"""Kernels of one scaled distance ``r = ||(x - x') / l||``: the shared machinery, the RBF and the Matérn family."""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn.functional import softplus

from .base import SOFTPLUS_ZERO, Kernel, hyperparameter_repr, inverse_softplus
from .closed_form import StationaryGram, WeightedGrams, WeightedSelfGrams
from .distances import sq_dist, underflow_cutoff


class Stationary(Kernel):
    """Shared machinery of kernels that depend on the scaled distance ``r`` only.

    Args:
        n_features: input dimension d.
        ard: one lengthscale per dimension (True) or one shared (False).
        lengthscale: initial lengthscale(s).
        outputscale: initial outputscale s^2.
    """

    takes_batches = True
    #: whether :meth:`weighted_slope` reads the kernel matrix K (else only the state :meth:`gram` returns with it)
    slope_reads_gram: bool = True

    def __init__(self, n_features: int, ard: bool = True, lengthscale: float = SOFTPLUS_ZERO,
                 outputscale: float = SOFTPLUS_ZERO):
        super().__init__()
        self.n_features = int(n_features)
        self.ard = bool(ard)
        n_ls = self.n_features if self.ard else 1
        self.raw_lengthscale = nn.Parameter(inverse_softplus(torch.full((n_ls,), float(lengthscale))))
        self.raw_outputscale = nn.Parameter(inverse_softplus(torch.tensor(float(outputscale))))

    @property
    def lengthscale(self) -> Tensor:
        """[d] if ARD else [1]."""
        return softplus(self.raw_lengthscale)

    def config(self) -> dict:
        return {"n_features": self.n_features, "ard": self.ard}

    def extra_repr(self) -> str:
        return (f"lengthscale={hyperparameter_repr(self.lengthscale)}, "
                f"outputscale={hyperparameter_repr(self.outputscale)}")

    @property
    def outputscale(self) -> Tensor:
        return softplus(self.raw_outputscale)

    def scaled_sq_dist(self, X1: Tensor, X2: Tensor) -> Tensor:
        """``||(x - x')/l||^2`` [n1, n2], by the Gram expansion (one matmul), clamped at 0 against round-off."""
        ls = self.lengthscale.to(X1.dtype)
        A = X1 / ls
        return sq_dist(A, A if X2 is X1 else X2 / ls)

    def gram(self, A: Tensor, B: Tensor, outputscale: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:  # pragma: no cover
        """``K = s^2 g(||a - b||^2)`` [..., n1, n2] for scaled inputs A [..., n1, d] and B [..., n2, d], a tensor of
        its own formed in as few passes over n1 x n2 memory as the profile allows (these passes, not the distances'
        product, are most of the time of the large kernel matrices), and what :meth:`weighted_slope` needs. It works
        in place, for the forward pass of a custom autograd Function: call it with autograd off."""
        raise NotImplementedError

    def weighted_slope(self, grad: Tensor, K: Tensor,
                       state: tuple[Tensor, ...]) -> tuple[Tensor, float]:  # pragma: no cover - interface
        """``(H, c)`` with ``c H = grad * s^2 dg / d(||a - b||^2)``: H a new tensor, formed in as few passes as the
        profile allows, and the number c applied later to the [n, d] results instead of the [n1, n2] matrix. K is
        :meth:`gram`'s output, ``s^2 g``, and state what it returned beside K."""
        raise NotImplementedError

    def forward(self, X1: Tensor, X2: Tensor) -> Tensor:
        """K [..., n1, n2] for X1 [..., n1, d] and X2 [..., n2, d] (leading batch axes alike, or none)."""
        ls = self.lengthscale.to(X1.dtype)
        A = X1 / ls
        return StationaryGram.apply(A, A if X2 is X1 else X2 / ls, self.outputscale.to(X1.dtype), self)

    def weighted_self_grams(self, A: Tensor, weights: Tensor) -> Tensor:
        ls = self.lengthscale.to(A.dtype)
        return WeightedSelfGrams.apply(A / ls, weights, self.outputscale.to(A.dtype), self)

    def weighted_grams(self, A: Tensor, B: Tensor, weights: Tensor) -> Tensor:
        if weights.requires_grad:  # the closed form below has no gradient for the weights
            return super().weighted_grams(A, B, weights)
        ls = self.lengthscale.to(B.dtype)
        return WeightedGrams.apply(A / ls, B / ls, weights.to(B.dtype), self.outputscale.to(B.dtype), self)

    def diag(self, X: Tensor) -> Tensor:
        return self.outputscale.to(X.dtype).expand(X.shape[0]).clone()



class RBF(Stationary):
    """Squared exponential: ``g = exp(-r^2 / 2)``, ``dg / d(r^2) = -g / 2``."""

    def gram(self, A, B, outputscale):
        """``s^2 exp(-r^2 / 2)``, the distance's scale -1/2 taken in the product's buffer, its exponent held at
        :func:`underflow_cutoff` in the same pass."""
        return sq_dist(A, B, scale=-0.5, bound=underflow_cutoff(A.dtype)).exp_().mul_(outputscale), ()

    def weighted_slope(self, grad, K, state):
        """``s^2 dg / d(r^2) = -K / 2``."""
        return grad * K, -0.5


class Matern(Stationary):
    """Matérn with smoothness ``nu`` in {1/2, 3/2, 5/2}; ``z = sqrt(2 nu) r``:

    - nu = 1/2: ``g = exp(-z)``
    - nu = 3/2: ``g = (1 + z) exp(-z)``
    - nu = 5/2: ``g = (1 + z + z^2 / 3) exp(-z)``
    """

    slope_reads_gram = False

    def __init__(self, n_features: int, nu: float = 2.5, **kwargs):
        if nu not in (0.5, 1.5, 2.5):
            raise ValueError(f"Matern nu must be 0.5, 1.5 or 2.5, got {nu}.")
        super().__init__(n_features, **kwargs)
        self.nu = float(nu)

    def config(self) -> dict:
        return {**super().config(), "nu": self.nu}

    def extra_repr(self) -> str:
        return f"nu={self.nu}, {super().extra_repr()}"

    def gram(self, A, B, outputscale):
        """From ``z`` (the distances of inputs scaled by sqrt(2 nu), then their root) and ``s^2 exp(-z)``, with the
        polynomial in two fused multiply-adds: eight passes over n1 x n2 memory after the product for nu = 5/2. The
        outputscale is a product, not a term of the exponent (``exp(log s^2 - z)``, a pass shorter), so that the
        kernel at distance 0 is s^2 exactly, as ``diag`` gives it: an ulp off there moves a float32 posterior
        visibly from its float64 one. For nu = 3/2 the state is ``s^2 exp(-z)`` alone, the slope's factor (z is not
        kept); for nu = 5/2 it is z and ``s^2 exp(-z)``, buffers the forward forms anyway."""
        root = math.sqrt(2.0 * self.nu)  # scales the inputs, not the buffer, so that equal rows stay at distance 0
        scaled = A * root
        # z held at -underflow_cutoff: exp(-z) at most 2.3e-13 above its value beyond (float32), never subnormal
        z = sq_dist(scaled, scaled if B is A else B * root, bound=underflow_cutoff(A.dtype) ** 2).sqrt_()
        decay = torch.neg(z).exp_().mul_(outputscale)  # s^2 exp(-z)
        if self.nu == 0.5:
            return decay.clone(), (z, decay)
        if self.nu == 1.5:
            return torch.addcmul(decay, decay, z), (decay,)
        K = torch.addcmul(z, z, z, value=1.0 / 3.0)  # z + z^2 / 3
        return torch.addcmul(decay, decay, K, out=K), (z, decay)

    def weighted_slope(self, grad, K, state):
        """``s^2 dg / d(r^2) = s^2 g'(r) / (2 r)``: -s^2 exp(-z) / (2 r), -(3/2) s^2 exp(-z), -(5/6) s^2 (1 + z) exp(-z)
        (z = sqrt(2 nu) r); for nu = 1/2, 0 where r = 0 (as the derivative of the root floored above 0). The state's
        ``s^2 exp(-z)`` carries the outputscale."""
        if self.nu == 1.5:
            return grad * state[0], -1.5
        z, decay = state
        H = grad * decay
        if self.nu == 0.5:
            return H.div_(z).masked_fill_(z <= 1e-15, 0.0), -0.5
        return H.addcmul_(H, z), -5.0 / 6.0

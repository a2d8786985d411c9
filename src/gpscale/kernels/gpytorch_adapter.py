"""Use any GPyTorch kernel where a gpscale method needs only ``k(x, x')`` and its diagonal."""
from __future__ import annotations

from torch import Tensor

from .stationary import Kernel

__all__ = ["GPyTorchKernel"]


class GPyTorchKernel(Kernel):
    """Wraps a ``gpytorch.kernels.Kernel``; its parameters train with the model.

    Example: ``GPyTorchKernel(gpytorch.kernels.ScaleKernel(gpytorch.kernels.PeriodicKernel()))``.
    """

    def __init__(self, kernel):
        super().__init__()
        self.kernel = kernel

    def forward(self, X1: Tensor, X2: Tensor) -> Tensor:
        return self.kernel(X1, X2).to_dense()

    def diag(self, X: Tensor) -> Tensor:
        return self.kernel(X, X, diag=True)

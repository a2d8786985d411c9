"""The deep basis kernel (Zhu, Yuchi & Xie 2025, eq. 4): a network phi: R^d -> R^r outputs r basis functions and
the kernel is their inner product, ``k(x, x') = phi(x)^T phi(x')``, so ``K_XX = Phi Phi^T`` has rank <= r and the
prior variance ``k(x, x) = ||phi(x)||^2`` depends on x. The models on it are :mod:`gpscale.models.deep_basis.dbk` and
:mod:`gpscale.models.deep_basis.svdbk`.
"""
from __future__ import annotations

import functools
import math
import os
import platform
import re

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from ..linalg import squared_norms
from .stationary import Kernel

__all__ = ["DeepBasisKernel", "mlp", "residual_mlp", "ResidualLayer", "Tanh", "cpu_tanh_is_slow", "prior_variance",
           "ACTIVATIONS", "NETWORKS", "DEFAULT_DEPTH"]

class _SigmoidTanh(torch.autograd.Function):
    """``tanh x = 2 sigmoid(2x) - 1``, with tanh's own backward ``grad (1 - y^2)``."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        y = torch.sigmoid(x * 2.0).mul_(2.0).sub_(1.0)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)


class Tanh(nn.Module):
    """The hyperbolic tangent. On a CPU where torch's ``tanh`` runs slowly (:func:`cpu_tanh_is_slow`), as
    ``2 sigmoid(2x) - 1``, with tanh's own backward; its absolute error is below 2e-7 (torch's: 3e-8), a few units in
    the last place of activations of order 1."""

    def forward(self, x: Tensor) -> Tensor:
        return _SigmoidTanh.apply(x) if x.device.type == "cpu" and cpu_tanh_is_slow() else torch.tanh(x)


@functools.cache
def cpu_tanh_is_slow() -> bool:
    """Whether torch's CPU ``tanh`` is slower here than ``2 sigmoid(2x) - 1``: where it is Intel MKL's vector tanh
    (torch built with MKL) and MKL does not run its AVX-512 code, which it runs only on Intel processors that have
    AVX-512 and lets ``MKL_ENABLE_INSTRUCTIONS`` turn off. Decided from the processor, not timed, so that a model's
    numbers do not depend on how busy the machine was when they were first computed. MKL's AVX-512 tanh is the
    faster of the two; its generic code is the slower (the timings are on the Performance page)."""
    if not torch.backends.mkl.is_available() or platform.system() == "Darwin":  # no MKL vector math on macOS
        return False
    allowed = os.environ.get("MKL_ENABLE_INSTRUCTIONS", "AVX512").strip().upper()
    return not (allowed.startswith("AVX512") and _intel_with_avx512())


def _intel_with_avx512(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether the processor is an Intel one with the AVX-512 foundation instructions (Linux's /proc/cpuinfo, whose
    first processor's block, a few KB, names both; elsewhere the platform's processor name and torch's vector
    capability)."""
    try:
        with open(cpuinfo) as info:
            head = info.read(1 << 16)
    except OSError:
        return "intel" in platform.processor().lower() and torch.backends.cpu.get_cpu_capability() == "AVX512"
    return "GenuineIntel" in head and re.search(r"^flags\s*:.*\bavx512f\b", head, re.MULTILINE) is not None


ACTIVATIONS = {"tanh": Tanh, "relu": nn.ReLU, "silu": nn.SiLU, "gelu": nn.GELU}
NETWORKS = ("mlp", "resnet")
DEFAULT_DEPTH = {"mlp": 2, "resnet": 3}  # hidden layers of the paper's "2-layer MLP" and "2-layer ResNet"


# --- backbones (the paper gives no wiring; these are one reading of its words) ------------------------------
def mlp(d: int, r: int, depth: int = DEFAULT_DEPTH["mlp"], width: int = 128, activation: str = "tanh") -> nn.Sequential:
    """``Linear(d, w) -> act -> [Linear(w, w) -> act] x (depth - 1) -> Linear(w, r)``: ``depth`` hidden layers
    and a linear output with bias. The paper's synthetic-data backbone is depth 2, width 128, tanh."""
    act = ACTIVATIONS[activation]
    layers: list[nn.Module] = [nn.Linear(d, width), act()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), act()]
    return nn.Sequential(*layers, nn.Linear(width, r))


class ResidualLayer(nn.Module):
    """``h -> h + act(Linear(w, w)(h))``."""

    def __init__(self, width: int, activation: str):
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.act = ACTIVATIONS[activation]()

    def forward(self, h: Tensor) -> Tensor:
        return h + self.act(self.linear(h))


def residual_mlp(d: int, r: int, depth: int = DEFAULT_DEPTH["resnet"], width: int = 128,
                 activation: str = "tanh") -> nn.Sequential:
    """``Linear(d, w) -> act -> ResidualLayer x (depth - 1) -> Linear(w, r)``: the :func:`mlp` of the same depth
    with a skip connection around each hidden layer after the first. The paper's real-data backbone ("2-layer
    ResNet", width 128, tanh) is read as two residual layers, depth 3: read as one (depth 2), exact DBK-c on pol
    and SVDBK on protein stay far from the paper's numbers; depth 3 reaches them on pol and comes closer on
    protein (docs/dbk.md)."""
    act = ACTIVATIONS[activation]
    blocks = [ResidualLayer(width, activation) for _ in range(depth - 1)]
    return nn.Sequential(nn.Linear(d, width), act(), *blocks, nn.Linear(width, r))


def prior_variance(Phi: Tensor) -> Tensor:
    """``k(x_i, x_i) = ||phi(x_i)||^2`` [n] for basis rows Phi [n, r]: the DBK prior variance, which varies with x."""
    return squared_norms(Phi)



class DeepBasisKernel(Kernel):
    """``k(x, x') = phi(x)^T phi(x')`` for a network ``phi`` mapping X [c, d] to Phi [c, r].

    Args:
        network: any ``torch.nn.Module`` that acts on each row separately (no batch norm in training mode): the
            model chunks its inputs.
        n_basis: r, the network's output width.
        scale_basis: use ``phi = network(x) / sqrt(r)``, which keeps ||phi||^2 = O(1) at initialisation whatever r.
            Not in the paper (a third-party reimplementation's trick); off here, on in the DBK models' defaults.
    """

    def __init__(self, network: nn.Module, n_basis: int, scale_basis: bool = False):
        super().__init__()
        self.network = network
        self.n_basis = int(n_basis)
        self.scale_basis = bool(scale_basis)

    def basis(self, X: Tensor) -> Tensor:
        """Phi = phi(X) [c, r] for X [c, d]."""
        Phi = self.network(X)
        if Phi.shape != (X.shape[0], self.n_basis):
            raise ValueError(f"The network maps inputs {tuple(X.shape)} to {tuple(Phi.shape)}; a deep basis kernel "
                             f"needs [{X.shape[0]}, n_basis={self.n_basis}].")
        return Phi / math.sqrt(self.n_basis) if self.scale_basis else Phi

    def forward(self, X1: Tensor, X2: Tensor) -> Tensor:
        """K [n1, n2] = Phi_1 Phi_2^T (dense: for inspection and tests; the models never form it)."""
        return self.basis(X1) @ self.basis(X2).T

    def diag(self, X: Tensor) -> Tensor:
        return prior_variance(self.basis(X))

"""The exact GP: O(n^3) Cholesky of K + sigma^2 I. For n up to a few thousand, and as the reference."""
from __future__ import annotations

import math

import torch
from torch import Tensor

from ..distributed import LOCAL, Comm
from ..linalg import cholesky, cho_solve, logdet_from_cholesky, solve_lower
from .base import GPModel, register

__all__ = ["ExactGP"]


@register("exact")
class ExactGP(GPModel):
    """Exact GP regression (Rasmussen & Williams, Alg. 2.1), trained full batch on the log marginal likelihood.

    Memory is O(n^2): use it up to n of about 10^4; the cache keeps the training inputs and the n x n factor.
    """

    full_batch = True

    def Ky_cholesky(self, X: Tensor) -> Tensor:
        """L with ``L L^T = K + sigma^2 I`` [n, n] (Alg. 2.1, line 2)."""
        K = self.kernel(X, X)
        eye = torch.eye(X.shape[0], dtype=K.dtype, device=K.device)
        return cholesky(K + self.noise.to(K.dtype) * eye, what="training covariance K + sigma^2 I")

    def log_marginal_likelihood(self, X: Tensor, y: Tensor) -> Tensor:
        """``log N(y | 0, K + sigma^2 I) = -1/2 y^T alpha - sum log diag L - n/2 log 2 pi`` (Alg. 2.1, line 7)."""
        L = self.Ky_cholesky(X)
        a = solve_lower(L, y.unsqueeze(-1)).squeeze(-1)  # L^{-1} y
        return -0.5 * (a @ a) - 0.5 * logdet_from_cholesky(L) - 0.5 * X.shape[0] * math.log(2 * math.pi)

    def loss(self, X: Tensor, y: Tensor, num_data: int) -> Tensor:
        return -self.log_marginal_likelihood(X, y) / num_data

    @torch.no_grad()
    def fit_posterior(self, X: Tensor, y: Tensor, comm: Comm = LOCAL) -> None:
        if comm.world_size > 1:  # pragma: no cover - an exact GP does not shard
            raise NotImplementedError("The exact GP runs in one process.")
        L = self.Ky_cholesky(X)
        self.cache = {"X": X.clone(), "L": L, "alpha": cho_solve(L, y.unsqueeze(-1)).squeeze(-1)}

    def predict_chunk(self, X: Tensor) -> tuple[Tensor, Tensor]:
        Kxs = self.kernel(self.cache["X"], X)  # [n, c]
        mean = Kxs.T @ self.cache["alpha"]  # Alg. 2.1, line 4
        v = solve_lower(self.cache["L"], Kxs)  # line 5
        var = (self.kernel.diag(X) - (v * v).sum(0)).clamp_min(0.0)  # line 6; clamp removes round-off only
        return mean, var

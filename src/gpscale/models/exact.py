"""The exact GP: O(n^3) Cholesky of K + sigma^2 I. For n up to a few thousand, and as the reference."""
from __future__ import annotations

import torch
from torch import Tensor

from ..distributed import LOCAL, Comm
from ..linalg import cho_solve, cholesky, gaussian_log_likelihood, solve_lower
from .base import GPModel, PredictiveFactors, register

__all__ = ["ExactGP"]


@register("exact")
class ExactGP(GPModel):
    """Exact GP regression (Rasmussen & Williams, Alg. 2.1), trained full batch on the log marginal likelihood.

    Memory is O(n^2): use it up to n of about 10^4; the cache keeps the training inputs and the n x n factor.
    """

    full_batch = True
    # K is n x n over every process's rows: each process gathers them all, for the same answer but no speed-up

    def Ky(self, X: Tensor) -> Tensor:
        """``K + sigma^2 I`` [n, n]."""
        K = self.kernel(X, X)
        return K + self.noise.to(K.dtype) * torch.eye(X.shape[0], dtype=K.dtype, device=K.device)

    def log_marginal_likelihood(self, X: Tensor, y: Tensor) -> Tensor:
        """``log N(y | 0, K + sigma^2 I) = -1/2 y^T alpha - sum log diag L - n/2 log 2 pi`` (Alg. 2.1, line 7)."""
        return gaussian_log_likelihood(self.Ky(X), y, what="training covariance K + sigma^2 I")

    def loss(self, X: Tensor, y: Tensor, num_data: int, comm: Comm = LOCAL, share: float = 1.0) -> Tensor:
        return -self.log_marginal_likelihood(comm.all_gather(X), comm.all_gather(y)) / num_data

    @torch.no_grad()
    def fit_posterior(self, X: Tensor, y: Tensor, comm: Comm = LOCAL) -> None:
        X, y = comm.all_gather(X), comm.all_gather(y)
        L = cholesky(self.Ky(X), what="training covariance K + sigma^2 I")  # Alg. 2.1, line 2
        self.cache = {"X": X.clone(), "L": L, "alpha": cho_solve(L, y.unsqueeze(-1)).squeeze(-1)}

    def predictive_factors(self, X: Tensor) -> PredictiveFactors:
        """Mean ``K_*f alpha`` and covariance ``K_** - v^T v``, ``v = L^{-1} K_f*`` (Alg. 2.1, lines 4-6)."""
        Kxs = self.kernel(self.cache["X"], X)  # [n, c]
        return PredictiveFactors(Kxs.T @ self.cache["alpha"], solve_lower(self.cache["L"], Kxs), None)

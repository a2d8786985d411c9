"""SGPR: the collapsed variational bound of Titsias (2009), streamed in chunks, for inducing points and (through
:class:`CollapsedGP`) any inter-domain features.

With inducing points Z [m, d], ``Kuu = K(Z, Z) + jitter I = L L^T`` and features ``phi(x) = L^{-1} k_Z(x)``,
the Nyström approximation ``Q = Phi Phi^T`` makes SGPR a Bayesian linear model (``_linear.py``) plus a trace
term:

    log p(y) >= log N(y | 0, Q + sigma^2 I) - (tr K_ff - tr Q) / (2 sigma^2).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..distributed import LOCAL, Comm
from ..linalg import cholesky, solve_lower
from . import _linear
from .base import GPModel, PredictiveFactors, register
from .inducing import kmeans_centers

__all__ = ["CollapsedGP", "SGPR"]


class CollapsedGP(GPModel):
    """The Titsias bound for any inducing features: a subclass supplies ``Kuu()`` [m, m] and ``Kuf(X)`` [m, c]
    (and ``Kff_diag(X)`` [c] if not the kernel's diagonal); the bound, the streamed statistics, the posterior and
    the predictions are shared. Trained full batch.

    Args:
        solver: ``'cholesky'`` (the Gram matrix of K_uf whitened on the m x m core: fast), ``'qr'`` (TSQR of
            features whitened row by row: stable for tiny noise and in float32) or ``'auto'`` (default:
            ``'cholesky'`` for the training objective on float64 data, ``'qr'`` otherwise and for the posterior
            fit). Measured on pol (SGPR, m = 512, noise 0.018), the float32 bound is off by 2.4e-4 relative with
            ``'cholesky'`` and by 5e-7 with ``'qr'``. Whitening the Gram matrix amplifies its rounding by cond(K_uu)^2,
            which learned inducing points can make large: on Friedman #1 (n = 20,000) the converged model's
            ``I + A / sigma^2`` needed jitter on the Cholesky path, where QR needs none.
        **kwargs: kernel, likelihood and chunking options of :class:`GPModel`.
    """

    full_batch = True
    data_parallel = "statistics"

    def __init__(self, n_features: int, solver: str = "auto", **kwargs):
        super().__init__(n_features, **kwargs)
        if solver not in ("auto", "cholesky", "qr"):
            raise ValueError(f"solver must be 'auto', 'cholesky' or 'qr', got {solver!r}.")
        self.solver = solver

    def Kuu(self) -> Tensor:  # pragma: no cover - interface
        """[m, m]"""
        raise NotImplementedError

    def Kuf(self, X: Tensor) -> Tensor:  # pragma: no cover - interface
        """[m, c]"""
        raise NotImplementedError

    def Kff_diag(self, X: Tensor) -> Tensor:
        """[c]"""
        return self.kernel.diag(X)

    def Lu(self) -> Tensor:
        """Cholesky factor of Kuu [m, m], float64."""
        return cholesky(self.Kuu().to(_linear.CORE), what="inducing covariance Kuu")

    def features(self, Lu: Tensor):
        """``x -> phi(x) = (L^{-1} Kuf)^T`` [c, m] (computed in the data dtype)."""

        def phi(X: Tensor) -> Tensor:
            return solve_lower(Lu.to(X.dtype), self.Kuf(X)).T

        return phi

    def collapse(self, X: Tensor, y: Tensor, comm: Comm = LOCAL,
                 posterior: bool = False) -> tuple[Tensor, _linear.Collapsed]:
        """Cholesky of Kuu and the collapsed posterior of the whitened inducing values (``posterior``: for the
        posterior fit, where ``solver='auto'`` takes the stable QR path)."""
        Lu = self.Lu()
        fast = X.dtype == torch.float64 and not posterior
        solver = self.solver if self.solver != "auto" else ("cholesky" if fast else "qr")
        if solver == "qr":
            post = _linear.collapse_qr(self.features(Lu), X, y, self.noise, chunk_size=self.chunk_size,
                                       prior_diag=self.Kff_diag, comm=comm)
        else:
            stats = _linear.accumulate(lambda Xc: self.Kuf(Xc).T, X, y, chunk_size=self.chunk_size,
                                       prior_diag=self.Kff_diag, whiten=Lu, comm=comm)
            post = _linear.collapse_cholesky(stats, self.noise)
        return Lu, post

    def elbo(self, X: Tensor, y: Tensor, comm: Comm = LOCAL) -> Tensor:
        """The Titsias bound on log p(y) (float64 scalar)."""
        _, post = self.collapse(X, y, comm)
        trace_term = (post.prior_trace - post.feature_trace) / self.noise.to(_linear.CORE)
        return _linear.log_evidence(post, self.noise) - 0.5 * trace_term

    def loss(self, X: Tensor, y: Tensor, num_data: int, comm: Comm = LOCAL) -> Tensor:
        return -self.elbo(X, y, comm) / num_data

    @torch.no_grad()
    def fit_posterior(self, X: Tensor, y: Tensor, comm: Comm = LOCAL) -> None:
        Lu, post = self.collapse(X, y, comm, posterior=True)
        self.cache = {"Lu": Lu, "L_B": post.L_B, "w_mean": post.weight_mean}

    def optimal_q(self, X: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """The optimal whitened q(v) = N(mean [m], S S^T), S [m, m] lower; SVGP with it attains this bound."""
        _, post = self.collapse(X, y)
        eye = torch.eye(post.L_B.shape[0], dtype=post.L_B.dtype, device=post.L_B.device)
        L_B_inv = solve_lower(post.L_B, eye)  # S S^T = B^{-1} = L_B^{-T} L_B^{-1}
        return post.weight_mean, cholesky(L_B_inv.T @ L_B_inv, what="optimal q(v) covariance")

    def prior_variance(self, X: Tensor) -> Tensor:
        return self.Kff_diag(X)

    def predictive_factors(self, X: Tensor) -> PredictiveFactors:
        """The whitened weights' posterior at ``phi(x)``, plus ``k(x, x') - phi(x)^T phi(x')``: what the inducing
        features cannot explain."""
        Phi = self.features(self.cache["Lu"])(X).to(_linear.CORE)  # [c, m]
        mean, _, U, _ = _linear.weight_space_factors(self.cache["L_B"], self.cache["w_mean"], Phi)
        return PredictiveFactors(mean, Phi.T, U)


@register("sgpr")
class SGPR(CollapsedGP):
    """Sparse GP regression with inducing points Z and the Titsias bound, trained full batch.

    Args:
        n_inducing: number of inducing points m (k-means initialised).
        learn_inducing: optimise Z with the hyperparameters.
        jitter: added to the diagonal of Kuu (absolute, standardised units).
        **kwargs: ``solver`` and the options of :class:`CollapsedGP`.
    """

    def __init__(self, n_features: int, n_inducing: int = 512, learn_inducing: bool = True,
                 jitter: float = 1e-6, **kwargs):
        super().__init__(n_features, **kwargs)
        self.n_inducing = int(n_inducing)
        self.jitter = float(jitter)
        self.Z = nn.Parameter(torch.zeros(self.n_inducing, self.n_features), requires_grad=learn_inducing)

    def init(self, X: Tensor, y: Tensor, seed: int = 0) -> None:
        with torch.no_grad():
            self.Z.copy_(kmeans_centers(X, self.n_inducing, seed))

    def Kuu(self) -> Tensor:
        """[m, m]"""
        eye = torch.eye(self.n_inducing, dtype=self.Z.dtype, device=self.Z.device)
        return self.kernel(self.Z, self.Z) + self.jitter * eye

    def Kuf(self, X: Tensor) -> Tensor:
        """[m, c]"""
        return self.kernel(self.Z, X)

"""The three GPyTorch peers (exact GP, SGPR, SVGP) and the registry of every peer by its benchmark key."""
from __future__ import annotations

import gpytorch
import torch
from gpytorch.kernels import InducingPointKernel
from gpytorch.variational import VariationalStrategy
from torch import Tensor

from ..official_softki import OfficialSoftKIPeer
from .gpytorch_models import ExactGPModel, SVGPModel, peer_kernel
from .peer import PeerModel


class ExactPeer(PeerModel):
    """GPyTorch's exact GP (``ExactMarginalLogLikelihood``, full-batch Adam)."""

    name = "gpytorch-exact"

    def _build(self):
        return ExactGPModel(peer_kernel(self.kernel_name, self.n_features), self.likelihood)

    def _set_data(self, X, y):
        self.model.set_train_data(inputs=X, targets=y, strict=False)

    def _mll(self, num_data):
        return gpytorch.mlls.ExactMarginalLogLikelihood(self.likelihood, self.model)

    def _predict(self, X, observed):
        if self.model.train_inputs is None:
            raise RuntimeError(f"{self.name} has no training data: call fit (or objective) first.")
        return super()._predict(X, observed)


class SGPRPeer(ExactPeer):
    """GPyTorch's SGPR: an ExactGP with ``InducingPointKernel(ScaleKernel(RBFKernel))``; the Titsias trace term
    is the kernel's added loss term inside ``ExactMarginalLogLikelihood``.

    Prediction: by default (``gpytorch.settings.sgpr_diagonal_correction`` on, GPyTorch 1.15) the kernel's
    diagonal correction is applied in eval mode to the *joint* [train; test] covariance, so the training
    covariance becomes ``Q + diag(K - Q) + sigma^2 I`` and the predictions are FITC's predictive equations (at
    hyperparameters trained on Titsias' bound), not Titsias' predictive (cornellius-gp/gpytorch#1715). With
    ``diagonal_correction=False`` the mean is Titsias' and the variance is the SoR one,
    ``Q** - Q*f (Q + sigma^2 I)^-1 Qf*``: Titsias' predictive variance minus ``k** - Q**``.

    Args:
        diagonal_correction: the value of ``gpytorch.settings.sgpr_diagonal_correction`` for every call
            (default True, GPyTorch's default, which is what users get).
    """

    name = "gpytorch-sgpr"

    def __init__(self, n_features: int, n_inducing: int, *, diagonal_correction: bool = True, **kwargs):
        self.diagonal_correction = bool(diagonal_correction)
        super().__init__(n_features, n_inducing, **kwargs)

    def settings(self):
        stack = super().settings()
        stack.enter_context(gpytorch.settings.sgpr_diagonal_correction(self.diagonal_correction))
        return stack

    def _build(self):
        Z = torch.zeros(self.n_inducing, self.n_features)
        kernel = InducingPointKernel(peer_kernel(self.kernel_name, self.n_features), inducing_points=Z,
                                     likelihood=self.likelihood)
        return ExactGPModel(kernel, self.likelihood)

    @property
    def scale_kernel(self):
        return self.model.covar_module.base_kernel

    @property
    def inducing_points(self):
        return self.model.covar_module.inducing_points.detach()

    def set_inducing_points(self, Z):
        with torch.no_grad():
            self.model.covar_module.inducing_points.copy_(Z.to(self.model.covar_module.inducing_points))


class SVGPPeer(PeerModel):
    """GPyTorch's SVGP: whitened ``VariationalStrategy`` with a ``CholeskyVariationalDistribution``,
    ``VariationalELBO(num_data=n)``, Adam on model and likelihood over seeded minibatches.

    Args:
        jitter_val: the strategy's jitter (None: GPyTorch's default, 1e-6 in float64, 1e-4 in float32).
    """

    name = "gpytorch-svgp"
    full_batch = False

    def __init__(self, n_features: int, n_inducing: int, *, jitter_val: float | None = None, **kwargs):
        self._jitter_val = jitter_val
        super().__init__(n_features, n_inducing, **kwargs)

    def _build(self):
        return SVGPModel(torch.zeros(self.n_inducing, self.n_features),
                         peer_kernel(self.kernel_name, self.n_features), self._jitter_val)

    @property
    def strategy(self) -> VariationalStrategy:
        return self.model.variational_strategy

    @property
    def inducing_points(self):
        return self.strategy.inducing_points.detach()

    def set_inducing_points(self, Z):
        with torch.no_grad():
            self.strategy.inducing_points.copy_(Z.to(self.strategy.inducing_points))

    def set_variational(self, q_mu: Tensor, q_sqrt: Tensor) -> None:
        """Set the whitened q(v) = N(q_mu, q_sqrt q_sqrt^T) (q_sqrt lower triangular), and mark GPyTorch's
        strategy as initialised so that its first call does not overwrite (or re-whiten) it."""
        dist = self.strategy._variational_distribution
        with torch.no_grad():
            dist.variational_mean.copy_(q_mu.to(dist.variational_mean))
            dist.chol_variational_covar.copy_(torch.tril(q_sqrt).to(dist.chol_variational_covar))
            self.strategy.variational_params_initialized.fill_(1)
            self.strategy.updated_strategy.fill_(True)
        self.reset_caches()

    def _mll(self, num_data):
        return gpytorch.mlls.VariationalELBO(self.likelihood, self.model, num_data=num_data)


PEERS: dict[str, type[PeerModel] | type[OfficialSoftKIPeer]] = {
    cls.name: cls for cls in (ExactPeer, SGPRPeer, SVGPPeer, OfficialSoftKIPeer)}


def make_peer(name: str, n_features: int, n_inducing: int | None = None, dtype: torch.dtype = torch.float64,
              **kwargs) -> PeerModel | OfficialSoftKIPeer:
    """A peer by its benchmark key: ``gpytorch-exact``, ``gpytorch-sgpr``, ``gpytorch-svgp`` or
    ``softki-official``.

    ``n_inducing`` is required by all but the exact GP, which ignores it; ``kwargs`` go to the peer (``device``;
    the GPyTorch peers' ``chunk_size``, ``max_cholesky_size``, SGPR's ``diagonal_correction``, SVGP's
    ``jitter_val``). ``softki-official`` raises :class:`~gpscale.bench.official_softki.PeerUnavailable` when the
    authors' code is not found."""
    if name not in PEERS:
        raise ValueError(f"Unknown peer {name!r}; choose one of {', '.join(sorted(PEERS))}.")
    cls = PEERS[name]
    if cls is ExactPeer:
        return cls(n_features, dtype=dtype, **kwargs)
    if n_inducing is None:
        raise ValueError(f"{name} needs n_inducing.")
    return cls(n_features, n_inducing, dtype=dtype, **kwargs)

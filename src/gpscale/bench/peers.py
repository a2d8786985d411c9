"""GPyTorch baselines, written as a GPyTorch user would write them, to run side by side with gpscale.

Three GPyTorch peers, registered for the benchmark as methods (``PEERS`` also registers ``softki-official``, the SoftKI
authors' code, from :mod:`gpscale.bench.official_softki`: the same ``fit`` and ``predict``, a mean only):

- ``gpytorch-exact``: :class:`gpytorch.models.ExactGP`, full-batch Adam on ``ExactMarginalLogLikelihood``;
- ``gpytorch-sgpr``: an ExactGP whose kernel is an :class:`~gpytorch.kernels.InducingPointKernel` (Titsias'
  collapsed bound: the trace term enters ``ExactMarginalLogLikelihood`` as an added loss term), full-batch Adam;
- ``gpytorch-svgp``: an :class:`~gpytorch.models.ApproximateGP` with a ``CholeskyVariationalDistribution`` and a
  whitened ``VariationalStrategy(learn_inducing_locations=True)``, Adam on all parameters (model and likelihood)
  on ``VariationalELBO(num_data=n)``, minibatches from a seeded reshuffle every epoch.

All use ``ZeroMean`` (our models are zero-mean on standardised y), ``ScaleKernel(RBFKernel(ard_num_dims=d))`` and
``GaussianLikelihood()`` with a learned noise and GPyTorch's default constraints (noise > 1e-4) and default
settings (for instance Cholesky up to n = 800 and CG/Lanczos above, unless ``max_cholesky_size`` is given).

Interface (uniform over the three)::

    peer = make_peer("gpytorch-svgp", n_features=d, n_inducing=m, dtype=torch.float64)
    seconds = peer.fit(X, y, epochs=50, lr=0.01, batch_size=1024, seed=0, Z=kmeans_centers(X, m, 0))
    mean, var = peer.predict(X_test)            # moments of y (noise included)
    mean_f, var_f = peer.predict_latent(X_test) # moments of the latent f
    value = peer.objective(X, y)                # the training objective (log marginal likelihood / bound /
                                                # ELBO, summed over points, not per point), differentiable

:func:`copy_hyperparameters` puts a gpscale model's parameters into a peer, so that the two can be compared on
identical parameters. Three GPyTorch conventions differ from ours and are *not* changed by it:

- GPyTorch's ``InducingPointKernel`` adds no jitter to K_uu (ours adds ``SGPR.jitter``);
- GPyTorch's whitened ``VariationalStrategy`` adds ``jitter_val`` both to K_uu (as ours adds ``SVGP.jitter``;
  copy_hyperparameters sets ``jitter_val = ours.jitter``) *and* to the prior variance k(x, x) of every predicted
  point, so its latent predictive variance (and hence its expected log-likelihood) is larger than ours by exactly
  ``jitter_val``;
- GPyTorch's SGPR predicts FITC-style by default (see :class:`SGPRPeer`); its objective is Titsias' bound, as ours.
"""
from __future__ import annotations

import contextlib
import time

import torch
from torch import Tensor

from ..train import progress_bar
from .official_softki import OfficialSoftKIPeer

try:
    import gpytorch
    from gpytorch.distributions import MultivariateNormal
    from gpytorch.kernels import AdditiveKernel, InducingPointKernel, MaternKernel, RBFKernel, ScaleKernel
    from gpytorch.likelihoods import GaussianLikelihood
    from gpytorch.means import ZeroMean
    from gpytorch.variational import CholeskyVariationalDistribution, VariationalStrategy
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        "The GPyTorch peer baselines need gpytorch: pip install 'gpscale[bench]' (or pip install gpytorch)."
    ) from err

__all__ = ["PEERS", "PeerModel", "ExactPeer", "SGPRPeer", "SVGPPeer", "make_peer", "copy_hyperparameters"]


# --- the GPyTorch models, as in GPyTorch's own examples ----------------------------------------------------

def _rbf_ard(n_features: int) -> ScaleKernel:
    return ScaleKernel(RBFKernel(ard_num_dims=n_features))


PEER_KERNELS = ("rbf", "additive_matern12", "additive_matern32", "additive_matern52")


def _kernel(name: str, n_features: int) -> gpytorch.kernels.Kernel:
    """``'rbf'``: a scaled ARD RBF; ``'additive_matern{12,32,52}'``: a sum over input dimensions of scaled 1-D
    Matérns (``active_dims``), gpscale's ``AdditiveMatern``."""
    if name == "rbf":
        return _rbf_ard(n_features)
    nus = {"additive_matern12": 0.5, "additive_matern32": 1.5, "additive_matern52": 2.5}
    if name not in nus:
        raise ValueError(f"Unknown peer kernel {name!r}; choose one of {PEER_KERNELS}.")
    return AdditiveKernel(*[ScaleKernel(MaternKernel(nu=nus[name], active_dims=(d,))) for d in range(n_features)])


class _ExactGPModel(gpytorch.models.ExactGP):
    """Zero mean, the given covariance module; training data set later with ``set_train_data``."""

    def __init__(self, covar_module: gpytorch.kernels.Kernel, likelihood: GaussianLikelihood):
        super().__init__(None, None, likelihood)
        self.mean_module = ZeroMean()
        self.covar_module = covar_module

    def forward(self, x: Tensor) -> MultivariateNormal:
        return MultivariateNormal(self.mean_module(x), self.covar_module(x))


class _SVGPModel(gpytorch.models.ApproximateGP):
    def __init__(self, inducing_points: Tensor, covar_module: gpytorch.kernels.Kernel,
                 jitter_val: float | None = None):
        q = CholeskyVariationalDistribution(inducing_points.shape[0])
        strategy = VariationalStrategy(self, inducing_points, q, learn_inducing_locations=True,
                                       jitter_val=jitter_val)
        super().__init__(strategy)
        self.mean_module = ZeroMean()
        self.covar_module = covar_module

    def forward(self, x: Tensor) -> MultivariateNormal:
        return MultivariateNormal(self.mean_module(x), self.covar_module(x))


# --- the uniform interface ---------------------------------------------------------------------------------

class PeerModel:
    """A GPyTorch baseline behind one small interface (see the module docstring).

    Args:
        n_features: input dimension d.
        n_inducing: number of inducing points m (SGPR, SVGP).
        dtype, device: of every parameter; inputs are cast to them.
        chunk_size: test rows per chunk in :meth:`predict`.
        max_cholesky_size: if given, run under ``gpytorch.settings.max_cholesky_size(...)`` (GPyTorch's default
            switches from Cholesky to CG/Lanczos above n = 800).
        kernel: ``'rbf'`` (ARD; default) or ``'additive_matern12'`` / ``'32'`` / ``'52'`` (see ``PEER_KERNELS``).

    Attributes:
        model: the ``gpytorch`` model; likelihood: its ``GaussianLikelihood``;
        history: one dict per epoch of the last :meth:`fit` (``epoch``, ``loss`` per data point, ``seconds``).
    """

    name: str = ""
    full_batch: bool = True

    def __init__(self, n_features: int, n_inducing: int | None = None, *, dtype: torch.dtype = torch.float64,
                 device: str | torch.device = "cpu", chunk_size: int = 4096, max_cholesky_size: int | None = None,
                 kernel: str = "rbf"):
        self.n_features = int(n_features)
        self.kernel_name = kernel
        _kernel(kernel, self.n_features)  # a clear error for an unknown name, before anything is built
        self.n_inducing = None if n_inducing is None else int(n_inducing)
        self.dtype = dtype
        self.device = torch.device(device)
        self.chunk_size = int(chunk_size)
        self.max_cholesky_size = max_cholesky_size
        self.history: list[dict] = []
        self.likelihood = GaussianLikelihood()
        self.model = self._build()
        self.model.to(device=self.device, dtype=self.dtype)
        self.likelihood.to(device=self.device, dtype=self.dtype)

    # --- to be provided by each peer ---------------------------------------------------------------------
    def _build(self) -> gpytorch.models.GP:  # pragma: no cover - interface
        raise NotImplementedError

    @property
    def scale_kernel(self) -> ScaleKernel:
        """The ``ScaleKernel(RBFKernel)`` holding lengthscale and outputscale (or the ``AdditiveKernel`` of scaled
        Matérns)."""
        return self.model.covar_module

    @property
    def inducing_points(self) -> Tensor | None:
        return None

    def _set_inducing_points(self, Z: Tensor) -> None:
        raise ValueError(f"{self.name} has no inducing points.")

    def _mll(self, num_data: int) -> gpytorch.mlls.MarginalLogLikelihood:  # pragma: no cover - interface
        raise NotImplementedError

    # --- shared ------------------------------------------------------------------------------------------
    def parameters(self) -> list[torch.nn.Parameter]:
        """Every trainable parameter of model and likelihood, each once."""
        seen, params = set(), []
        for p in list(self.model.parameters()) + list(self.likelihood.parameters()):
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
        return params

    @property
    def lengthscale(self) -> Tensor:
        """[d]"""
        if isinstance(self.scale_kernel, AdditiveKernel):
            return torch.cat([k.base_kernel.lengthscale.detach().reshape(-1) for k in self.scale_kernel.kernels])
        return self.scale_kernel.base_kernel.lengthscale.detach().reshape(-1)

    @property
    def outputscale(self) -> Tensor:
        """s^2 (an additive kernel's total, the sum of its terms')"""
        if isinstance(self.scale_kernel, AdditiveKernel):
            return sum(k.outputscale.detach() for k in self.scale_kernel.kernels)
        return self.scale_kernel.outputscale.detach()

    @property
    def noise(self) -> Tensor:
        return self.likelihood.noise.detach().reshape(())

    def settings(self) -> contextlib.ExitStack:
        """The GPyTorch settings every call runs under."""
        stack = contextlib.ExitStack()
        if self.max_cholesky_size is not None:
            stack.enter_context(gpytorch.settings.max_cholesky_size(self.max_cholesky_size))
        return stack

    def reset_caches(self) -> None:
        """Forget GPyTorch's test-time caches (prediction strategy, K_uu factors); call after changing
        parameters by hand."""
        for module in list(self.model.modules()) + list(self.likelihood.modules()):
            if isinstance(module, gpytorch.Module):
                module._clear_cache()

    def _as(self, X: Tensor, y: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        X = torch.as_tensor(X).to(device=self.device, dtype=self.dtype)
        y = None if y is None else torch.as_tensor(y).to(device=self.device, dtype=self.dtype).reshape(-1)
        return X, y

    def _train_mode(self) -> None:
        self.model.train()
        self.likelihood.train()

    def _set_data(self, X: Tensor, y: Tensor) -> None:
        """Full-batch peers keep their training data (ExactGP)."""

    def objective(self, X: Tensor, y: Tensor, num_data: int | None = None) -> Tensor:
        """The training objective at the current parameters, summed (not per point), differentiable:
        log marginal likelihood (exact), Titsias' bound (SGPR), ELBO estimate for a set of ``num_data`` points
        from the batch (X, y) (SVGP; default ``num_data = len(X)``). For exact and SGPR, (X, y) becomes the
        training data."""
        X, y = self._as(X, y)
        num_data = X.shape[0] if num_data is None else int(num_data)
        self._set_data(X, y)
        self._train_mode()
        with self.settings():
            return self._mll(num_data)(self.model(X), y) * num_data

    def fit(self, X: Tensor, y: Tensor, *, epochs: int, lr: float, batch_size: int | None = None, seed: int = 0,
            Z: Tensor | None = None, progress: bool = False) -> list[float]:
        """Train with Adam from the current parameters; returns the wall-clock seconds of each epoch.

        Args:
            epochs: full-batch peers take one Adam step per epoch; SVGP passes over all minibatches.
            batch_size: SVGP minibatch size (default 1024); ignored by full-batch peers.
            seed: seeds the per-epoch reshuffles (and k-means when ``Z`` is not given).
            Z: initial inducing points [m, d]; default: :func:`gpscale.models.inducing.kmeans_centers`, as ours.
            progress: a progress bar with the loss (:func:`gpscale.train.progress_bar`).
        """
        X, y = self._as(X, y)
        n = X.shape[0]
        if self.n_inducing is not None:
            if Z is None:
                from ..models.inducing import kmeans_centers

                Z = kmeans_centers(X, self.n_inducing, seed)
            self._set_inducing_points(torch.as_tensor(Z))
        elif Z is not None:
            raise ValueError(f"{self.name} has no inducing points; do not pass Z.")
        self._set_data(X, y)
        self.reset_caches()
        generator = torch.Generator().manual_seed(int(seed))
        optimiser = torch.optim.Adam(self.parameters(), lr=lr)
        mll = self._mll(n)
        self.history = []
        seconds = []
        with self.settings():
            bar = progress_bar(range(int(epochs)), desc=self.name, unit="epoch", enabled=progress)
            for epoch in bar:
                tic = time.perf_counter()
                self._train_mode()
                if self.full_batch:
                    batches = [None]
                else:
                    b = min(n, 1024 if batch_size is None else int(batch_size))
                    batches = torch.randperm(n, generator=generator).to(self.device).split(b)
                total = 0.0
                for idx in batches:
                    xb, yb = (X, y) if idx is None else (X[idx], y[idx])
                    optimiser.zero_grad(set_to_none=True)
                    loss = -mll(self.model(xb), yb)
                    loss.backward()
                    optimiser.step()
                    total += loss.item() * xb.shape[0]
                elapsed = time.perf_counter() - tic
                seconds.append(elapsed)
                self.history.append({"epoch": epoch, "loss": total / n, "seconds": elapsed})
                bar.set_postfix(loss=f"{total / n:.4g}")
            bar.close()
        self.model.eval()
        self.likelihood.eval()
        return seconds

    def _predict(self, X: Tensor, observed: bool) -> tuple[Tensor, Tensor]:
        X, _ = self._as(X)
        self.model.eval()
        self.likelihood.eval()
        means, variances = [], []
        with torch.no_grad(), gpytorch.settings.fast_pred_var(False), self.settings():
            for Xc in X.split(self.chunk_size):
                dist = self.model(Xc)
                if observed:
                    dist = self.likelihood(dist)
                means.append(dist.mean)
                variances.append(dist.variance)
        return torch.cat(means), torch.cat(variances)

    def predict(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """Mean and variance [n*] of y at X [n*, d] (noise included), in chunks."""
        return self._predict(X, observed=True)

    def predict_latent(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """Mean and variance [n*] of the latent f at X [n*, d], in chunks."""
        return self._predict(X, observed=False)


class ExactPeer(PeerModel):
    """GPyTorch's exact GP (``ExactMarginalLogLikelihood``, full-batch Adam)."""

    name = "gpytorch-exact"

    def _build(self):
        return _ExactGPModel(_kernel(self.kernel_name, self.n_features), self.likelihood)

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
        kernel = InducingPointKernel(_kernel(self.kernel_name, self.n_features), inducing_points=Z,
                                     likelihood=self.likelihood)
        return _ExactGPModel(kernel, self.likelihood)

    @property
    def scale_kernel(self):
        return self.model.covar_module.base_kernel

    @property
    def inducing_points(self):
        return self.model.covar_module.inducing_points.detach()

    def _set_inducing_points(self, Z):
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
        return _SVGPModel(torch.zeros(self.n_inducing, self.n_features), _kernel(self.kernel_name, self.n_features),
                          self._jitter_val)

    @property
    def strategy(self) -> VariationalStrategy:
        return self.model.variational_strategy

    @property
    def inducing_points(self):
        return self.strategy.inducing_points.detach()

    def _set_inducing_points(self, Z):
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


def copy_hyperparameters(ours, peer: PeerModel) -> PeerModel:
    """Give ``peer`` the parameters of our model ``ours`` (an ``ExactGP``, ``SGPR`` or ``SVGP`` of gpscale):
    lengthscales, outputscale, noise, inducing points and, for SVGP, the whitened q(v) and the K_uu jitter
    (``jitter_val = ours.jitter``). Returns ``peer``.

    Raises ValueError when the two do not correspond (model kinds, kernel other than RBF, dimensions, number of
    inducing points) or when our noise is below GPyTorch's noise constraint (1e-4 by default).
    """
    from ..kernels.stationary import RBF
    from ..models.exact import ExactGP
    from ..models.sgpr import SGPR
    from ..models.svgp import SVGP

    pairs = {ExactPeer: ExactGP, SGPRPeer: SGPR, SVGPPeer: SVGP}
    expected = pairs[type(peer)]
    if type(ours) is not expected:
        raise ValueError(f"{peer.name} corresponds to gpscale's {expected.__name__}, got {type(ours).__name__}.")
    if not isinstance(ours.kernel, RBF):
        raise ValueError(f"The GPyTorch peers use an RBF kernel; our model has {type(ours.kernel).__name__}.")
    d = peer.n_features
    if ours.n_features != d:
        raise ValueError(f"Input dimensions differ: ours {ours.n_features}, peer {d}.")
    noise = ours.noise.detach()
    lower = peer.likelihood.noise_covar.raw_noise_constraint.lower_bound
    if noise <= lower:
        raise ValueError(f"Our noise {noise.item():.3g} is not above GPyTorch's noise constraint ({lower.item():.3g}).")

    with torch.no_grad():
        base = peer.scale_kernel
        base.base_kernel.lengthscale = ours.kernel.lengthscale.detach().expand(d).reshape(1, d).to(peer.dtype)
        base.outputscale = ours.kernel.outputscale.detach().to(peer.dtype)
        peer.likelihood.noise = noise.reshape(1).to(peer.dtype)
        if isinstance(ours, (SGPR, SVGP)):
            Z = ours.features.Z
            if Z.shape[0] != peer.n_inducing:
                raise ValueError(f"Numbers of inducing points differ: ours {Z.shape[0]}, peer {peer.n_inducing}.")
            peer._set_inducing_points(Z.detach())
    if isinstance(ours, SVGP):
        if not ours.whiten:  # GPyTorch's VariationalStrategy holds the whitened q(v)
            raise ValueError("copy_hyperparameters copies a whitened q; this SVGP has whiten=False.")
        peer.strategy.jitter_val = float(ours.jitter)
        peer.set_variational(ours.q_mu.detach(), ours.q_sqrt.detach())
    peer.reset_caches()
    return peer

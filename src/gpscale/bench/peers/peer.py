"""The one small interface every GPyTorch peer sits behind: fit, predict, predict_latent and objective."""
from __future__ import annotations

import contextlib
import time

import gpytorch
import torch
from gpytorch.kernels import AdditiveKernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood
from torch import Tensor

from ...train import progress_bar
from .gpytorch_models import peer_kernel


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
        peer_kernel(kernel, self.n_features)  # a clear error for an unknown name, before anything is built
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

    def set_inducing_points(self, Z: Tensor) -> None:
        """Set the inducing points Z [m, d] (SGPR, SVGP); a peer without them raises ValueError."""
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
                from ...models.inducing import kmeans_centers

                Z = kmeans_centers(X, self.n_inducing, seed)
            self.set_inducing_points(torch.as_tensor(Z))
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

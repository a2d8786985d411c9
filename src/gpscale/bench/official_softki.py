"""The SoftKI authors' own model code as a benchmark peer, ``softki-official``.

The code (github danehuang/softki, Apache-2.0: its ``gp/softki`` and ``linear_solver`` packages) does not ship with
gpscale. The peer finds it at run time, in the first of these folders that holds ``softki_official/``:

1. ``$GPSCALE_PEERS``, when set;
2. ``<GPSCALE_DATA>/../peers``, when ``GPSCALE_DATA`` is set;
3. ``shared/peers`` in the parent folder of the current directory.

Without it, building the peer raises :class:`PeerUnavailable`, which the benchmark runner records as a skipped run
with the message (where it looked, how to point at the code).

The peer builds and trains the model as the authors' training script does for their paper runs: ``SoftGP`` with
``ScaleKernel(RBFKernel())`` (one shared lengthscale), inducing points from k-means, the noise fixed at 1e-3, the
Hutchinson estimate of the marginal likelihood with a dense solve, Adam on every parameter but the noise, under
``max_root_decomposition_size(100)`` and ``max_cholesky_size(1e7)``; then ``SoftGP.fit`` (the QR solve for the
interpolation weights) on the whole training set and ``SoftGP.pred`` for the mean. Minibatches come from a seeded
reshuffle every epoch instead of the script's ``DataLoader``; the Hutchinson probes from the global generator,
seeded for the training and restored after.

Its predictive variance (``SoftGP.pred_cov``) is wrong, so the peer predicts the mean only: its runs have an RMSE
and no NLPD or coverage.

Interface (as :mod:`gpscale.bench.peers`)::

    peer = OfficialSoftKIPeer(n_features=d, n_inducing=m, dtype=torch.float32)
    seconds = peer.fit(X, y, epochs=3, lr=0.01, batch_size=1024, seed=0, Z=kmeans_centers(X, m, 0))
    mean, variance = peer.predict(X_test)       # variance is None
"""
from __future__ import annotations

import contextlib
import importlib
import io
import os
import sys
import time
from pathlib import Path

import torch
from torch import Tensor

from ..train import progress_bar

__all__ = ["OFFICIAL_KEY", "PEERS_ENV", "PeerUnavailable", "OfficialSoftKIPeer", "candidate_folders",
           "find_official_code"]

OFFICIAL_KEY = "softki-official"
PEERS_ENV = "GPSCALE_PEERS"
FOLDER_NAME = "softki_official"
# the defaults of the authors' training script (gp/softki/train.py), which their README's pol run keeps
NOISE = 1e-3
MAX_ROOT_DECOMPOSITION_SIZE = 100
MAX_CHOLESKY_SIZE = int(1e7)
FIT_CHUNK_SIZE = 1024
PREDICT_CHUNK_SIZE = 1024  # as their evaluation's test batches
# SoftGP.fit with use_qr takes its small-input branch when n * d is at most this (their constant)
SMALL_INPUT_SIZE = 32768


class PeerUnavailable(RuntimeError):
    """A peer's code is not on this machine; the message says where it was looked for and how to point at it.
    The benchmark runner records the run as skipped, not failed."""


def candidate_folders() -> list[Path]:
    """The folders searched for ``softki_official/``, in order (see the module docstring)."""
    folders = []
    if os.environ.get(PEERS_ENV):
        folders.append(Path(os.environ[PEERS_ENV]))
    if os.environ.get("GPSCALE_DATA"):
        folders.append(Path(os.environ["GPSCALE_DATA"]) / ".." / "peers")
    folders.append(Path("..") / "shared" / "peers")
    return folders


def find_official_code() -> Path:
    """The ``softki_official`` folder (resolved), or :class:`PeerUnavailable` naming every place looked at."""
    folders = candidate_folders()
    for folder in folders:
        if (folder / FOLDER_NAME / "gp/softki/model.py").is_file():
            return (folder / FOLDER_NAME).resolve()
    looked = ", ".join(str((folder / FOLDER_NAME).resolve()) for folder in folders)
    raise PeerUnavailable(f"{OFFICIAL_KEY}: the SoftKI authors' code (github danehuang/softki, its gp/softki and "
                          f"linear_solver) was not found; looked in {looked}. Set {PEERS_ENV} to a folder that holds "
                          f"{FOLDER_NAME}/.")


def _official_model_class(code: Path) -> type:
    """``SoftGP`` from ``code/gp/softki/model.py``.

    The official modules import each other by top-level names (``gp``, ``linear_solver``), so ``code`` goes on
    ``sys.path``, once and at the end, where it shadows no installed package; a package of the same name found
    first is refused rather than used."""
    if str(code) not in sys.path:
        sys.path.append(str(code))
    module = importlib.import_module("gp.softki.model")
    origin = Path(module.__file__).resolve()
    if code not in origin.parents:
        raise ImportError(f"{OFFICIAL_KEY}: 'gp.softki.model' was imported from {origin}, not from {code}: another "
                          "package named 'gp' comes first on sys.path, or this process imported the code from "
                          "another folder before.")
    return module.SoftGP


def _official_settings() -> contextlib.ExitStack:
    """The GPyTorch settings the authors' training loop runs its marginal likelihood under."""
    import gpytorch
    from linear_operator.settings import max_cholesky_size

    stack = contextlib.ExitStack()
    stack.enter_context(gpytorch.settings.max_root_decomposition_size(MAX_ROOT_DECOMPOSITION_SIZE))
    stack.enter_context(max_cholesky_size(MAX_CHOLESKY_SIZE))
    return stack


class OfficialSoftKIPeer:
    """The authors' ``SoftGP`` behind the peers' interface (see the module docstring).

    Args:
        n_features: input dimension d.
        n_inducing: number of inducing points m.
        dtype, device: of the model; inputs are cast to them.

    Raises:
        PeerUnavailable: the official code is not in any of :func:`candidate_folders`.

    Attributes:
        model: the ``SoftGP`` of the last :meth:`fit` (None before);
        history: one dict per epoch of the last :meth:`fit` (``epoch``, ``loss`` per data point, ``seconds``).
    """

    name = OFFICIAL_KEY

    def __init__(self, n_features: int, n_inducing: int, *, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu"):
        self.soft_gp_class = _official_model_class(find_official_code())
        self.n_features = int(n_features)
        self.n_inducing = int(n_inducing)
        self.dtype = dtype
        self.device = torch.device(device)
        self.model = None
        self.history: list[dict] = []

    def _as(self, A: Tensor) -> Tensor:
        return torch.as_tensor(A).to(device=self.device, dtype=self.dtype)

    def _build(self, Z: Tensor):
        """A ``SoftGP`` with the authors' settings and inducing points ``Z`` [m, d]."""
        from gpytorch.kernels import RBFKernel

        with contextlib.redirect_stdout(io.StringIO()):  # it prints which interpolation it uses
            model = self.soft_gp_class(
                RBFKernel(), self._as(Z).clone(), noise=NOISE, learn_noise=False, use_scale=True,
                device=str(self.device), dtype=self.dtype, solver="solve", mll_approx="hutchinson",
                fit_chunk_size=FIT_CHUNK_SIZE, use_qr=True)
        return model.to(dtype=self.dtype)  # the kernel's parameters are created in the default dtype

    def _allocate_small_input_fit_buffers(self, n: int) -> None:
        """``SoftGP.fit``'s QR solve writes into ``fit_buffer`` [n + m, m] and ``fit_b`` [n], which only its branch
        for large inputs allocates (its small-input branch fails on None); allocate them as that branch does.
        Changes no number."""
        if n * self.n_features > SMALL_INPUT_SIZE:
            return
        m = self.model.inducing_points.shape[0]
        self.model.fit_buffer = torch.zeros(n + m, m, dtype=self.dtype, device=self.device)
        self.model.fit_b = torch.zeros(n, dtype=self.dtype, device=self.device)

    def fit(self, X: Tensor, y: Tensor, *, epochs: int, lr: float, batch_size: int | None = None, seed: int = 0,
            Z: Tensor | None = None, progress: bool = False) -> list[float]:
        """Train a new ``SoftGP`` with Adam, then solve for its weights on (X [n, d], y [n]); returns the
        wall-clock seconds of each training epoch (the weight solve is not in them, as in the authors' timings).

        Args:
            batch_size: minibatch size (default 1024).
            seed: seeds the per-epoch reshuffles, the Hutchinson probes and (when ``Z`` is not given) k-means.
            Z: initial inducing points [m, d]; default :func:`gpscale.models.inducing.kmeans_centers`.
            progress: a progress bar with the loss (:func:`gpscale.train.progress_bar`).
        """
        X, y = self._as(X), self._as(y).reshape(-1)
        n = X.shape[0]
        if Z is None:
            from ..models.inducing import kmeans_centers

            Z = kmeans_centers(X, self.n_inducing, seed)
        self.model = self._build(Z)
        # the official filter: the noise is not learned (with learn_noise=False it is no parameter anyway)
        optimiser = torch.optim.Adam([p for name, p in self.model.named_parameters() if "raw_noise" not in name],
                                     lr=lr)
        generator = torch.Generator().manual_seed(int(seed))
        b = min(n, 1024 if batch_size is None else int(batch_size))
        self.history, seconds = [], []
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(int(seed))
            bar = progress_bar(range(int(epochs)), desc=self.name, unit="epoch", enabled=progress)
            for epoch in bar:
                tic = time.perf_counter()
                total = 0.0
                for idx in torch.randperm(n, generator=generator).to(self.device).split(b):
                    optimiser.zero_grad(set_to_none=True)
                    with _official_settings():
                        loss = -self.model.mll(X[idx], y[idx])
                    loss.backward()
                    optimiser.step()
                    total += loss.item() * idx.shape[0]
                seconds.append(time.perf_counter() - tic)
                self.history.append({"epoch": epoch, "loss": total / n, "seconds": seconds[-1]})
                bar.set_postfix(loss=f"{total / n:.4g}")
            bar.close()
        self._allocate_small_input_fit_buffers(n)
        with torch.no_grad():
            self.model.fit(X, y)
        return seconds

    def predict(self, X: Tensor) -> tuple[Tensor, None]:
        """The predictive mean [n*] at X [n*, d], in chunks, and None for the variance (``pred_cov`` is wrong)."""
        if self.model is None:
            raise RuntimeError(f"{self.name} has no model: call fit first.")
        X = self._as(X)
        with torch.no_grad():
            return torch.cat([self.model.pred(Xc) for Xc in X.split(PREDICT_CHUNK_SIZE)]), None

"""SoftKI: soft kernel interpolation (Camaño & Huang, 2024, arXiv 2410.21419).

Each input gets a dense row of softmax interpolation weights over m learned points Z [m, d],

    w(x) = softmax_j(-||x - z_j||)   [m]        (Euclidean, not squared, distance)

and the kernel is interpolated from the inducing covariance ``K_zz = k(Z, Z)`` [m, m]:

    k~(x, x') = w(x)^T K_zz w(x'),     Q~_xx = W_xz K_zz W_xz^T.

With ``K_zz = L_zz L_zz^T`` (float64 core) this is a Bayesian linear model
(:class:`~gpscale.models.linear.engine.FeatureSpaceGP`) with features
``phi(x) = L_zz^T w(x)`` [m] and weights ``v ~ N(0, I)`` (the inducing values are ``u = L_zz v ~ N(0, K_zz)``).
The engine's posterior is the paper's (eqs. 24-25, Appendix A): with ``B = I + Phi^T Phi / beta^2`` and
``C^ = K_zz + K^_zx K^_xz / beta^2 = L_zz B L_zz^T`` (``K^_xz = W_xz K_zz``),

    mean(x*)  = phi(x*)^T B^{-1} Phi^T y / beta^2 = K^_*z C^{-1} K^_zx y / beta^2 = K^_*z alpha   (eq. 25)
    var f(x*) = ||L_B^{-1} phi(x*)||^2            = K^_*z C^{-1} K^_z*             (corrected eq. 24)

so the variance is a squared norm, >= 0 by construction. The posterior is fitted by the engine's streamed TSQR of
``[Phi / beta, y / beta; I, 0]`` in float64; since ``[Phi / beta; I] L_zz^T = [K^_xz / beta; U]`` with
``U = L_zz^T`` (``U^T U = K_zz``, the convention the paper misprints), this is the paper's QR solve (eqs. 26-30)
without ever forming C^ or holding an n x m buffer.

Training (Algorithm 1) minimises, per minibatch (X_b [B, d], y_b [B]), the sign-corrected Hutchinson pseudo-loss
of ``log N(y_b | 0, Sigma_b)``, ``Sigma_b = W_b K_zz W_b^T + beta^2 I``, divided by B. The noise
beta^2 is fixed at 1e-3 by default, as in the paper.
"""
from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from ...defaults import CONVERGENCE, MINIBATCH_TRAINING
from ...distributed import LOCAL, Comm
from ...kernels import inverse_softplus
from ...linalg import CORE, cholesky, solve, transposed_times
from ...options import check_options
from .engine import Features, FeatureSpaceGP
from ..base import BenchSize, register
from ..inducing import kmeans_centers

__all__ = ["SoftKI", "softmax_weights", "batch_covariance_solve", "hutchinson_pseudo_log_likelihood"]

# Lower bound of the learned per-dimension temperature, as in the official code.
MIN_TEMPERATURE = 5e-5
# The clamp of the squared distances before their square root (see softmax_weights).
MIN_SQ_DIST = 1e-12


class _SoftmaxWeights(torch.autograd.Function):
    """``W = softmax(-D)`` row-wise, ``D = sqrt(max(|x - z|^2, 1e-12))``, with the backward in closed form:

        dD = W * (rowsum(dW * W) - dW),     ds = dD / (2 D) where the clamp is inactive (else 0),
        dX = 2 (rowsum(ds) X - ds Z),       dZ = 2 (colsum(ds) Z - ds^T X),

    for ``s = |x|^2 - 2 x^T z + |z|^2``. Autograd through the expression takes a pass over [n, m] for each of its
    operators on the way back; this takes six (a SoftKI-512 step on 1,024 random rows of pol's width, d = 26, spent
    about a fifth of its time in these element-wise passes before)."""

    @staticmethod
    def forward(ctx, X: Tensor, Z: Tensor) -> Tensor:
        D = torch.addmm((X * X).sum(-1, keepdim=True), X, Z.T, alpha=-2.0).add_((Z * Z).sum(-1))
        D.clamp_min_(MIN_SQ_DIST).sqrt_()
        W = torch.softmax(D.neg(), dim=-1)
        ctx.save_for_backward(X, Z, D, W)
        return W

    @staticmethod
    @once_differentiable
    def backward(ctx, dW: Tensor):
        X, Z, D, W = ctx.saved_tensors
        ds = (torch.linalg.vecdot(dW, W).unsqueeze(-1) - dW).mul_(W)  # dD
        ds.div_(D).masked_fill_(D <= 1.0001 * math.sqrt(MIN_SQ_DIST), 0.0)  # 2 ds; none through the clamp
        dX = ds.sum(-1, keepdim=True) * X - ds @ Z if ctx.needs_input_grad[0] else None
        dZ = ds.sum(0).unsqueeze(-1) * Z - transposed_times(ds, X) if ctx.needs_input_grad[1] else None
        return dX, dZ


def softmax_weights(X: Tensor, Z: Tensor) -> Tensor:
    """Softmax interpolation weights ``W[i, j] = exp(-||x_i - z_j||) / sum_k exp(-||x_i - z_k||)`` [n, m].

    Distances come from the Gram expansion (one matmul, no [n, m, d] broadcast, which is huge for large d). The
    squared distance is clamped at 1e-12 before the square root: round-off can make it negative, and sqrt has an
    infinite derivative at 0, which a k-means centre of a singleton cluster (equal to a data point) would hit.
    ``softmax`` subtracts the row maximum, so distances in the thousands do not underflow to 0/0. The backward is
    in closed form (:class:`_SoftmaxWeights`).
    """
    return _SoftmaxWeights.apply(X, Z)


def batch_covariance_solve(W: Tensor, Kzz: Tensor, noise: Tensor, R: Tensor) -> Tensor:
    """``Sigma^{-1} R`` for the batch covariance ``Sigma = W K_zz W^T + beta^2 I`` [B, B] and R [B, k], without
    gradients, in whichever form costs fewer flops.

    With m < B, the m x m form (Woodbury, with ``(beta^2 K_zz^{-1} + G)^{-1} = K_zz (beta^2 I + G K_zz)^{-1}``):

        Sigma^{-1} R = (R - W K_zz x) / beta^2,     (beta^2 I + G K_zz) x = W^T R,     G = W^T W   [m, m],

    about 2 B m^2 + 2 m^3 + 2 m^3 / 3 flops (G, G K_zz, an LU) against the dense form's 2 B m^2 + 2 B^2 m +
    2 B^3 / 3 (Sigma, then its LU): 0.9 against 2.3 GFLOP at m = 512, B = 1,024. K_zz is never factored: ``beta^2 I +
    G K_zz`` has the eigenvalues of ``beta^2 I + K_zz^{1/2} G K_zz^{1/2}``, all at least beta^2, so it is
    non-singular, with no jitter, even where K_zz is singular (k-means centres on duplicated rows, as on
    keggundirected). Its LU is float64 (CORE); G and G K_zz are formed in W's dtype. With m >= B, Sigma is formed and
    solved.
    """
    B, m = W.shape
    noise = noise.to(W.dtype)
    if m >= B:
        Sigma = W @ Kzz @ W.T
        Sigma.diagonal().add_(noise)
        return solve(Sigma, R)
    M = (Kzz @ (W.T @ W)).to(CORE).mT  # (K_zz G)^T = G K_zz, read column-major as LAPACK factors it
    M.diagonal().add_(noise.to(CORE))
    x = solve(M, transposed_times(W, R).to(CORE)).to(W.dtype)
    return (R - W @ (Kzz @ x)) / noise


def hutchinson_pseudo_log_likelihood(W: Tensor, Kzz: Tensor, noise: Tensor, y: Tensor, probes: Tensor) -> Tensor:
    """The Hutchinson pseudo-log-likelihood of Maddox et al. (2022), sign-corrected (erratum 1), for
    ``Sigma = W K_zz W^T + beta^2 I``:

        log p~ = 1/2 b_0^T Sigma b_0 - 1/(2L) sum_j b_j^T Sigma a_j,    Sigma [b_0, b_1..b_L] = [y, a_1..a_L],

    with the solves detached. Its gradient is unbiased for that of ``log N(y | 0, Sigma)`` when
    ``E[a a^T] = I``:  ``1/2 (Sigma^{-1} y)^T dSigma (Sigma^{-1} y) - 1/2 tr(Sigma^{-1} dSigma)``. Its value is
    not the log-likelihood: use it only for gradients.

    The differentiated quadratic forms go through the factors, ``b^T Sigma a = (W^T b)^T K_zz (W^T a) +
    beta^2 b^T a``, so the backward pass costs O(B m L + m^2 L) instead of the O(B^2 m) of differentiating a dense
    Sigma; the detached solve is :func:`batch_covariance_solve`.

    Args:
        W: [B, m] interpolation weights, differentiable.
        Kzz: [m, m] inducing covariance, differentiable.
        noise: beta^2, a scalar tensor.
        y: [B] targets.
        probes: [B, L] probe vectors with ``E[a a^T] = I`` (standard normal; NOT unit-norm, erratum 2).
    """
    L = probes.shape[1]
    noise = noise.to(W.dtype)
    with torch.no_grad():
        # detached: letting gradients flow through Sigma^{-1} flips the sign of the gradient
        solves = batch_covariance_solve(W, Kzz, noise, torch.cat([y.unsqueeze(-1), probes], dim=1))  # [B, L + 1]
    # column 0 pairs b_0 with b_0, column j pairs b_j with a_j
    partners = torch.cat([solves[:, :1], probes], dim=1)  # [B, L + 1]
    projected = transposed_times(W, torch.cat([solves, partners], dim=1))  # one pass over W for both: [m, 2 (L + 1)]
    forms = (projected[:, : L + 1] * (Kzz @ projected[:, L + 1:])).sum(0) + noise * (solves * partners).sum(0)
    return 0.5 * forms[0] - forms[1:].sum() / (2 * L)


@register("softki")
class SoftKI(FeatureSpaceGP):
    """Soft kernel interpolation: ``k~(x, x') = w(x)^T K_zz w(x')`` with softmax weights over m learned points.

    Use it for large n with moderate to high d (d >~ 10), where SKI's grids are impossible and SGPR/SVGP
    underfit; at d <~ 8 SGPR or SVGP are usually more accurate.

    Args:
        n_inducing: number of interpolation points m (k-means initialised, always learned).
        n_probes: Hutchinson probe vectors L per training step (fresh standard-normal draws).
        learn_temperature: learn a per-dimension temperature T >= 5e-5 (initialised at 1) and use
            ``w(x) = softmax(-||x / T - z||)``: it divides only x, as in the official code's ``use_T``. Off in
            every paper run (the paper's weights have no temperature).
        solver: posterior fit and :meth:`log_marginal_likelihood` by ``'qr'`` (streamed TSQR, the paper's stable
            solve, the default), ``'cholesky'`` (Cholesky of the whitened normal matrix I + Phi^T Phi / beta^2:
            fewer flops; whitening by L_zz keeps K_zz's conditioning out of it, but its condition number still
            grows like n / beta^2, which QR takes only the square root of) or ``'auto'`` (QR for the posterior).
        calibrate_noise: after training, re-estimate beta^2 in :meth:`fit_posterior`, Z and the kernel fixed:
            the beta^2 that maximises the predictive density of the rows training held out (``val_fraction``, by
            default 0.1 when training to convergence on 500 to 100,000 rows with calibrate_noise set; None holds
            none out), else the exact evidence ``log N(y | 0, Q~ + beta^2 I)`` of the rows it fits. The paper's
            fixed 1e-3 is overconfident on held-out data; both modes fix the calibration of the variance:

            - ``None``: no calibration, the paper's protocol (its intervals are far too narrow: on Friedman #1,
              95% intervals held 23% of the test points).
            - ``'variance'`` (default): keep the posterior mean fitted with the training noise (the paper's
              accuracy) and take the predictive variance, ``var f + beta^2``, from the posterior under the
              calibrated noise.
            - ``'posterior'``: fit the whole posterior, mean included, with the calibrated noise (a single
              coherent GP posterior; its mean is smoother, which can cost accuracy).

            :meth:`clear_cache` restores the training noise, so validation during training does not leak the
            calibrated value into the training objective.
        kernel: the kernel of K_zz: a name or any :class:`~gpscale.kernels.Kernel` (``GPyTorchKernel`` for
            GPyTorch kernels). Default RBF with one shared lengthscale and an outputscale (``ard=False``), both
            initialised at ln 2, as the paper's ``ScaleKernel(RBFKernel())``.
        noise, learn_noise: beta^2, fixed at 1e-3 by default as in the paper (the paper: learning it worsened
            RMSE on most UCI sets).
        **kwargs: other kernel, likelihood and chunking options of :class:`GPModel`.
    """

    posterior_options = ("calibrate_noise",)
    full_batch = False
    batch_coupled = True  # each batch's own marginal likelihood couples its rows
    # a tenth of the rows held out for calibrate_noise's estimate of beta^2, training converging on the rest
    default_training = replace(MINIBATCH_TRAINING, val_fraction=0.1)
    default_convergence = replace(CONVERGENCE, watch_validation=False)
    auto_dtype = "float32"  # faster than float64 at the same accuracy
    floor_sizes = {"small": BenchSize(2000, 8, {"n_inducing": 128}, 256),
                   "paper": BenchSize(13500, 26, {"n_inducing": 512}, 1024)}

    def __init__(self, n_features: int, n_inducing: int = 512, n_probes: int = 10, learn_temperature: bool = False,
                 solver: str = "qr", calibrate_noise: str | None = "variance", *, ard: bool = False,
                 noise: float = 1e-3, learn_noise: bool = False, **kwargs):
        super().__init__(n_features, ard=ard, noise=noise, learn_noise=learn_noise, **kwargs)
        self.set_engine_options(solver=solver, calibrate_noise=calibrate_noise)
        check_options({"n_inducing": n_inducing, "n_probes": n_probes})
        self.n_inducing = int(n_inducing)
        self.n_probes = int(n_probes)
        self.Z = nn.Parameter(torch.zeros(self.n_inducing, self.n_features))
        if learn_temperature:
            self.raw_temperature = nn.Parameter(
                inverse_softplus(torch.full((self.n_features,), 1.0 - MIN_TEMPERATURE)))
        else:
            self.register_parameter("raw_temperature", None)

    # --- the model ------------------------------------------------------------------------------------------
    def initialise_from_data(self, X: Tensor, y: Tensor, seed: int = 0) -> None:
        with torch.no_grad():
            # with a temperature, Z lives in the space of x / T; T starts at 1, where that space is the input's
            self.Z.copy_(kmeans_centers(X, self.n_inducing, seed))

    @property
    def temperature(self) -> Tensor | None:
        """Per-dimension temperature T [d], or None when not learned."""
        if self.raw_temperature is None:
            return None
        return MIN_TEMPERATURE + nn.functional.softplus(self.raw_temperature)

    def weights(self, X: Tensor) -> Tensor:
        """Interpolation weights W_xz [c, m] of the rows of X [c, d]; rows are non-negative and sum to 1."""
        T = self.temperature
        return softmax_weights(X if T is None else X / T.to(X.dtype), self.Z)

    def Kzz(self) -> Tensor:
        """K_zz = k(Z, Z) [m, m], in the model dtype, without jitter (jitter only on a failed Cholesky)."""
        return self.kernel(self.Z, self.Z)

    def feature_state(self) -> dict[str, Tensor]:
        """``{"Lzz": L_zz}``, the lower Cholesky factor of K_zz (float64; jittered only if the factorisation
        fails)."""
        return {"Lzz": cholesky(self.Kzz().to(CORE), what="interpolation-point covariance K_zz")}

    def feature_map(self, state: dict[str, Tensor]) -> Features:
        """``x -> phi(x) = L_zz^T w(x)``: X [c, d] -> Phi = W_xz L_zz [c, m] (float64), so Phi Phi^T = Q~_xx."""
        return Features(lambda X: self.weights(X).to(CORE) @ state["Lzz"])

    # --- training -------------------------------------------------------------------------------------------
    def loss(self, X: Tensor, y: Tensor, num_data: int, comm: Comm = LOCAL, share: float = 1.0) -> Tensor:
        """``-log p~(y_b) / B`` on a minibatch X [B, d], y [B] (Algorithm 1, line 7).

        Plain SGD on each batch's own marginal likelihood: no n/B rescaling, so ``num_data`` is not used; the
        division by B makes it a per-point objective.
        """
        self.check_batch_fits((X.shape[0], self.n_inducing), X.dtype, copies=4,
                              what=f"SoftKI's interpolation weights of a batch of {X.shape[0]:,} rows (the weights, "
                                   "their distances and the gradients of both)",
                              advice="Use a smaller batch_size= or fewer interpolation points (n_inducing=...).")
        probes = torch.randn(X.shape[0], self.n_probes, dtype=X.dtype, device=X.device)
        return -hutchinson_pseudo_log_likelihood(self.weights(X), self.Kzz(), self.noise, y, probes) / X.shape[0]

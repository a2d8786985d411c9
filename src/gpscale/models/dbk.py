"""Deep Basis Kernel GPs (Zhu, Yuchi & Xie 2025, arXiv 2505.18526 v1; spec: shared/specs/lrdkd.md).

A network phi: R^d -> R^r outputs r basis functions, and the kernel is their inner product (eq. 4):

    k(x, x') = phi(x)^T phi(x'),     K_XX = Phi Phi^T  [n, n], rank <= r,

a truncated Mercer expansion with the eigenvalues absorbed into the bases: no output scale, no orthogonality and no
normalisation, so the prior variance k(x, x) = ||phi(x)||^2 depends on x. In weight space f(x) = phi(x)^T w with
w ~ N(0, I_r) (eq. 7): a Bayesian linear model, so exact inference is the linear engine's (``_linear.py``) with
``Lambda = Phi^T Phi + sigma^2 I = sigma^2 B``, in O(n r^2) time and O(n r) memory, never n x n:

    log p(y)  = -n/2 log 2 pi - (n - r)/2 log sigma^2 - 1/2 log|Lambda| - 1/2 y^T Sigma^{-1} y        (eq. 5)
    y^T Sigma^{-1} y = (||y - Phi alpha||^2 + sigma^2 ||alpha||^2) / sigma^2,   alpha = Lambda^{-1} Phi^T y
    E[f* | y] = phi*^T alpha,   Var[f* | y] = sigma^2 phi*^T Lambda^{-1} phi*                         (eq. 6)

(the engine's ``-n/2 log sigma^2 - 1/2 log|B|`` is eq. 5's ``-(n - r)/2 log sigma^2 - 1/2 log|Lambda|``).

Two registered methods, the paper's two rows of every table:

- ``dbk``: exact inference, trained full batch on eq. 5 (Algorithm 9.1).
- ``svdbk``: stochastic variational inference on w, ``q(w) = N(m, L L^T)`` with L lower triangular, trained on
  minibatches with the ELBO of eq. 9 (n/b scaling) and predicting with eq. 10 (``Var f* = ||L^T phi*||^2``).

They are two keys rather than an ``inference=`` option of one, because they differ in what the rest of gpscale
reads from the class: the trainer minibatches unless ``full_batch`` (a property of the objective), and SVDBK has
variational parameters (m, L) that exact DBK has not, so each key's options and saved state are exactly its own.
This is the same split as ``sgpr`` / ``svgp``, and the benchmark protocols can name the paper's rows by key.

**Variance correction**, on by default; ``correction=False`` gives the paper's "-c" ablations. Marginal
likelihood training drifts toward the rank-1 kernel y y^T with sigma^2 -> 0 (Theorem 1), and then every interval
vanishes, because the posterior variance is proportional to sigma^2. The correction pads the prior variance to a
uniform k_max = max_i k(x_i, x_i) over the training set with the diagonal kernel ``c(x, x) = max(k_max, k(x, x))
- k(x, x)``:

- training maximises the Titsias-style bound ``log p(y) - tr(C_XX) / (2 sigma^2)`` on the corrected evidence
  (eq. 11); on a minibatch the trace is scaled by n/b and uses the batch max (biased low, as the paper specifies);
- prediction uses the corrected kernel, i.e. heteroscedastic noise ``sigma^2 + c(x)`` (eq. 12): exact DBK
  refits the posterior on rows scaled by ``D^{-1/2}``, ``D = 1 + c / sigma^2`` (the paper's "Phi^ = D^{-1/2} Phi",
  misprinted there as D^{-1/2} Phi^T), and every method adds c(x*) to the latent variance. The training maximum is
  the one used for test points, never a test chunk's.

**Optimisation recipe**: sigma^2 starts at 1e-2 with floor 1e-6; weight decay 1e-4 (coupled, as
``torch.optim.Adam``'s ``weight_decay``) on the network's parameters only, through :meth:`parameter_groups`, never
on sigma^2, m or L. The loss is divided by n, as every gpscale loss (and GPyTorch's ``ExactMarginalLogLikelihood``),
so the decay acts against the per-point objective.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import replace

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..distributed import LOCAL, Comm
from ..kernels import Kernel, inverse_softplus
from . import _linear
from ._linear import CORE
from ._variational import gauss_kl_whitened
from .._stack import user_stacklevel
from .base import GPModel, PredictiveFactors, register

__all__ = ["DeepBasisKernel", "DBK", "SVDBK", "ExtrapolationWarning", "mlp", "residual_mlp", "prior_variance",
           "variance_correction", "trace_penalty"]

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "silu": nn.SiLU, "gelu": nn.GELU}
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


# --- the kernel and its correction --------------------------------------------------------------
def prior_variance(Phi: Tensor) -> Tensor:
    """``k(x_i, x_i) = ||phi(x_i)||^2`` [n] for basis rows Phi [n, r]: the DBK prior variance, which varies with x."""
    return (Phi * Phi).sum(-1)


def variance_correction(k: Tensor, k_max: Tensor) -> Tensor:
    """``c(x, x) = max(k_max, k(x, x)) - k(x, x) >= 0`` [n] for prior variances k [n].

    It pads every prior variance up to the training maximum k_max, so ``k + c`` is uniform on the training set; it
    is 0 at the argmax, and at a test point whose prior variance exceeds k_max.
    """
    return (k_max - k).clamp_min(0.0)


def trace_penalty(k: Tensor, k_max: Tensor, noise: Tensor, num_data: int) -> Tensor:
    """``tr(C_XX) / (2 sigma^2)`` estimated from b rows with prior variances k [b] (eq. 11):

        (num_data / b) sum_i (k_max - k_i) / (2 sigma^2).

    With every row and k_max = max_i k_i it is exact, ``(n k_max - sum_i k_i) / (2 sigma^2)``; on a minibatch it is
    unbiased for a given k_max. It is divided by sigma^2: this is what makes sigma^2 -> 0 costly (pitfall 7).
    """
    return (num_data / k.shape[0]) * (k_max - k).sum() / (2 * noise)


class DeepBasisKernel(Kernel):
    """``k(x, x') = phi(x)^T phi(x')`` for a network ``phi`` mapping X [c, d] to Phi [c, r].

    Args:
        network: any ``torch.nn.Module`` that acts on each row separately (no batch norm in training mode): the
            model chunks its inputs.
        n_basis: r, the network's output width.
        scale_basis: use ``phi = network(x) / sqrt(r)``, which keeps ||phi||^2 = O(1) at initialisation whatever r.
            Not in the paper (a third-party reimplementation's trick); off by default.
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


class ExtrapolationWarning(UserWarning):
    """Rows asked for at prediction lie outside the box of the training inputs, where a deep basis kernel's network
    is unconstrained by data."""


# --- what dbk and svdbk share -------------------------------------------------------------------------------------
class DeepBasisModel(GPModel):
    """A GP with a deep basis kernel, the variance correction and weight decay on the network.

    Args:
        n_basis: r, the number of basis functions (the paper's default 128; 1 for its "-r" ablations).
        network: ``'resnet'`` (default: the paper's backbone on real data), ``'mlp'`` (its backbone on synthetic
            data), or any ``torch.nn.Module`` mapping [c, d] to [c, n_basis], used as given (never re-initialised).
        depth, width, activation: hidden layers, units per layer and ``'tanh'``/``'relu'``/``'silu'``/``'gelu'`` of
            the built-in networks (default: the paper's 128 and tanh, with depth 2 for ``'mlp'`` and 3 for
            ``'resnet'``, its "2-layer ResNet" read as two residual layers after the input layer). Built-in networks
            get PyTorch's default initialisation in :meth:`init`, from the seed of :func:`gpscale.train.fit`.
        scale_basis: divide the network output by sqrt(r) (not in the paper; see :class:`DeepBasisKernel`).
        correction: the variance correction in training and prediction (default True); False is the "-c" ablation.
        calibrate_noise: after training, re-estimate sigma^2 with the network fixed (default False, the paper's
            protocol). The trace penalty's 1/sigma^2 holds the trained sigma^2 above the residual noise, and the
            corrected predictive adds c(x*) on top of it, so the corrected model's intervals come out wide
            (svdbk's 95% coverage: 0.97-0.99 on pol, bike and kin40k in dbk-table1; docs/dbk.md measures what
            the option does to coverage and NLPD). ``dbk`` maximises the corrected model's
            exact evidence ``log N(y | 0, Phi Phi^T + C_XX + sigma^2 I)`` over sigma^2 and refits its posterior;
            ``svdbk`` keeps q(w) and maximises its expected log-likelihood
            ``sum_i E_q log N(y_i | phi_i^T w, sigma^2 + c_i)``. Both act in :meth:`fit_posterior` only and
            :meth:`clear_cache` restores the training sigma^2, so the training loss never sees the calibrated
            value; validation passes (early stopping) score the calibrated model.
        weight_decay: Adam's coupled L2 weight decay on the network's parameters only (default 1e-4, the paper's).
        noise: initial sigma^2 (default 1e-2, the paper's); ``noise_floor`` (default 1e-6) bounds it below.
        kernel: accepted only as None or ``'rbf'`` (the value :class:`~gpscale.GPRegressor` passes every method);
            the deep basis kernel has no base kernel, so anything else is an error.
        **kwargs: ``learn_noise``, ``noise_floor`` and ``chunk_size`` of :class:`GPModel`.
    """

    posterior_options = ("calibrate_noise",)

    def __init__(self, n_features: int, n_basis: int = 128, network: str | nn.Module = "resnet",
                 depth: int | None = None, width: int = 128, activation: str = "tanh", scale_basis: bool = False,
                 correction: bool = True, weight_decay: float = 1e-4, calibrate_noise: bool = False, *,
                 kernel: str | None = None, noise: float = 1e-2, **kwargs):
        _check_options(n_basis=n_basis, network=network, depth=depth, width=width, activation=activation,
                       weight_decay=weight_decay, kernel=kernel, kwargs=kwargs)
        builtin = not isinstance(network, nn.Module)
        if builtin:
            build = mlp if network == "mlp" else residual_mlp
            depth = DEFAULT_DEPTH[network] if depth is None else int(depth)
            network = build(int(n_features), int(n_basis), depth, int(width), activation)
        super().__init__(n_features, kernel=DeepBasisKernel(network, n_basis, scale_basis), noise=noise, **kwargs)
        self.n_basis = int(n_basis)
        self.builtin_network = builtin
        self.correction = bool(correction)
        self.weight_decay = float(weight_decay)
        self.calibrate_noise = bool(calibrate_noise)

    def init(self, X: Tensor, y: Tensor, seed: int = 0) -> None:
        # fit() has just seeded torch's generator: a built-in network drawn now makes training reproducible
        if self.builtin_network:
            for layer in self.kernel.network.modules():
                if isinstance(layer, nn.Linear):
                    layer.reset_parameters()

    def parameter_groups(self) -> list[dict]:
        """Weight decay on the network's parameters only (pitfall 9), none on sigma^2 or q(w)."""
        network = [p for p in self.kernel.network.parameters() if p.requires_grad]
        in_network = {id(p) for p in network}
        others = [p for p in self.parameters() if p.requires_grad and id(p) not in in_network]
        groups = [{"params": network, "weight_decay": self.weight_decay}, {"params": others, "weight_decay": 0.0}]
        return [group for group in groups if group["params"]]

    def penalty(self, Phi: Tensor, num_data: int, comm: Comm = LOCAL) -> Tensor:
        """The trace penalty (float64 scalar) from the basis rows Phi [b, r] of a set of ``num_data`` points, with
        k_max the max over these rows: all of them in exact training, the batch in SVI. With ``comm``, k_max is the
        max over every process's rows, and this process's term is returned.

        The gradient goes through the max (to the argmax row, as ``torch.max`` routes it), as in the paper. That
        gradient is what holds the largest prior variance down: with k_max detached (a variant) the
        penalty pushes every ||phi_i||^2 up, the largest included, and on the toy problem of test_dbk's regressor
        test the test RMSE went from 0.10 to 1.09 (dbk) and from 0.14 to 4.9 (svdbk). So it is not an option.
        """
        k = prior_variance(Phi).to(CORE)
        return trace_penalty(k, comm.all_reduce_max(k.max()), self.noise.to(CORE), num_data)

    @torch.no_grad()
    def max_prior_variance(self, X: Tensor) -> Tensor:
        """k_max = max_i ||phi(x_i)||^2 over the rows of X [n, d], one chunk at a time (float64 scalar)."""
        maxima = [prior_variance(self.kernel.basis(Xc)).max() for Xc in X.split(self.chunk_size)]
        return torch.stack(maxima).max().to(CORE)

    @torch.no_grad()
    def record_training_box(self, X: Tensor, comm: Comm = LOCAL) -> None:
        """Keep the per-feature minimum and maximum [d] of the training inputs X [n, d] (every process's rows) in
        the posterior cache, so that :meth:`check_inputs` can say when a prediction extrapolates."""
        self.cache["x_lower"] = comm.all_gather(X.amin(0, keepdim=True)).amin(0)
        self.cache["x_upper"] = comm.all_gather(X.amax(0, keepdim=True)).amax(0)

    def check_inputs(self, X: Tensor) -> None:
        """An :class:`ExtrapolationWarning` when rows of X [n*, d] leave the box of the training inputs. Outside the
        data a stationary GP falls back to its prior, but nothing ties phi(x) there to anything: the mean
        phi(x)^T alpha can be far off while its variance stays small. Uncorrected exact DBK on protein predicted 33
        (targets in [-2.4, 1.6]) at one of 3 test rows at most 1% of the range outside the box (docs/dbk.md)."""
        if "x_lower" in self.cache:  # model files written before the box was recorded have none
            warn_outside_box(X, self.cache["x_lower"], self.cache["x_upper"])

    def predictive_correction(self, Phi: Tensor) -> Tensor:
        """c(x*) [c] for test rows Phi [c, r] (float64) against the training k_max; zero without the correction."""
        if not self.correction:
            return torch.zeros(Phi.shape[0], dtype=CORE, device=Phi.device)
        return variance_correction(prior_variance(Phi), self.cache["k_max"])


def warn_outside_box(X: Tensor, lower: Tensor, upper: Tensor) -> None:
    """Warn (:class:`ExtrapolationWarning`) when rows of X [n*, d] leave the box [lower, upper] (each [d]): how
    many, and the largest excursion, in units of that feature's training range (a feature that was constant in
    training has none: leaving its value counts as the largest excursion, reported as a distance)."""
    excess = torch.maximum(lower - X, X - upper).clamp_min(0)  # [n*, d]
    outside = (excess > 0).any(-1)
    if not bool(outside.any()):
        return
    span = upper - lower
    relative = (excess / span).nan_to_num(nan=0.0, posinf=math.inf)  # 0 / 0 inside a constant feature's value
    worst = int(relative.amax(0).argmax())
    if span[worst] > 0:
        how_far = f"at most {float(relative[:, worst].max()):.3g} times feature {worst}'s training range beyond it"
    else:
        how_far = (f"feature {worst} took one value in training, and these rows lie up to "
                   f"{float(excess[:, worst].max()):.3g} away from it")
    warnings.warn(
        f"{int(outside.sum())} of {X.shape[0]} rows lie outside the range of the training inputs ({how_far}). A "
        "deep basis kernel is unconstrained by data there: the predicted mean can be far off while its variance "
        "stays small. Check those predictions, or train on data that covers them.", ExtrapolationWarning,
        stacklevel=user_stacklevel())


def _check_options(*, n_basis, network, depth, width, activation, weight_decay, kernel, kwargs) -> None:
    if not isinstance(network, nn.Module) and network not in NETWORKS:
        raise ValueError(f"network must be 'mlp', 'resnet' or a torch.nn.Module, got {network!r}.")
    sizes = [("n_basis", n_basis), ("width", width)] + ([] if depth is None else [("depth", depth)])
    for name, value in sizes:
        if int(value) != value or value < 1:
            raise ValueError(f"Expected {name} to be a positive integer. Got {value!r}.")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}.")
    if not weight_decay >= 0:
        raise ValueError(f"Expected weight_decay >= 0. Got {weight_decay!r}.")
    if kernel not in (None, "rbf"):
        raise ValueError(f"A deep basis kernel is phi(x)^T phi(x'), set by the network option; it takes no "
                         f"kernel, got kernel={kernel!r}.")
    stationary = sorted({"ard", "lengthscale", "outputscale"} & kwargs.keys())
    if stationary:
        raise ValueError(f"{', '.join(stationary)} belong to stationary kernels; a deep basis kernel has none.")


# --- exact inference ----------------------------------------------------------------------------------------------
@register("dbk")
class DBK(DeepBasisModel):
    """Deep basis kernel GP with exact inference, trained full batch (Algorithm 9.1).

    Each step computes Phi [n, r] for all n rows, because the trace penalty's max couples them; the network runs
    in chunks of ``chunk_size`` rows, each checkpointed when there are several, so its activations are held for
    one chunk at a time. ``Phi^T Phi`` and its Cholesky are float64 whatever the model dtype (pitfall 2).
    For n beyond a few 10^5, use ``svdbk``.

    Args: those of :class:`DeepBasisModel`.
    """

    full_batch = True
    data_parallel = "statistics"

    def features(self, X: Tensor) -> Tensor:
        """Phi = phi(X) [n, r], computed ``chunk_size`` rows at a time."""
        chunks = X.split(self.chunk_size)
        if torch.is_grad_enabled() and len(chunks) > 1:
            return torch.cat([checkpoint(self.kernel.basis, Xc, use_reentrant=False) for Xc in chunks])
        return torch.cat([self.kernel.basis(Xc) for Xc in chunks])

    def posterior(self, Phi: Tensor, y: Tensor, comm: Comm = LOCAL) -> _linear.Collapsed:
        """The engine's posterior of w from basis rows Phi [n, r] and targets y [n] (every process's rows)."""
        stats = _linear.accumulate(_linear.in_memory, Phi, y.to(CORE), chunk_size=self.chunk_size,
                                     recompute=False, comm=comm)
        return _linear.collapse_cholesky(stats, self.noise)

    def evidence(self, Phi: Tensor, y: Tensor, comm: Comm = LOCAL) -> Tensor:
        """``log N(y | 0, Phi Phi^T + sigma^2 I)`` (eq. 5) with the cancellation-free data fit (float64 scalar)."""
        post = self.posterior(Phi, y, comm)
        quad = _linear.residual_quad(Phi, y, post.weight_mean, self.noise, chunk_size=self.chunk_size, comm=comm)
        return _linear.log_evidence(replace(post, quad=quad), self.noise)

    def heteroscedastic_rows(self, Phi: Tensor, y: Tensor, k_max: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Rows scaled for the corrected model: ``Phi^ = D^{-1/2} Phi`` [n, r], ``y^ = D^{-1/2} y``
        [n] and D [n], with ``D_i = (sigma^2 + c_i) / sigma^2``: ``Phi Phi^T + C + sigma^2 I = D^{1/2} (Phi^ Phi^^T
        + sigma^2 I) D^{1/2}``, so the corrected GP is the plain one on scaled rows."""
        D = 1 + variance_correction(prior_variance(Phi), k_max) / self.noise.to(Phi.dtype)
        scale = D.rsqrt()
        return Phi * scale.unsqueeze(-1), y * scale, D

    def log_marginal_likelihood(self, X: Tensor, y: Tensor) -> Tensor:
        """log p(y) of eq. 5 in O(n r^2) (float64 scalar, differentiable)."""
        return self.evidence(self.features(X), y)

    def corrected_log_marginal_likelihood(self, X: Tensor, y: Tensor) -> Tensor:
        """``log N(y | 0, Phi Phi^T + C_XX + sigma^2 I)``, the evidence of the corrected model that the training
        objective bounds (for diagnostics): ``log N(y^ | 0, Phi^ Phi^^T + sigma^2 I) - 1/2 sum log D``."""
        Phi = self.features(X)
        Phi_hat, y_hat, D = self.heteroscedastic_rows(Phi, y, prior_variance(Phi).max())
        return self.evidence(Phi_hat, y_hat) - 0.5 * D.to(CORE).log().sum()

    def objective(self, X: Tensor, y: Tensor, comm: Comm = LOCAL) -> Tensor:
        """``J = log p(y) - tr(C_XX) / (2 sigma^2)`` (eq. 5 minus the penalty of eq. 11), or log p(y) without the
        correction (float64 scalar), over every process's rows."""
        Phi = self.features(X)
        lml = self.evidence(Phi, y, comm)
        return lml - comm.all_reduce_sum(self.penalty(Phi, X.shape[0], comm)) if self.correction else lml

    def loss(self, X: Tensor, y: Tensor, num_data: int, comm: Comm = LOCAL) -> Tensor:
        return -self.objective(X, y, comm) / num_data

    @torch.no_grad()
    def fit_posterior(self, X: Tensor, y: Tensor, comm: Comm = LOCAL) -> None:
        self.clear_cache()  # a previous calibration must not be the starting point of this one
        self.record_training_box(X, comm)
        Phi = self.features(X)
        if self.correction:
            self.cache["k_max"] = comm.all_reduce_max(prior_variance(Phi).max().to(CORE))
        if self.calibrate_noise:
            self.set_calibrated_noise(self.evidence_optimal_noise(Phi, y, comm))
        if self.correction:  # the corrected GP is the plain one on rows scaled by D^{-1/2}
            Phi, y, _ = self.heteroscedastic_rows(Phi, y, self.cache["k_max"])
        post = self.posterior(Phi, y, comm)
        self.cache.update(L_B=post.L_B, w_mean=post.weight_mean)

    def evidence_optimal_noise(self, Phi: Tensor, y: Tensor, comm: Comm = LOCAL) -> float:
        """``argmax_{sigma^2} log N(y | 0, Phi Phi^T + C_XX + sigma^2 I)`` for the basis rows Phi [n, r] fixed
        (C_XX = 0 without the correction). Without it, O(r) per evaluation from Phi^T Phi's eigenvalues
        (:func:`_linear.evidence_maximising_noise`); with it, O(n r^2) on rows scaled by ``(sigma^2 + c_i)^{-1/2}``:
        the evidence is ``log N(y^ | 0, Phi^ Phi^^T + I) - 1/2 sum_i log(sigma^2 + c_i)``."""
        Phi, y = Phi.to(CORE), y.to(CORE)
        stats = _linear.accumulate(_linear.in_memory, Phi, y, chunk_size=self.chunk_size, recompute=False, comm=comm)
        bounds = self.noise_search_bounds(float(stats.yy) / stats.n)
        if not self.correction:
            return _linear.evidence_maximising_noise(stats, *bounds)
        c = self.predictive_correction(Phi)
        one = torch.ones((), dtype=CORE, device=Phi.device)

        def log_evidence_at(s2: float) -> float:
            scale = (s2 + c).rsqrt()
            stats = _linear.accumulate(_linear.in_memory, Phi * scale.unsqueeze(-1), y * scale,
                                       chunk_size=self.chunk_size, recompute=False, comm=comm)
            post = _linear.collapse_cholesky(stats, one)
            return float(_linear.log_evidence(post, one) + comm.all_reduce_sum(scale.log().sum()))

        return _linear.maximise_over_noise(log_evidence_at, *bounds, grid_points=60)

    def predictive_factors(self, X: Tensor) -> PredictiveFactors:
        """Mean ``phi*^T alpha`` and variance ``sigma^2 ||L_Lambda^-1 phi*||^2 + c(x*)`` (eqs. 6 and 12; alpha
        and Lambda of the scaled rows with the correction); the correction c(x*) is independent between rows."""
        Phi = self.kernel.basis(X).to(CORE)  # [c, r]
        mean, _, U, _ = _linear.weight_space_factors(self.cache["L_B"], self.cache["w_mean"], Phi)
        return PredictiveFactors(mean, None, U, self.predictive_correction(Phi))


# --- stochastic variational inference -----------------------------------------------------------------------------
@register("svdbk")
class SVDBK(DeepBasisModel):
    """Deep basis kernel GP with stochastic variational inference on w (SVDBK), trained on minibatches.

    ``q(w) = N(m, L L^T)`` with ``L = tril(raw, -1) + diag(softplus(raw_diag))``, so diag(L) > 0 and log|L L^T| is
    finite; it starts at the prior (m = 0, L = I). Each step costs O(b r^2). Prediction needs k_max over the whole
    training set, which :meth:`fit_posterior` computes in one pass.

    Args: those of :class:`DeepBasisModel`.
    """

    def __init__(self, n_features: int, **kwargs):
        super().__init__(n_features, **kwargs)
        r = self.n_basis
        # the correction's k_max is the maximum over the whole batch, which every part of it needs
        self.data_parallel = "batch" if self.correction else "rows"
        self.q_mu = nn.Parameter(torch.zeros(r))
        self.q_sqrt_tril = nn.Parameter(torch.zeros(r, r))  # only the strict lower triangle is used
        self.q_sqrt_diag = nn.Parameter(inverse_softplus(torch.ones(r)))

    def init(self, X: Tensor, y: Tensor, seed: int = 0) -> None:
        super().init(X, y, seed)
        with torch.no_grad():  # q(w) = p(w), whatever an earlier fit left
            self.q_mu.zero_()
            self.q_sqrt_tril.zero_()
            self.q_sqrt_diag.copy_(inverse_softplus(torch.ones_like(self.q_sqrt_diag)))

    @property
    def q_sqrt(self) -> Tensor:
        """L [r, r], lower triangular with a positive diagonal."""
        return torch.tril(self.q_sqrt_tril, -1) + torch.diag(nn.functional.softplus(self.q_sqrt_diag))

    def elbo_from_basis(self, Phi: Tensor, y: Tensor, num_data: int) -> Tensor:
        """Eq. 9 from basis rows Phi [b, r] and targets y [b] (float64 scalar):

            (n / b) sum_i [log N(y_i | m^T phi_i, sigma^2) - ||L^T phi_i||^2 / (2 sigma^2)] - KL(q(w) || N(0, I)).
        """
        L = self.q_sqrt.to(Phi.dtype)
        mean = Phi @ self.q_mu.to(Phi.dtype)  # [b]
        var = ((Phi @ L) ** 2).sum(-1)  # ||L^T phi_i||^2: rows phi_i^T L (pitfall 8)
        expected = self.likelihood.expected_log_prob(y, mean, var).sum()
        return (num_data / Phi.shape[0]) * expected.to(CORE) - gauss_kl_whitened(self.q_mu.to(CORE), L.to(CORE))

    def elbo(self, X: Tensor, y: Tensor, num_data: int) -> Tensor:
        """Unbiased minibatch estimate of the ELBO (eq. 8) of a set of ``num_data`` points; tight at q = p(w | y)."""
        return self.elbo_from_basis(self.kernel.basis(X), y, num_data)

    def objective(self, X: Tensor, y: Tensor, num_data: int) -> Tensor:
        """The ELBO minus the batch trace penalty, or the ELBO without the correction."""
        Phi = self.kernel.basis(X)
        elbo = self.elbo_from_basis(Phi, y, num_data)
        return elbo - self.penalty(Phi, num_data) if self.correction else elbo

    def loss(self, X: Tensor, y: Tensor, num_data: int, comm: Comm = LOCAL, share: float = 1.0) -> Tensor:
        if comm.world_size == 1:
            return -self.objective(X, y, num_data) / num_data
        return -self.objective_part(X, y, num_data, comm, share) / num_data

    def objective_part(self, X: Tensor, y: Tensor, num_data: int, comm: Comm, share: float) -> Tensor:
        """This process's part of :meth:`objective` for a batch split over processes, X [b_r, d] holding a
        ``share`` b_r / B of its rows (possibly none): the parts, weighted by their shares, sum to the objective.

        k_max, the batch's maximum prior variance, comes from a forward all-gather. Its gradient is not
        differentiated through a collective, whose backward pass ranks with different graphs would interleave
        differently with DistributedDataParallel's reductions. The objective's derivative with respect to k_max is
        N / (2 sigma^2) whatever the split, so the rank holding the maximum adds a zero-valued term with exactly
        that gradient through its own maximum."""
        Phi = self.kernel.basis(X)
        k = prior_variance(Phi).to(CORE)
        local_max = k.max() if k.numel() else torch.tensor(-math.inf, dtype=CORE, device=k.device)
        maxima = comm.all_gather(local_max.detach().reshape(1))
        if not X.shape[0]:
            return torch.zeros((), dtype=CORE, device=k.device)
        k_max, noise = maxima.max(), self.noise.to(CORE)
        objective = self.elbo_from_basis(Phi, y, num_data) - trace_penalty(k, k_max, noise, num_data)
        if comm.rank == int(maxima.argmax()):
            objective = objective - num_data / (2 * noise.detach()) * (local_max - local_max.detach()) / share
        return objective

    @torch.no_grad()
    def fit_posterior(self, X: Tensor, y: Tensor, comm: Comm = LOCAL) -> None:
        # q(w) is the posterior; the correction also needs the training k_max
        self.clear_cache()  # a previous calibration must not be the starting point of this one
        self.record_training_box(X, comm)
        self.cache.update(q_mu=self.q_mu.detach().to(CORE), q_sqrt=self.q_sqrt.detach().to(CORE))
        if not self.calibrate_noise:
            if self.correction:
                self.cache["k_max"] = comm.all_reduce_max(self.max_prior_variance(X))
            return
        e, k = self.expected_squared_errors(X, y)  # one pass serves k_max and the noise search
        c = torch.zeros_like(k)
        if self.correction:
            self.cache["k_max"] = comm.all_reduce_max(k.max())
            c = variance_correction(k, self.cache["k_max"])
        self.set_calibrated_noise(self.expected_log_likelihood_optimal_noise(e, c, y, comm))

    @torch.no_grad()
    def expected_squared_errors(self, X: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """``e_i = E_q (y_i - phi_i^T w)^2 = (y_i - m^T phi_i)^2 + ||L^T phi_i||^2`` and the prior variances
        ``k_i = ||phi_i||^2`` of the rows X [n, d], y [n]: two [n] float64 vectors, in one chunked pass."""
        errors, variances = [], []
        for Xc, yc in zip(X.split(self.chunk_size), y.split(self.chunk_size)):
            Phi = self.kernel.basis(Xc).to(CORE)
            spread = ((Phi @ self.cache["q_sqrt"]) ** 2).sum(-1)
            errors.append((yc.to(CORE) - Phi @ self.cache["q_mu"]) ** 2 + spread)
            variances.append(prior_variance(Phi))
        return torch.cat(errors), torch.cat(variances)

    def expected_log_likelihood_optimal_noise(self, e: Tensor, c: Tensor, y: Tensor, comm: Comm = LOCAL) -> float:
        """``argmax_{sigma^2} sum_i E_q log N(y_i | phi_i^T w, sigma^2 + c_i)`` with q(w) and the network fixed,
        ``-1/2 sum_i [log 2 pi s_i + e_i / s_i]`` with ``s_i = sigma^2 + c_i``, from the expected squared errors
        e [n] and corrections c [n] of this process's rows y [n]: O(n) per evaluation."""
        total = comm.all_reduce_sum(torch.stack([(y.to(CORE) ** 2).sum(), torch.tensor(y.shape[0], dtype=CORE)]))
        bounds = self.noise_search_bounds(float(total[0] / total[1]))

        def expected_log_likelihood_at(s2: float) -> float:
            s = s2 + c
            return float(comm.all_reduce_sum(-0.5 * ((2 * math.pi * s).log() + e / s).sum()))

        return _linear.maximise_over_noise(expected_log_likelihood_at, *bounds, grid_points=60)

    def predictive_factors(self, X: Tensor) -> PredictiveFactors:
        """Mean ``m^T phi*`` and variance ``||L^T phi*||^2 + c(x*)`` (eq. 10 with sigma^2 -> sigma^2 + c(x*))."""
        Phi = self.kernel.basis(X).to(CORE)  # [c, r]
        return PredictiveFactors(Phi @ self.cache["q_mu"], None, (Phi @ self.cache["q_sqrt"]).T,
                                 self.predictive_correction(Phi))


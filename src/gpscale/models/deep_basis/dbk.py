"""Deep Basis Kernel GPs (Zhu, Yuchi & Xie 2025, "Scalable Gaussian Processes with Low-Rank Deep
Kernel Decomposition", arXiv 2505.18526 v1).

A network phi: R^d -> R^r outputs r basis functions, and the kernel is their inner product (eq. 4):

    k(x, x') = phi(x)^T phi(x'),     K_XX = Phi Phi^T  [n, n], rank <= r,

a truncated Mercer expansion with the eigenvalues absorbed into the bases: no output scale, no orthogonality and no
normalisation, so the prior variance k(x, x) = ||phi(x)||^2 depends on x. In weight space f(x) = phi(x)^T w with
w ~ N(0, I_r) (eq. 7): a Bayesian linear model, so exact inference is the linear engine's
(:class:`~gpscale.models.linear.engine.FeatureSpaceGP`) with
``Lambda = Phi^T Phi + sigma^2 I = sigma^2 B``, in O(n r^2) time and O(n r) memory, never n x n:

    log p(y)  = -n/2 log 2 pi - (n - r)/2 log sigma^2 - 1/2 log|Lambda| - 1/2 y^T Sigma^{-1} y        (eq. 5)
    y^T Sigma^{-1} y = (||y - Phi alpha||^2 + sigma^2 ||alpha||^2) / sigma^2,   alpha = Lambda^{-1} Phi^T y
    E[f* | y] = phi*^T alpha,   Var[f* | y] = sigma^2 phi*^T Lambda^{-1} phi*                         (eq. 6)

(the engine's ``-n/2 log sigma^2 - 1/2 log|B|`` is eq. 5's ``-(n - r)/2 log sigma^2 - 1/2 log|Lambda|``).

Two registered methods, the paper's two rows of every table:

- ``dbk``: exact inference, trained full batch on eq. 5 (Algorithm 9.1).
- ``svdbk``: stochastic variational inference on w, ``q(w) = N(m, S S^T)`` with S lower triangular, trained on
  minibatches with the ELBO of eq. 9 (n/b scaling) and predicting with eq. 10 (``Var f* = ||S^T phi*||^2``): the
  variational engine with the weights w as inducing variables (:mod:`gpscale.models.deep_basis.svdbk`).

They are two keys rather than an ``inference=`` option of one, because they differ in what the rest of gpscale
reads from the class: the trainer minibatches unless ``full_batch`` (a property of the objective), and SVDBK has
variational parameters (m, S) that exact DBK has not, so each key's options and saved state are exactly its own.
This is the same split as ``sgpr`` / ``svgp``, and the benchmark protocols can name the paper's rows by key.

**Variance correction**, on by default with the Gaussian likelihood; ``correction=False`` gives the paper's "-c"
ablations. Marginal likelihood training drifts toward the rank-1 kernel y y^T with sigma^2 -> 0 (Theorem 1), and
then every interval vanishes, because the posterior variance is proportional to sigma^2. The correction pads the
prior variance to a uniform k_max = max_i k(x_i, x_i) over the training set with the diagonal kernel
``c(x, x) = max(k_max, k(x, x)) - k(x, x)``:

- training maximises the Titsias-style bound ``log p(y) - tr(C_XX) / (2 sigma^2)`` on the corrected evidence
  (eq. 11); on a minibatch the trace is scaled by n/b and uses the batch max (biased low, as the paper specifies);
- prediction uses the corrected kernel, i.e. heteroscedastic noise ``sigma^2 + c(x)`` (eq. 12): exact DBK
  refits the posterior on rows scaled by ``D^{-1/2}``, ``D = 1 + c / sigma^2`` (the paper's "Phi^ = D^{-1/2} Phi",
  misprinted there as D^{-1/2} Phi^T), and every method adds c(x*) to the latent variance. The training maximum is
  the one used for test points, never a test chunk's.

**Optimisation recipe**: sigma^2 starts at 1e-2 with floor 1e-6; weight decay 1e-4 (coupled, as
``torch.optim.Adam``'s ``weight_decay``) on the network's parameters only, through :meth:`parameter_groups`, never
on sigma^2, m or S. The loss is divided by n, as every gpscale loss (and GPyTorch's ``ExactMarginalLogLikelihood``),
so the decay acts against the per-point objective.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from torch import Tensor, nn

from ...defaults import CONVERGENCE, TrainingDefaults
from ...device import chunks_on
from ...distributed import LOCAL, Comm
from ...kernels.deep_basis import (ACTIVATIONS, DEFAULT_DEPTH, NETWORKS, DeepBasisKernel, mlp, prior_variance,
                                   residual_mlp)
from ...linalg import CORE
from ...options import check_options
from ..linear.engine import Features, FeatureSpaceGP
from ..linear.weight_space import (held_out_log_density, held_statistics, log_evidence, maximise_over_noise,
                                   weight_space_predictive)
from ..extrapolation import warn_outside_box
from ..base import BenchSize, GPModel, register

__all__ = ["DeepBasisModel", "DBK", "variance_correction", "trace_penalty"]

# --- the correction ------------------------------------------------------------------------------
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
    unbiased for a given k_max. It is divided by sigma^2, not multiplied: this is what makes sigma^2 -> 0
    costly.
    """
    return (num_data / k.shape[0]) * (k_max - k).sum() / (2 * noise)


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
            get PyTorch's default initialisation in :meth:`initialise_from_data`, from the seed of :func:`gpscale.train.fit`.
        scale_basis: divide the network output by sqrt(r), so that ||phi(x)||^2 = O(1) at initialisation (default:
            True for the built-in networks, False for a given module, which is used as given; not in the paper,
            whose protocols pass False). With the paper's unscaled outputs the prior variances of a freshly drawn
            ResNet spread over tens, and at the initial sigma^2 = 1e-2 the trace penalty puts the objective far
            above the model that ignores the inputs, a start from which the optimiser can stop short of it.
        correction: the variance correction in training and prediction (default: on with the Gaussian
            likelihood, the paper's); False is the "-c" ablation. It pads the noise variance, so a classification
            likelihood (svdbk's), which has none, takes only False.
        calibrate_noise: after training, re-estimate sigma^2 with the network fixed: ``None`` (no calibration;
            the paper's); ``'posterior'`` (``dbk``'s default: the posterior refitted at the calibrated sigma^2, mean
            and variance alike); or ``'variance'`` (``svdbk``: q(w), and so the latent mean, stays as trained, and
            the sigma^2 maximising ``sum_i E_q log N(y_i | phi_i^T w, sigma^2 + c_i)`` enters the variance of y
            only). Each method takes those its inference allows (:attr:`calibration_modes`). ``dbk`` takes the
            sigma^2 that maximises the predictive density of the rows training held out (``val_fraction``, 0.1 by
            default where calibrate_noise is set: :meth:`DBK.held_out_optimal_noise`), else the corrected model's
            evidence ``log N(y | 0, Phi Phi^T + C_XX + sigma^2 I)`` on the rows it fits. Why calibrate: the trace
            penalty's 1/sigma^2 holds the trained sigma^2 above the residual noise, and the corrected predictive
            adds c(x*) on top of it; and a network trained to convergence fits its training rows more closely than
            new ones, so that a sigma^2 estimated on them is too small at new inputs, where held-out rows measure
            it. Both modes act in :meth:`fit_posterior` only and :meth:`clear_cache` restores the training
            sigma^2, so the training loss never sees the calibrated value; validation passes score the calibrated
            model.
        weight_decay: Adam's coupled L2 weight decay on the network's parameters only (default 1e-4, the paper's).
        noise: initial sigma^2 (default 1e-2, the paper's); ``noise_floor`` (default 1e-6) bounds it below.
        kernel: accepted only as None or ``'rbf'`` (the value :class:`~gpscale.GPRegressor` passes every method);
            the deep basis kernel has no base kernel, so anything else is an error.
        **kwargs: ``learn_noise``, ``noise_floor`` and ``chunk_size`` of :class:`GPModel`.
    """

    posterior_options = ("calibrate_noise",)
    calibration_modes: tuple[str | None, ...] = (None,)  # the values of calibrate_noise the inference allows
    lengthscale_starts_at_median = False  # a network's basis: no distance between inputs to start at

    def __init__(self, n_features: int, n_basis: int = 128, network: str | nn.Module = "resnet",
                 depth: int | None = None, width: int = 128, activation: str = "tanh", scale_basis: bool | None = None,
                 correction: bool | None = None, weight_decay: float = 1e-4, calibrate_noise: str | None = None, *,
                 kernel: str | None = None, noise: float = 1e-2, **kwargs):
        _check_options(n_basis=n_basis, network=network, depth=depth, width=width, activation=activation,
                       weight_decay=weight_decay, kernel=kernel, kwargs=kwargs)
        builtin = not isinstance(network, nn.Module)
        if builtin:
            build = mlp if network == "mlp" else residual_mlp
            depth = DEFAULT_DEPTH[network] if depth is None else int(depth)
            network = build(int(n_features), int(n_basis), depth, int(width), activation)
        if scale_basis is not None and not isinstance(scale_basis, (bool, np.bool_)):
            raise ValueError(f"scale_basis must be True, False or None (True for the built-in networks), got "
                             f"{scale_basis!r}.")
        scale_basis = builtin if scale_basis is None else bool(scale_basis)
        super().__init__(n_features, kernel=DeepBasisKernel(network, n_basis, scale_basis), noise=noise, **kwargs)
        self.n_basis = int(n_basis)
        self.builtin_network = builtin
        if correction is not None and not isinstance(correction, (bool, np.bool_)):
            raise ValueError(f"correction must be True, False or None (on with a Gaussian likelihood), got "
                             f"{correction!r}.")
        gaussian = self.likelihood.noise is not None
        if correction and not gaussian:
            raise ValueError(f"correction=True pads a noise variance, which the {kwargs.get('likelihood')!r} "
                             "likelihood has none of: pass correction=False (the default for classification).")
        self.correction = gaussian if correction is None else bool(correction)
        self.weight_decay = float(weight_decay)
        self.calibrate_noise = calibrate_noise
        self.check_posterior_options()

    def initialise_from_data(self, X: Tensor, y: Tensor, seed: int = 0) -> None:
        # fit() has just seeded torch's generator: a built-in network drawn now makes training reproducible. Each
        # layer is drawn on the CPU (as nn.Linear draws itself) and copied, so that a GPU's generator, which draws
        # other numbers from the same seed, does not make a fit there differ from one on the CPU.
        if self.builtin_network:
            with torch.no_grad():
                for layer in self.kernel.network.modules():
                    if isinstance(layer, nn.Linear):
                        drawn = nn.Linear(layer.in_features, layer.out_features, dtype=layer.weight.dtype)
                        layer.weight.copy_(drawn.weight)
                        layer.bias.copy_(drawn.bias)

    def check_posterior_options(self) -> None:
        if isinstance(self.calibrate_noise, (bool, np.bool_)) or self.calibrate_noise not in self.calibration_modes:
            raise ValueError(f"calibrate_noise of {self.key} must be one of {self.calibration_modes}, got "
                             f"{self.calibrate_noise!r}.")
        if self.calibrate_noise is not None and self.likelihood.noise is None:
            raise ValueError(f"calibrate_noise={self.calibrate_noise!r} re-estimates a noise variance, which a "
                             "classification likelihood has none of: pass calibrate_noise=None.")

    def parameter_groups(self) -> list[dict]:
        """Weight decay on the network's parameters only, none on sigma^2 or q(w): it regularises the network, while
        q(w) is already held to its prior by the KL term and sigma^2 is a noise level, not a weight."""
        trainable = [p for group in super().parameter_groups() for p in group["params"]]
        in_network = {id(p) for p in self.kernel.network.parameters()}
        network = [p for p in trainable if id(p) in in_network]
        others = [p for p in trainable if id(p) not in in_network]
        groups = [{"params": network, "weight_decay": self.weight_decay}, {"params": others, "weight_decay": 0.0}]
        return [group for group in groups if group["params"]]

    def penalty(self, Phi: Tensor, num_data: int, comm: Comm = LOCAL) -> Tensor:
        """The trace penalty (float64 scalar) from the basis rows Phi [b, r] of a set of ``num_data`` points, with
        k_max the max over these rows: all of them in exact training, the batch in SVI. With ``comm``, k_max is the
        max over every process's rows, and this process's term is returned.

        The gradient goes through the max (to the argmax row, as ``torch.max`` routes it), as in the paper. That
        gradient is what holds the largest prior variance down: with k_max detached the penalty would push every
        ||phi_i||^2 up, the largest included, so it is not an option.
        """
        k = prior_variance(Phi).to(CORE)
        return trace_penalty(k, comm.all_reduce_max(k.max()), self.noise.to(CORE), num_data)

    @torch.no_grad()
    def max_prior_variance(self, X: Tensor) -> Tensor:
        """k_max = max_i ||phi(x_i)||^2 over the rows of X [n, d], one chunk at a time (float64 scalar)."""
        maxima = [prior_variance(self.kernel.basis(Xc)).max() for (Xc,) in chunks_on(self.device, self.chunk_size, X)]
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
        phi(x)^T alpha can be far off while its variance stays small, even just outside the box (docs/dbk.md)."""
        warn_outside_box(X, self.cache["x_lower"], self.cache["x_upper"])

    def predictive_extra(self, Phi: Tensor) -> Tensor:
        """c(x*) [c] for test rows Phi [c, r] (float64) against the training k_max; zero without the correction."""
        if not self.correction:
            return torch.zeros(Phi.shape[0], dtype=CORE, device=Phi.device)
        return variance_correction(prior_variance(Phi), self.cache["k_max"])


def _check_options(*, n_basis, network, depth, width, activation, weight_decay, kernel, kwargs) -> None:
    if not isinstance(network, nn.Module) and network not in NETWORKS:
        raise ValueError(f"network must be 'mlp', 'resnet' or a torch.nn.Module, got {network!r}.")
    check_options({"n_basis": n_basis, "width": width, "depth": depth, "weight_decay": weight_decay})
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}.")
    if kernel not in (None, "rbf"):
        raise ValueError(f"A deep basis kernel is phi(x)^T phi(x'), set by the network option; it takes no "
                         f"kernel, got kernel={kernel!r}.")
    stationary = sorted({"ard", "lengthscale", "outputscale"} & kwargs.keys())
    if stationary:
        raise ValueError(f"{', '.join(stationary)} belong to stationary kernels; a deep basis kernel has none.")


# --- exact inference ----------------------------------------------------------------------------------------------
@register("dbk")
class DBK(DeepBasisModel, FeatureSpaceGP):
    """Deep basis kernel GP with exact inference, trained full batch (Algorithm 9.1) on the linear engine.

    Each step computes Phi [n, r] for all n rows, because the trace penalty's max couples them; the network runs
    in chunks of ``chunk_size`` rows, and the backward pass runs it again one chunk at a time, so its activations
    are held for one chunk at a time, and the evidence's data fit is in residual form. ``Phi^T Phi`` and its
    Cholesky are float64 whatever the model dtype: the network's float32 rows would lose the evidence's small
    differences.
    For n beyond a few 10^5, use ``svdbk``.

    Args: those of :class:`DeepBasisModel`.
    """

    residual_evidence = True
    calibration_modes = (None, "posterior")
    held_features_advice = ("Use method='svdbk' (minibatches: memory O(batch_size x n_basis)), fewer basis functions "
                            "(n_basis=...), or fewer rows.")
    # Full-batch Adam to the plateau rule over windows of 50 steps, on the rows not held out; the plateau rule
    # watches the training loss, and the tenth held out gives sigma^2 (held_out_optimal_noise). Why these and not
    # L-BFGS, windows of 10 or stopping on the held-out NLPD: docs/dbk-notes.md.
    default_training = TrainingDefaults("adam", lr=1e-2, max_steps=5000, val_fraction=0.1)
    default_convergence = replace(CONVERGENCE, full_batch_window=50, watch_validation=False)
    auto_dtype = "float32"  # faster than float64 and no less accurate
    floor_sizes = {"small": BenchSize(2000, 8), "paper": BenchSize(13500, 26)}

    def __init__(self, n_features: int, *, calibrate_noise: str | None = "posterior", **kwargs):
        super().__init__(n_features, calibrate_noise=calibrate_noise, **kwargs)

    @torch.no_grad()
    def held_out_optimal_noise(self, X_fit: Tensor, y_fit: Tensor, X_held: Tensor, y_held: Tensor,
                               comm: Comm = LOCAL) -> float:
        """The engine's held-out estimate of sigma^2 for the corrected model: the posterior of w from (X_fit,
        y_fit) under the noise ``sigma^2 + c_i`` (the fit rows scaled by ``(sigma^2 + c_i)^{-1/2}`` at unit noise,
        c from the fit rows' k_max), and the held-out rows' predictive variance ``Var[f_h] + c_h + sigma^2``:
        O(n r^2) per evaluation. Without the correction, the engine's O(r) evaluations."""
        if not self.correction:
            return super().held_out_optimal_noise(X_fit, y_fit, X_held, y_held, comm)
        self.clear_cache()
        Phi, y = self.phi(X_fit).to(CORE), y_fit.to(CORE)
        Phi_held, y_held = self.phi(X_held).to(CORE), y_held.to(CORE)
        self.cache["k_max"] = comm.all_reduce_max(prior_variance(Phi).max())
        c, c_held = self.predictive_extra(Phi), self.predictive_extra(Phi_held)
        one = torch.ones((), dtype=CORE, device=Phi.device)

        def log_density_at(s2: float) -> float:
            post = self.weight_posterior_of(Phi, y, comm, noise=one, row_scale=(s2 + c).rsqrt())
            mean, var_f = weight_space_predictive(post.L_B, post.weight_mean, Phi_held)
            return held_out_log_density(y_held, mean, var_f + c_held + s2, comm)

        totals = comm.all_reduce_sum(torch.stack([(y * y).sum(), torch.tensor(float(len(y))).to(y)]))
        self.clear_cache()
        return maximise_over_noise(log_density_at, *self.noise_search_bounds(float(totals[0] / totals[1])),
                                   grid_points=60)

    def feature_map(self, state: dict[str, Tensor]) -> Features:
        """``x -> phi(x)``, the network's bases (no state: the network's weights are its parameters)."""
        return Features(self.kernel.basis)

    def solver_for(self, X: Tensor, posterior: bool) -> str:
        """Cholesky: every pass holds Phi [n, r], whose Gram matrix is float64."""
        return "cholesky"

    def heteroscedastic_rows(self, Phi: Tensor, y: Tensor, k_max: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Rows scaled for the corrected model: ``Phi^ = D^{-1/2} Phi`` [n, r], ``y^ = D^{-1/2} y``
        [n] and D [n], with ``D_i = (sigma^2 + c_i) / sigma^2``: ``Phi Phi^T + C + sigma^2 I = D^{1/2} (Phi^ Phi^^T
        + sigma^2 I) D^{1/2}``, so the corrected GP is the plain one on scaled rows."""
        D = 1 + variance_correction(prior_variance(Phi), k_max) / self.noise.to(Phi.dtype)
        scale = D.rsqrt()
        return Phi * scale.unsqueeze(-1), y * scale, D

    def corrected_log_marginal_likelihood(self, X: Tensor, y: Tensor) -> Tensor:
        """``log N(y | 0, Phi Phi^T + C_XX + sigma^2 I)``, the evidence of the corrected model that the training
        objective bounds (for diagnostics): ``log N(y^ | 0, Phi^ Phi^^T + sigma^2 I) - 1/2 sum log D``."""
        Phi = self.phi(X)
        Phi_hat, y_hat, D = self.heteroscedastic_rows(Phi, y, prior_variance(Phi).max())
        return self.evidence_of(Phi_hat, y_hat) - 0.5 * D.to(CORE).log().sum()

    def objective(self, X: Tensor, y: Tensor, comm: Comm = LOCAL) -> Tensor:
        """``J = log p(y) - tr(C_XX) / (2 sigma^2)`` (eq. 5 minus the penalty of eq. 11), or log p(y) without the
        correction (float64 scalar), over every process's rows."""
        Phi = self.phi(X)
        lml = self.evidence_of(Phi, y, comm)
        return lml - comm.all_reduce_sum(self.penalty(Phi, X.shape[0], comm)) if self.correction else lml

    def loss(self, X: Tensor, y: Tensor, num_data: int, comm: Comm = LOCAL, share: float = 1.0) -> Tensor:
        return -self.objective(X, y, comm) / num_data

    @torch.no_grad()
    def fit_posterior(self, X: Tensor, y: Tensor, comm: Comm = LOCAL) -> None:
        held_out = self.take_held_out_noise()
        self.clear_cache()  # a previous calibration must not be the starting point of this one
        self.record_training_box(X, comm)
        Phi = self.phi(X)
        if self.correction:
            self.cache["k_max"] = comm.all_reduce_max(prior_variance(Phi).max().to(CORE))
        if self.calibrate_noise == "posterior":
            self.set_calibrated_noise(self.corrected_optimal_noise(Phi, y, comm) if held_out is None else held_out)

        if self.correction:  # the corrected GP is the plain one on rows scaled by D^{-1/2}
            Phi, y, _ = self.heteroscedastic_rows(Phi, y, self.cache["k_max"])
        post = self.weight_posterior_of(Phi, y, comm)
        self.cache.update(L_B=post.L_B, w_mean=post.weight_mean)

    def corrected_optimal_noise(self, Phi: Tensor, y: Tensor, comm: Comm = LOCAL) -> float:
        """``argmax_{sigma^2} log N(y | 0, Phi Phi^T + C_XX + sigma^2 I)`` for the basis rows Phi [n, r] fixed
        (C_XX = 0 without the correction). Without it, O(r) per evaluation from Phi^T Phi's eigenvalues
        (:meth:`~gpscale.models.linear.engine.FeatureSpaceGP.evidence_optimal_noise`); with it, O(n r^2) on rows scaled
        by ``(sigma^2 + c_i)^{-1/2}``: the evidence is ``log N(y^ | 0, Phi^ Phi^^T + I) - 1/2 sum_i log(sigma^2 +
        c_i)``."""
        Phi, y = Phi.to(CORE), y.to(CORE)
        stats = held_statistics(Phi, y, chunk_size=self.chunk_size, comm=comm)
        if not self.correction:
            return self.evidence_optimal_noise(stats)
        c = self.predictive_extra(Phi)
        one = torch.ones((), dtype=CORE, device=Phi.device)

        def log_evidence_at(s2: float) -> float:
            scale = (s2 + c).rsqrt()
            post = self.weight_posterior_of(Phi, y, comm, noise=one, row_scale=scale)
            return float(log_evidence(post, one) + comm.all_reduce_sum(scale.log().sum()))

        return maximise_over_noise(log_evidence_at, *self.noise_search_bounds(float(stats.yy) / stats.n),
                                   grid_points=60)

"""Observation models p(y | f): Gaussian noise for regression, the probit Bernoulli for binary classification, and
two multiclass models over C latent functions f = (f_1..f_C): robust-max (quadrature) and softmax (Monte Carlo)."""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.functional import softplus

from .device import check_failed
from .kernels.stationary import SOFTPLUS_ZERO, inverse_softplus

__all__ = ["Gaussian", "Bernoulli", "RobustMax", "Softmax", "make_likelihood", "LIKELIHOODS"]

LIKELIHOODS = ("gaussian", "bernoulli", "softmax", "robustmax")
MULTICLASS = ("softmax", "robustmax")  # the likelihoods with C > 1 latent functions, built with ``n_classes``

LOG_2PI = math.log(2.0 * math.pi)


class Gaussian(nn.Module):
    """``y = f + eps``, ``eps ~ N(0, sigma^2)``.

    Args:
        noise: initial (or, with ``learn_noise=False``, fixed) noise variance sigma^2.
        learn_noise: train sigma^2 with the other hyperparameters.
        noise_floor: sigma^2 = noise_floor + softplus(raw) stays above this; it keeps every
            ``K + sigma^2 I`` well conditioned. Ignored when the noise is fixed.
    """

    n_latent = 1  # latent functions per input: f is [n]
    natural_steps = True  # a variational q's default optimiser: natural-gradient steps (VariationalGP)

    def __init__(self, noise: float = SOFTPLUS_ZERO, learn_noise: bool = True, noise_floor: float = 1e-6):
        super().__init__()
        if noise <= 0:
            raise ValueError(f"noise must be positive, got {noise}.")
        self.learn_noise = bool(learn_noise)
        self.noise_floor = float(noise_floor) if learn_noise else 0.0
        if self.learn_noise and noise <= self.noise_floor:
            raise ValueError(f"noise ({noise}) must be above noise_floor ({noise_floor}).")
        raw = inverse_softplus(torch.tensor(float(noise) - self.noise_floor))
        if self.learn_noise:
            self.raw_noise = nn.Parameter(raw)
        else:
            self.register_buffer("raw_noise", raw)

    @property
    def noise(self) -> Tensor:
        """sigma^2, a scalar tensor."""
        return self.noise_floor + softplus(self.raw_noise)

    @torch.no_grad()
    def set_noise(self, noise: float | Tensor) -> None:
        """Set sigma^2 (a number or a scalar tensor): ``raw = inverse_softplus(sigma^2 - floor)``, computed in
        float64; a value at or below the floor is held at the smallest excess above it."""
        excess = torch.as_tensor(noise, dtype=torch.float64) - self.noise_floor
        self.raw_noise.copy_(inverse_softplus(excess.clamp_min(torch.finfo(torch.float64).tiny)).to(self.raw_noise))

    def predictive(self, mean: Tensor, var: Tensor) -> tuple[Tensor, Tensor]:
        """Moments of p(y*) = ∫ p(y* | f*) N(f* | mean, var) df*: ``(mean, var + sigma^2)``."""
        return mean, var + self.noise.to(var.dtype)

    def expected_log_prob(self, y: Tensor, mean: Tensor, var: Tensor) -> Tensor:
        """``E_{N(f | mean, var)} log N(y | f, sigma^2)`` per point [n], in closed form:
        ``-1/2 log(2 pi sigma^2) - ((y - mean)^2 + var) / (2 sigma^2)``."""
        s2 = self.noise.to(mean.dtype)
        return -0.5 * (LOG_2PI + torch.log(s2)) - 0.5 * ((y - mean) ** 2 + var) / s2

    def log_predictive_density(self, y: Tensor, mean: Tensor, var: Tensor) -> Tensor:
        """``log N(y | mean, var + sigma^2)`` per point [n]."""
        mean, var = self.predictive(mean, var)
        return -0.5 * (LOG_2PI + torch.log(var) + (y - mean) ** 2 / var)

    @staticmethod
    def null_loss(y: Tensor) -> float:
        """The negative log-likelihood per point of the best model that ignores the inputs within a zero-mean GP's
        reach (outputscale 0, noise mean(y^2)), y ~ N(0, mean(y^2)): ``1/2 log(2 pi mean(y^2)) + 1/2``; the
        yardstick of a degenerate fit."""
        mean_square = (y.double() ** 2).mean().clamp_min(torch.finfo(torch.float64).tiny)
        return 0.5 * (LOG_2PI + math.log(float(mean_square)) + 1.0)


class Bernoulli(nn.Module):
    """Probit classification: labels y in {-1, +1}, ``p(y | f) = Phi(y f)`` with Phi the standard normal CDF
    (the latent-noise model ``y = sign(f + eps)``, eps ~ N(0, 1)).

    Args:
        quadrature_points: Gauss-Hermite points for ``E_q log Phi(y f)`` (default 20).
    """

    noise = None  # no observation noise to learn
    n_latent = 1  # latent functions per input: f is [n]
    natural_steps = True  # a variational q's default optimiser: natural-gradient steps (VariationalGP)

    def __init__(self, quadrature_points: int = 20):
        super().__init__()
        nodes, weights = gauss_hermite(quadrature_points)
        # E_{N(f | m, v)} g(f) = sum_i w_i g(m + sqrt(2 v) t_i)
        self.register_buffer("nodes", nodes)
        self.register_buffer("weights", weights)

    def expected_log_prob(self, y: Tensor, mean: Tensor, var: Tensor) -> Tensor:
        """``E_{N(f | mean, var)} log Phi(y f)`` per point [n], by Gauss-Hermite quadrature."""
        f = mean.unsqueeze(-1) + torch.sqrt(2 * var.clamp_min(0)).unsqueeze(-1) * self.nodes.to(mean)  # [n, q]
        return (log_normal_cdf(y.unsqueeze(-1) * f) * self.weights.to(mean)).sum(-1)

    def probability(self, mean: Tensor, var: Tensor) -> Tensor:
        """``p(y* = +1) = Phi(mean / sqrt(1 + var))`` [n], exactly (the probit integral)."""
        return torch.special.ndtr(mean / torch.sqrt(1 + var))

    def predictive(self, mean: Tensor, var: Tensor) -> tuple[Tensor, Tensor]:
        """Moments of y* in {-1, +1}: ``(2p - 1, 4 p (1 - p))``."""
        p = self.probability(mean, var)
        return 2 * p - 1, 4 * p * (1 - p)

    def log_predictive_density(self, y: Tensor, mean: Tensor, var: Tensor) -> Tensor:
        """``log p(y*) = log Phi(y* mean / sqrt(1 + var))`` per point [n]."""
        return log_normal_cdf(y * mean / torch.sqrt(1 + var))

    @staticmethod
    def null_loss(y: Tensor) -> float:
        """The negative log-likelihood per point of the model that ignores the inputs (every label +1 with the
        frequency of +1 in y): the entropy of the labels' frequencies."""
        return label_entropy(torch.stack([(y < 0).sum(), (y > 0).sum()]))


def label_entropy(counts: Tensor) -> float:
    """``-sum_c p_c log p_c`` of the frequencies ``p_c = counts_c / sum(counts)``, in nats."""
    p = counts.double() / counts.sum()
    return float(-(p[p > 0] * p[p > 0].log()).sum())


def log_normal_cdf(z: Tensor) -> Tensor:
    """``log Phi(z)``, accurate far in the lower tail (where Phi underflows)."""
    return torch.special.log_ndtr(z)


def gauss_hermite(n_points: int) -> tuple[Tensor, Tensor]:
    """Gauss-Hermite rule for a standard normal, as float64 tensors ``(t [q], w [q])``:
    ``E_{z ~ N(0, 1)} g(z) ~= sum_i w_i g(sqrt(2) t_i)``, with the w_i (the Hermite weights / sqrt(pi)) summing to 1.
    Exact for polynomials g of degree < 2q."""
    nodes, weights = np.polynomial.hermite.hermgauss(int(n_points))
    return torch.tensor(nodes, dtype=torch.float64), torch.tensor(weights / math.sqrt(math.pi), dtype=torch.float64)


SD_FLOOR = 1e-10  # latent standard deviations are clamped here, so a variance of 0 divides nothing by 0
# log Phi(z) arguments are clamped here: log Phi(-1e3) = -5e5, so P = exp(.) is 0 in any dtype well before, while
# torch's log_ndtr gradient degrades below about -1e3 (float32) and is inf or NaN below about -1e9 (float64)
Z_FLOOR = -1e3


class _MultiClass(nn.Module):
    """Shared by the C-class likelihoods: labels y in {0, ..., C-1} [b]; the latent f = (f_1..f_C) has the
    factorised Gaussian q(f) = N(mean, diag var), mean and var [b, C]. Validates both at every public call."""

    noise = None  # no observation noise to learn
    natural_steps = True  # a variational q's default optimiser: natural-gradient steps (VariationalGP)

    def __init__(self, n_classes: int):
        super().__init__()
        if isinstance(n_classes, bool) or not isinstance(n_classes, (int, np.integer)) or n_classes < 2:
            raise ValueError(f"n_classes must be an integer >= 2, got {n_classes!r}.")
        self.n_classes = int(n_classes)

    @property
    def n_latent(self) -> int:
        """Latent functions per input, C = ``n_classes``: f is [b, C]."""
        return self.n_classes

    def _check_moments(self, mean: Tensor, var: Tensor) -> None:
        """mean and var must both be [b, C]."""
        C = self.n_classes
        if mean.ndim != 2 or mean.shape[-1] != C or var.shape != mean.shape:
            raise ValueError(f"mean and var must both be [b, C] = [b, {C}] (one column per class), got mean "
                             f"{tuple(mean.shape)} and var {tuple(var.shape)}.")

    def _labels(self, y: Tensor, mean: Tensor) -> Tensor:
        """y [b] of class indices (any integer dtype, or a float dtype holding integers) as int64 [b]."""
        C, b = self.n_classes, mean.shape[0]
        hint = f"pass y as a [b] tensor of integer class indices 0..{C - 1} (e.g. torch.tensor([0, 2, 1]))"
        y = torch.as_tensor(y)
        if y.shape != (b,):
            raise ValueError(f"Labels have shape {tuple(y.shape)} but mean is {tuple(mean.shape)}; {hint}.")
        if y.dtype == torch.bool or y.is_complex():
            raise ValueError(f"Labels have dtype {y.dtype}; {hint}.")
        # one read on the host for both checks, deferrable in a training step (gpscale.device.check_failed)
        if check_failed((y != torch.round(y)) | (y < 0) | (y > C - 1)):
            if y.is_floating_point() and not bool((y == torch.round(y)).all()):
                raise ValueError(f"Labels must be whole numbers, got non-integer values (dtype {y.dtype}); {hint}.")
            raise ValueError(f"Labels must lie in 0..{C - 1}, got values from {y.min().item()} to "
                             f"{y.max().item()}; {hint} (classes numbered from 0, not 1 and not -1/+1).")
        return y.to(device=mean.device, dtype=torch.long)

    def null_loss(self, y: Tensor) -> float:
        """The negative log-likelihood per point of the model that ignores the inputs (each class with its
        frequency in y): the entropy of the classes' frequencies."""
        return label_entropy(torch.bincount(y.long().flatten(), minlength=self.n_classes))


class RobustMax(_MultiClass):
    """Robust-max multiclass likelihood (GPflow ``MultiClass``): over C latent functions,
    ``p(y = c | f) = 1 - eps`` if ``c = argmax_j f_j``, else ``eps / (C - 1)``, so a few mislabelled points
    cost a bounded ``log(eps / (C - 1))`` each.

    Under q(f) = N(mean, diag var) everything goes through ``P_c = Pr_q(c = argmax_j f_j)``, a 1-D integral over
    ``f_c = mean_c + sd_c z``:
    ``P_c = E_{z ~ N(0, 1)} prod_{j != c} Phi((mean_c + sd_c z - mean_j) / sd_j)``, by Gauss-Hermite quadrature on
    z (:func:`gauss_hermite`). The product is summed in log space (``log Phi``), so P_c stays accurate when it is
    tiny (large |mean|); sd is clamped at ``SD_FLOOR``, so var = 0 is allowed, and each Phi argument at
    ``Z_FLOOR`` (which only affects log P_c < -5e5, where P_c = 0 in any dtype). The rule is exact as var -> 0;
    its error in P_c grows with the spread of the sd_j: at most ~1e-3 (C <= 10) with every sd_j / sd_c in
    [1/2, 2], ~3e-3 in [1/2.8, 2.8], ~3e-2 in [1/6, 6] (measured against 300 points), because for sd_j << sd_c
    the integrand is nearly a step in z; raise ``quadrature_points`` there.

    Args:
        n_classes: C >= 2.
        epsilon: eps in (0, 1), fixed (a buffer, not trained; default 1e-3 as in the paper).
        quadrature_points: Gauss-Hermite points q (default 20, GPflow's).
    """

    # The variational methods' default for q (natural_gradients=None) is Adam under this likelihood: a
    # natural-gradient step's local quadratic model of log(1 - eps) P_y + log(eps / (C - 1)) (1 - P_y), bounded and
    # nearly a step in the means, overshoots it, and such steps left svgp far less accurate than Adam on q (the
    # comparison is in the SVGP page's reproduction notes).
    natural_steps = False

    def __init__(self, n_classes: int, epsilon: float = 1e-3, quadrature_points: int = 20):
        super().__init__(n_classes)
        if not 0 < epsilon < 1:
            raise ValueError(f"epsilon must lie in (0, 1), got {epsilon}.")
        if int(quadrature_points) < 1:
            raise ValueError(f"quadrature_points must be >= 1, got {quadrature_points}.")
        self.register_buffer("epsilon", torch.tensor(float(epsilon), dtype=torch.float64))
        nodes, weights = gauss_hermite(quadrature_points)
        self.register_buffer("nodes", nodes)
        self.register_buffer("weights", weights)

    def log_prob_pair(self, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """``(log(1 - eps), log(eps / (C - 1)))``: log p(y | f) when y is, and is not, the argmax of f."""
        eps = self.epsilon.to(dtype)
        return torch.log1p(-eps), torch.log(eps / (self.n_classes - 1))

    def log_argmax_probability(self, classes: Tensor, mean: Tensor, var: Tensor) -> Tensor:
        """``log P_c`` [b, k] for the classes c [b, k] (int64) of each row of mean, var [b, C]:
        ``log sum_i w_i exp(sum_{j != c} log Phi((mean_c + sd_c sqrt(2) t_i - mean_j) / sd_j))``."""
        sd = var.clamp_min(SD_FLOOR**2).sqrt()  # [b, C]
        t, log_w = math.sqrt(2.0) * self.nodes.to(mean), torch.log(self.weights.to(mean))  # [q]
        f_c = mean.gather(-1, classes).unsqueeze(-1) + sd.gather(-1, classes).unsqueeze(-1) * t  # [b, k, q]
        z = (f_c.unsqueeze(-2) - mean[:, None, :, None]) / sd[:, None, :, None]  # [b, k, C, q]
        others = torch.arange(self.n_classes, device=mean.device) != classes.unsqueeze(-1)  # j != c, [b, k, C]
        log_phi = torch.where(others.unsqueeze(-1), log_normal_cdf(z.clamp_min(Z_FLOOR)), 0.0)  # [b, k, C, q]
        return torch.logsumexp(log_phi.sum(-2) + log_w, dim=-1)  # [b, k]

    def argmax_probability(self, mean: Tensor, var: Tensor) -> Tensor:
        """``P_c = Pr_q(c = argmax_j f_j)`` [b, C], the C quadrature estimates divided by their sum (they sum to
        1 up to quadrature error), so the rows are a distribution."""
        self._check_moments(mean, var)
        classes = torch.arange(self.n_classes, device=mean.device).expand(mean.shape[0], -1)  # [b, C]
        return torch.softmax(self.log_argmax_probability(classes, mean, var), dim=-1)

    def expected_log_prob(self, y: Tensor, mean: Tensor, var: Tensor) -> Tensor:
        """``E_{N(f | mean, diag var)} log p(y | f) = log(1 - eps) P_y + log(eps / (C - 1)) (1 - P_y)`` [b], with
        P_y by quadrature (one 1-D integral per point, not normalised over classes: as GPflow). y [b] class indices;
        mean, var [b, C]."""
        self._check_moments(mean, var)
        y = self._labels(y, mean)
        P = self.log_argmax_probability(y.unsqueeze(-1), mean, var).squeeze(-1).exp().clamp_max(1.0)  # [b]
        log_hit, log_miss = self.log_prob_pair(mean.dtype)
        return log_miss + (log_hit - log_miss) * P

    def probability(self, mean: Tensor, var: Tensor) -> Tensor:
        """``p(y* = c) = (1 - eps) P_c + eps / (C - 1) (1 - P_c)`` [b, C]; rows sum to 1, entries in
        [eps / (C - 1), 1 - eps]."""
        P = self.argmax_probability(mean, var)
        eps = self.epsilon.to(mean.dtype)
        return (1 - eps) * P + eps / (self.n_classes - 1) * (1 - P)

    def predictive(self, mean: Tensor, var: Tensor) -> tuple[Tensor, Tensor]:
        """Moments of the one-hot y* [b, C]: ``(p, p (1 - p))`` with p = :meth:`probability`."""
        p = self.probability(mean, var)
        return p, p * (1 - p)

    def log_predictive_density(self, y: Tensor, mean: Tensor, var: Tensor) -> Tensor:
        """``log p(y* = y)`` [b] (>= log(eps / (C - 1)), so always finite)."""
        self._check_moments(mean, var)
        y = self._labels(y, mean)
        return torch.log(self.probability(mean, var).gather(-1, y.unsqueeze(-1)).squeeze(-1))


class Softmax(_MultiClass):
    """Softmax multiclass likelihood ``p(y = c | f) = softmax(f)_c = exp(f_c) / sum_j exp(f_j)`` over C latent
    functions; q(f) = N(mean, diag var), mean and var [b, C].

    Its expectations have no closed form and are estimated by Monte Carlo with reparameterised draws
    ``f_s = mean + sd * e_s``, e_s ~ N(0, I_C), so every estimate is differentiable in mean and var. Estimator
    variance: ``log softmax(f)_y`` has gradient ``onehot(y) - softmax(f)``, of squared norm <= 2, so by the
    Gaussian Poincaré inequality ``Var_q[log softmax(f)_y] <= 2 max_c var_c``, and the S-sample estimate of
    ``E_q log p(y | f)`` is unbiased with variance at most ``2 max_c var_c / S`` per point (standard error
    <= 0.35 sqrt(max_c var_c) at S = 16). ``var = 0`` gives f_s = mean exactly, hence ``log_softmax(mean)[y]``.

    Args:
        n_classes: C >= 2.
        mc_samples: S for :meth:`expected_log_prob` while autograd records (training; default 16).
        eval_samples: S for :meth:`expected_log_prob` under ``torch.no_grad()`` and for :meth:`predictive` and
            :meth:`log_predictive_density` (default 512); drawn ``chunk_samples`` at a time.
    """

    chunk_samples = 64  # draws per chunk, so memory is O(chunk_samples b C) whatever S is

    def __init__(self, n_classes: int, mc_samples: int = 16, eval_samples: int = 512):
        super().__init__(n_classes)
        if int(mc_samples) < 1 or int(eval_samples) < 1:
            raise ValueError(f"mc_samples and eval_samples must be >= 1, got {mc_samples} and {eval_samples}.")
        self.mc_samples, self.eval_samples = int(mc_samples), int(eval_samples)

    def _draws(self, mean: Tensor, var: Tensor, n_samples: int):
        """Yields chunks of reparameterised draws f_s = mean + sd e_s [s, b, C], ``n_samples`` in all. sd is 0
        where var <= 0 (so f_s = mean there, with a finite gradient in var)."""
        positive = var > 0
        sd = torch.where(positive, var.clamp_min(SD_FLOOR**2).sqrt(), 0.0)  # [b, C]
        for start in range(0, n_samples, self.chunk_samples):
            s = min(self.chunk_samples, n_samples - start)
            yield mean + sd * torch.randn(s, *mean.shape, dtype=mean.dtype, device=mean.device)

    def _log_softmax_sum(self, y: Tensor, mean: Tensor, var: Tensor, n_samples: int, log_space: bool) -> Tensor:
        """Over n_samples draws: ``sum_s log softmax(f_s)_y`` [b], or, with ``log_space``,
        ``log sum_s softmax(f_s)_y`` [b]."""
        index = y.view(1, -1, 1)
        total = None
        for f in self._draws(mean, var, n_samples):
            log_p = torch.log_softmax(f, dim=-1).gather(-1, index.expand(f.shape[0], -1, 1)).squeeze(-1)  # [s, b]
            part = torch.logsumexp(log_p, dim=0) if log_space else log_p.sum(0)
            total = part if total is None else (torch.logaddexp(total, part) if log_space else total + part)
        return total

    def expected_log_prob(self, y: Tensor, mean: Tensor, var: Tensor) -> Tensor:
        """``E_{N(f | mean, diag var)} log softmax(f)_y`` [b]: the mean of log softmax(f_s)_y over S draws (S =
        ``mc_samples`` while autograd records, else ``eval_samples``); unbiased, variance in the class docstring."""
        self._check_moments(mean, var)
        y = self._labels(y, mean)
        n_samples = self.mc_samples if torch.is_grad_enabled() else self.eval_samples
        return self._log_softmax_sum(y, mean, var, n_samples, log_space=False) / n_samples

    def probability(self, mean: Tensor, var: Tensor) -> Tensor:
        """``p(y* = c) = E_q softmax(f)_c`` [b, C], the mean over ``eval_samples`` draws; rows sum to 1."""
        self._check_moments(mean, var)
        total = sum(torch.softmax(f, dim=-1).sum(0) for f in self._draws(mean, var, self.eval_samples))
        return total / self.eval_samples

    def predictive(self, mean: Tensor, var: Tensor) -> tuple[Tensor, Tensor]:
        """Moments of the one-hot y* [b, C]: ``(p, p (1 - p))`` with p = :meth:`probability`."""
        p = self.probability(mean, var)
        return p, p * (1 - p)

    def log_predictive_density(self, y: Tensor, mean: Tensor, var: Tensor) -> Tensor:
        """``log p(y* = y) = log E_q softmax(f)_y`` [b], as ``logsumexp_s log softmax(f_s)_y - log S`` over
        ``eval_samples`` draws (log space: finite when p is tiny; biased low by Jensen, O(1/S))."""
        self._check_moments(mean, var)
        y = self._labels(y, mean)
        return self._log_softmax_sum(y, mean, var, self.eval_samples, log_space=True) - math.log(self.eval_samples)


def make_likelihood(name: str, *, noise: float = SOFTPLUS_ZERO, learn_noise: bool = True,
                    noise_floor: float = 1e-6, n_classes: int | None = None) -> nn.Module:
    """``'gaussian'`` (with the noise options), ``'bernoulli'`` (probit), or the multiclass ``'softmax'`` and
    ``'robustmax'``, which need ``n_classes`` >= 2 (and ignore the noise options, as ``'bernoulli'`` does)."""
    if name not in LIKELIHOODS:
        raise ValueError(f"Unknown likelihood {name!r}; use one of {LIKELIHOODS}.")
    if name in MULTICLASS:
        if n_classes is None:
            raise ValueError(f"The {name!r} likelihood needs the number of classes: pass n_classes (>= 2).")
        if isinstance(n_classes, bool) or not isinstance(n_classes, (int, np.integer)) or n_classes < 2:
            raise ValueError(f"n_classes must be an integer >= 2 for {name!r}, got {n_classes!r}.")
        return RobustMax(n_classes) if name == "robustmax" else Softmax(n_classes)
    if n_classes is not None:
        raise ValueError(f"n_classes is only for the multiclass likelihoods {MULTICLASS}, not {name!r} "
                         f"(got n_classes={n_classes!r}); leave it out.")
    if name == "gaussian":
        return Gaussian(noise=noise, learn_noise=learn_noise, noise_floor=noise_floor)
    return Bernoulli()


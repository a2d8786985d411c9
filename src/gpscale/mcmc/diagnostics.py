"""Convergence diagnostics of MCMC chains (Vehtari, Gelman, Simpson, Carpenter & Bürkner 2021): split R-hat, plain
or rank-normalised, and the multi-chain effective sample size.

Shapes: ``C`` chains, ``N`` draws per chain, ``D`` parameters.
"""
from __future__ import annotations

import math

import numpy as np
from scipy.special import ndtri
from scipy.stats import rankdata
from torch import Tensor

__all__ = ["split_rhat", "effective_sample_size"]


def _as_draws(samples, min_draws: int) -> np.ndarray:
    """Validated float64 copy of [C, N, D] draws."""
    if isinstance(samples, Tensor):
        samples = samples.detach().cpu().numpy()
    draws = np.asarray(samples, dtype=np.float64)
    if draws.ndim != 3:
        raise ValueError(f"Expected draws of shape [chains, draws, dim]. Got shape {draws.shape}.")
    if draws.shape[0] < 1 or draws.shape[1] < min_draws or draws.shape[2] < 1:
        raise ValueError(f"Expected at least 1 chain, {min_draws} draws per chain and 1 parameter. "
                         f"Got shape {draws.shape}.")
    if not np.isfinite(draws).all():
        raise ValueError("The draws contain non-finite values.")
    return draws


def _split_chains(draws: np.ndarray) -> np.ndarray:
    """Each chain cut into its first and second half (the middle draw dropped when N is odd), so that a chain
    that drifts shows up as two disagreeing chains. [C, N, D] -> [2C, N // 2, D]"""
    half = draws.shape[1] // 2
    return np.concatenate([draws[:, :half], draws[:, draws.shape[1] - half:]], axis=0)


def _rhat(draws: np.ndarray) -> np.ndarray:
    """Gelman-Rubin potential scale reduction of (already split) chains. [M, n, D] -> [D]"""
    n = draws.shape[1]
    # numpy's variance of equal values can be round-off, not 0: test for equality
    W = np.where(np.ptp(draws, axis=1) > 0, draws.var(axis=1, ddof=1), 0.0).mean(axis=0)  # within-chain var, [D]
    B_over_n = np.where(np.ptp(draws, axis=(0, 1)) > 0, draws.mean(axis=1).var(axis=0, ddof=1), 0.0)  # [D]
    var_plus = (n - 1) / n * W + B_over_n
    with np.errstate(divide="ignore", invalid="ignore"):
        # W = 0: constant chains; they agree (nan, nothing to judge) or are stuck in different places (inf)
        return np.where(W > 0, np.sqrt(var_plus / np.where(W > 0, W, 1.0)), np.where(B_over_n > 0, np.inf, np.nan))


def _rank_normalize(draws: np.ndarray) -> np.ndarray:
    """Normal scores of the ranks pooled over all chains (Vehtari et al. 2021, eq. 14). [M, n, D] -> [M, n, D]"""
    M, n, D = draws.shape
    ranks = rankdata(draws.reshape(M * n, D), axis=0, method="average")
    return ndtri((ranks - 3 / 8) / (M * n + 1 / 4)).reshape(M, n, D)


def split_rhat(samples, *, rank_normalize: bool = False) -> np.ndarray:
    """Split R-hat per parameter. [C, N, D] (numpy or torch) -> [D]

    ``rank_normalize=False``: the classic split R-hat of the draws (BDA3). ``True``: Vehtari et al. (2021), the
    larger of the rank-normalised bulk R-hat and the rank-normalised R-hat of the draws folded about their
    median (tails); robust to heavy tails. Values near 1 indicate agreement; > 1.01 (or 1.1, the classic cut)
    calls for longer runs. Works for a single chain too, through the split.
    """
    split = _split_chains(_as_draws(samples, min_draws=4))
    if not rank_normalize:
        return _rhat(split)
    bulk = _rhat(_rank_normalize(split))
    folded = np.abs(split - np.median(split.reshape(-1, split.shape[-1]), axis=0))
    return np.fmax(bulk, _rhat(_rank_normalize(folded)))


def _autocovariance(draws: np.ndarray) -> np.ndarray:
    """Biased (divided by N) autocovariance of each chain at lags 0..N-1, via FFT. [C, N, D] -> [C, N, D]"""
    N = draws.shape[1]
    centred = draws - draws.mean(axis=1, keepdims=True)
    size = 1 << (2 * N - 1).bit_length()  # zero padding to >= 2N - 1 avoids the circular wrap-around
    spectrum = np.fft.rfft(centred, n=size, axis=1)
    return np.fft.irfft(spectrum * np.conj(spectrum), n=size, axis=1)[:, :N] / N


def effective_sample_size(samples) -> np.ndarray:
    """Effective sample size per parameter from the chains' autocorrelations. [C, N, D] -> [D]

    Multi-chain estimate of Vehtari et al. (2021) / Stan: ``rho_t = 1 - (W - mean_c acov_c(t)) / var_plus``,
    summed with Geyer's initial monotone sequence: pair sums ``rho_2k + rho_2k+1`` are kept while positive and
    forced non-increasing, which cuts the noisy tail of the autocorrelation without dropping negative lags that
    belong to an antithetic chain. ``ESS = C N / tau`` with ``tau = -1 + 2 sum_k (rho_2k + rho_2k+1)``; tau is
    floored at ``1 / log10(C N)`` as in Stan. Gives about C N for independent draws and
    ``C N (1 - rho) / (1 + rho)`` for an AR(1) chain.
    """
    draws = _as_draws(samples, min_draws=4)
    C, N, D = draws.shape
    acov = _autocovariance(draws)  # [C, N, D]
    W = acov[:, 0].mean(axis=0) * N / (N - 1)  # mean within-chain variance (unbiased), [D]
    var_plus = W * (N - 1) / N + (draws.mean(axis=1).var(axis=0, ddof=1) if C > 1 else 0.0)
    ess = np.empty(D)
    constant = np.ptp(draws, axis=(0, 1)) == 0  # var_plus may be round-off there, not 0
    for d in range(D):
        if constant[d] or var_plus[d] <= 0:  # no information about the spread
            ess[d] = np.nan
            continue
        rho = 1 - (W[d] - acov[:, :, d].mean(axis=0)) / var_plus[d]  # [N]
        rho[0] = 1.0
        n_pairs = N // 2
        pairs = rho[: 2 * n_pairs].reshape(n_pairs, 2).sum(axis=1)  # rho_2k + rho_2k+1
        negative = np.flatnonzero(pairs < 0)
        pairs = pairs[: negative[0]] if len(negative) else pairs  # initial positive sequence
        pairs = np.minimum.accumulate(pairs)  # initial monotone sequence
        tau = max(-1 + 2 * pairs.sum(), 1 / math.log10(C * N))
        ess[d] = C * N / tau
    return ess

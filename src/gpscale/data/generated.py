"""Data sets drawn, not read: Friedman #1 and draws from a GP prior, seeded, needing no data folder."""
from __future__ import annotations

from functools import partial

import numpy as np

GENERATED = {"friedman1": 10, "friedman1_d11": 11, "gp_sample": 2,
             "matern32_d1": 1, "matern32_d5": 5, "matern32_d10": 10}  # name -> d
DEFAULT_N_GENERATED = 40_000


def make_friedman1(n: int, rng=None, noise_std: float = 1.0, d: int = 10):
    """Friedman #1: x ~ U[0, 1]^d, y = 10 sin(pi x1 x2) + 20 (x3 - 0.5)^2 + 10 x4 + 5 x5 + noise_std * eps.

    ``rng``: a numpy Generator or seed. Returns (X [n, d], y [n]); x6..xd are irrelevant inputs (d >= 5; the
    classic set has d = 10, ``friedman1_d11`` has d = 11, the size of GP-GRIEF's electric set).
    """
    if d < 5:
        raise ValueError(f"Friedman #1 needs d >= 5 inputs, got d={d}.")
    rng = np.random.default_rng(rng)
    X = rng.uniform(size=(n, d))
    f = 10 * np.sin(np.pi * X[:, 0] * X[:, 1]) + 20 * (X[:, 2] - 0.5) ** 2 + 10 * X[:, 3] + 5 * X[:, 4]
    return X, f + noise_std * rng.standard_normal(n)


def make_gp_sample(n: int, rng=None, d: int = 2, lengthscale: float = 0.3, noise_std: float = 0.1,
                   n_features: int = 2000, chunk: int = 8192, nu: float | None = None):
    """A draw from a zero-mean GP with a unit-variance stationary kernel on x ~ U[0, 1]^d, plus Gaussian noise:
    the RBF k(x, x') = exp(-|x - x'|^2 / (2 l^2)) (``nu=None``) or the isotropic Matérn-nu of lengthscale l.

    The draw uses F = ``n_features`` random Fourier features, f(x) = sqrt(2 / F) sum_j w_j cos(omega_j.x + b_j)
    with b_j ~ U[0, 2 pi], w_j ~ N(0, 1) and omega_j from the kernel's spectral density: N(0, I / l^2) for the
    RBF, a multivariate t with 2 nu degrees of freedom for the Matérn (omega = g / l sqrt(2 nu / u), g ~ N(0, I),
    u ~ chi^2_{2 nu}); the covariance tends to k as F grows. Cost O(n F d), memory O(chunk F).
    Returns (X [n, d], y [n]).
    """
    rng = np.random.default_rng(rng)
    X = rng.uniform(size=(n, d))
    omega = spectral_frequencies(rng, d, n_features, lengthscale, nu)  # [d, F]
    b = rng.uniform(0, 2 * np.pi, n_features)  # [F]
    w = rng.standard_normal(n_features) * np.sqrt(2 / n_features)  # [F]
    f = np.concatenate([np.cos(X[i:i + chunk] @ omega + b) @ w for i in range(0, n, chunk)])
    return X, f + noise_std * rng.standard_normal(n)


def spectral_frequencies(rng: np.random.Generator, d: int, n: int, lengthscale: float,
                         nu: float | None = None) -> np.ndarray:
    """n draws [d, n] from the spectral density of the unit-variance RBF (``nu=None``) or Matérn-nu kernel of
    lengthscale l, so that mean_j cos(omega_j . r) -> k(r) (Bochner)."""
    omega = rng.standard_normal((d, n)) / lengthscale
    if nu is not None:
        omega *= np.sqrt(2 * nu / rng.chisquare(2 * nu, n))
    return omega


# The ODVFF paper's synthetic sets (Azzimonti et al., Section 5.1): an isotropic Matérn-3/2 draw, l = 0.1, unit
# variance, noise std 0.2 (the paper's text reads "variance 0.2", but only std 0.2 reaches its reported 1-D
# scores), in d = 1, 5 and 10 dimensions.
_MATERN_SAMPLES = {f"matern32_d{d}": partial(make_gp_sample, d=d, lengthscale=0.1, noise_std=0.2, nu=1.5)
                   for d in (1, 5, 10)}

GENERATORS = {"friedman1": make_friedman1, "friedman1_d11": partial(make_friedman1, d=11),
               "gp_sample": make_gp_sample, **_MATERN_SAMPLES}

"""Dense linear algebra with the numerics every method shares.

- :mod:`~gpscale.linalg.factor`: the Cholesky factorisation (:func:`cholesky`, with escalating jitter, a warning
  when it had to, and :class:`NotPSDError` with a remedy instead of NaN; :func:`cholesky_ex` for a caller that
  handles failures itself; :func:`cholesky_in_place` in the matrix's own memory);
- :mod:`~gpscale.linalg.solves`: solves and inverses against a factor, row-major, with backwards of their own;
- :mod:`~gpscale.linalg.products`: products that skip triangles of zeros and a backward's second product;
- :mod:`~gpscale.linalg.qr`: least squares through QR, streamed over row chunks (:class:`StreamingQR`);
- :mod:`~gpscale.linalg.cg`: iterative solves (:func:`conjugate_gradients`).
"""
from .cg import conjugate_gradients
from .factor import (CHOLESKY_PANEL, CORE, NotPSDError, NumericalWarning, cholesky, cholesky_ex, cholesky_in_place,
                     logdet_from_cholesky)
from .products import (gram, lower_transpose_product, squared_norms, transposed_times, tril_matmul, tril_outer,
                       weighted_sum)
from .qr import StreamingQR, qr_r
from .solves import (cho_solve, cho_solve_triangular, cholesky_inverse, gaussian_log_likelihood, inverse_cholesky,
                     lower_inverse, solve, solve_lower, solve_upper, whitened_solve)

__all__ = [
    "CORE",
    "NotPSDError",
    "NumericalWarning",
    "cholesky",
    "cholesky_ex",
    "cholesky_in_place",
    "CHOLESKY_PANEL",
    "solve",
    "solve_lower",
    "whitened_solve",
    "tril_outer",
    "tril_matmul",
    "lower_transpose_product",
    "weighted_sum",
    "squared_norms",
    "solve_upper",
    "cho_solve",
    "cho_solve_triangular",
    "cholesky_inverse",
    "logdet_from_cholesky",
    "inverse_cholesky",
    "lower_inverse",
    "gaussian_log_likelihood",
    "transposed_times",
    "gram",
    "qr_r",
    "StreamingQR",
    "conjugate_gradients",
]

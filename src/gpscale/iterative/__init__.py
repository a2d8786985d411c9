r"""Iterative exact-GP inference from matrix products alone (BBMM: Gardner et al., 2018; Wang et al., 2019) and the
LOVE predictive-variance cache (Pleiss et al., 2018).

The kernel matrix K [n, n] (symmetric positive semi-definite) is never formed. An operator (see
:class:`RowPartitioned`) gives products with it, its diagonal and some of its columns, each process holding the
rows ``[offset, offset + n_r)``. Every n-sized vector or matrix here is row-partitioned the same way ([n_r, t] on
each rank), and every inner product is summed over the ranks, so that one process and W processes give the same
numbers to round-off. The noisy matrix is ``Khat = K + sigma^2 I`` (``noise = sigma^2 > 0``).

- :mod:`~gpscale.iterative.operator`: the operator and the row-partitioned inner products;
- :mod:`~gpscale.iterative.preconditioner`: the pivoted Cholesky factor and the preconditioner ``P ~ Khat``;
- :mod:`~gpscale.iterative.mbcg`: batched preconditioned CG, and the Lanczos tridiagonals it recovers;
- :mod:`~gpscale.iterative.logdet`: ``log|Khat|`` by stochastic Lanczos quadrature, with the solve;
- :mod:`~gpscale.iterative.love`: the LOVE cache of predictive variances.

Nothing here is differentiated: everything runs without autograd, and the gradient is built by the caller from the
returned vectors. The small cores (k x k matrices, tridiagonals, the CG coefficients) are float64
(:data:`gpscale.linalg.CORE`); n-sized vectors stay in the operator's dtype, their inner products accumulated in
float64.
"""
from .logdet import SolveAndLogdet, lanczos_logdet, solve_and_logdet
from .love import LanczosVariance
from .mbcg import CGResult, cg
from .operator import RowPartitioned
from .preconditioner import Preconditioner, pivoted_cholesky

__all__ = [
    "CGResult",
    "LanczosVariance",
    "Preconditioner",
    "RowPartitioned",
    "SolveAndLogdet",
    "cg",
    "lanczos_logdet",
    "pivoted_cholesky",
    "solve_and_logdet",
]

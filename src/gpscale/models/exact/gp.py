"""The exact GP: the posterior over every training row, by one Cholesky factor while it fits in memory and by
preconditioned conjugate gradients beyond.

With K = k(X, X) [n, n] and Khat = K + sigma^2 I, the log evidence and the latent posterior at test rows X* are
(Rasmussen & Williams, Alg. 2.1)::

    log p(y) = -1/2 y^T Khat^{-1} y - 1/2 log|Khat| - n/2 log 2 pi
    E[f*]    = K_*X alpha,                      alpha = Khat^{-1} y
    Cov[f*]  = K_** - K_*X Khat^{-1} K_X*

Training maximises the evidence of a random ``evidence_rows`` of the rows (all of them when there are fewer): the
hyperparameters, a dozen numbers, are well determined by a few thousand rows, whose Cholesky costs seconds, while
the posterior uses every row, which is where the exact GP gains over the approximations. Two solvers:

- ``"cholesky"``: Khat = L L^T, formed in place (:func:`gpscale.linalg.cholesky_in_place`) in float64, so the
  memory is one n x n matrix: 8 n^2 bytes, checked before it is allocated (10 GB at 36,000 rows), and n^3 / 3
  multiply-adds. Variances come from v = L^{-1} K_X*, a chunk of test rows at a time.
- ``"iterative"``: the BBMM approach (Gardner et al., 2018; Wang et al., 2019). Khat is only multiplied by, a
  block of rows at a time, with its rows partitioned over the data-parallel processes
  (:class:`~gpscale.models.exact.blocked_kernel.BlockedKernel`); alpha comes from conjugate gradients preconditioned by
  a rank-``preconditioner_rank`` pivoted Cholesky factor of K plus sigma^2 I; the evidence's log-determinant from
  stochastic Lanczos quadrature over ``n_probes`` probe vectors solved in the same run, and its gradient from the
  same solves (``tr(Khat^{-1} dK) ~ mean_i (Khat^{-1} z_i)^T dK P^{-1} z_i`` for z_i ~ N(0, P)); predictive
  variances from a rank-``variance_rank`` Lanczos factor Khat^{-1} ~ R R^T (LOVE, Pleiss et al., 2018), or, with
  ``variance_rank=None``, from conjugate gradients per chunk of test rows (exact to ``cg_tolerance``, slower).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from ... import defaults
from ...defaults import CHOLESKY_MEMORY_FRACTION, FULL_BATCH_TRAINING
from ...device import to_device
from ...distributed import LOCAL, Comm, gather_rows, global_count, row_offset
from ...iterative import LanczosVariance, Preconditioner, cg, pivoted_cholesky, solve_and_logdet
from ...linalg import CORE, cho_solve_triangular, cholesky_in_place, gaussian_log_likelihood, solve_lower
from ...memory import available_bytes, check_fits, check_tensors_fit, gib, per_process_bytes
from ...shards import row_blocks
from .blocked_kernel import BLOCK_ELEMENTS, BlockedKernel
from ..base import BenchSize, GPModel, NotFittedPosteriorError, option_default, register

__all__ = ["ExactGP", "INFERENCES", "EVIDENCE_MATRICES", "cholesky_bytes"]

INFERENCES = ("auto", "cholesky", "iterative")
# n x n matrices at the peak of an evaluation of the evidence and its gradient by the Cholesky factor: K, K + s I,
# the identity, L, then Khat^{-1}, alpha alpha^T and dK in the backward pass
EVIDENCE_MATRICES = 7


def cholesky_bytes(n: int, matrices: int = 1) -> int:
    """The memory of ``matrices`` n x n float64 matrices: 1 for the posterior's factor, :data:`EVIDENCE_MATRICES`
    for a training evaluation of the evidence."""
    return 8 * matrices * n * n


@register("exact")
class ExactGP(GPModel):
    """Exact GP regression (see the module docstring for the equations and the two solvers).

    Args:
        evidence_rows: training maximises the exact evidence of this many rows, drawn at random by global row index
            (seeded by the training seed, the same rows on any number of processes); None, or n at most this: of
            every row. The posterior always uses every row.
        inference: ``"cholesky"``, ``"iterative"``, or ``"auto"``: the Cholesky factor while its 8 n^2 bytes take at
            most 80% of the free memory (each process forms it over all the rows: on the CPU the processes share the
            least free memory of any of them), else the iterative solver, whose rows the processes share. It
            decides for the posterior over all n rows and for the evidence of the ``evidence_rows`` training sees,
            separately.
        cg_tolerance: conjugate gradients stop when every column's residual is at most this times its right-hand
            side's norm.
        max_cg_iterations: and after at most this many iterations (a warning says the tolerance was not reached).
        preconditioner_rank: the rank of the pivoted-Cholesky preconditioner: O(n k) memory, O(n k^2) to build;
            a higher rank takes fewer iterations where the kernel's spectrum decays slowly (short lengthscales).
        n_probes: the probe vectors of the log-determinant's estimate and its gradient in iterative training; the
            estimate's standard error falls as 1 / sqrt(n_probes).
        variance_rank: the Lanczos steps of the iterative solver's variance cache (O(n k) memory); None: exact
            variances by conjugate gradients for every chunk of test rows.
    """

    full_batch = True
    posterior_options = ("inference", "cg_tolerance", "max_cg_iterations", "preconditioner_rank", "variance_rank")
    # the n x n factor (10 GB at 36,000 rows) and the CG preconditioner's factor are neither saved nor copied: they are
    # formed again from X when a variance first needs them
    rebuilt_cache = ("L", "P")
    # L-BFGS on the evidence, its step cap set by a budget of work (default_max_steps)
    default_training = FULL_BATCH_TRAINING
    floor_sizes = {"small": BenchSize(500, 8), "paper": BenchSize(2000, 8)}

    @classmethod
    def default_max_steps(cls, n: int, d: int, options: dict) -> int:
        """The budget of the evidence's work, :data:`~gpscale.defaults.EXACT_EVIDENCE_BUDGET` (the sum of m^3 over
        the L-BFGS evaluations of the evidence of m = min(evidence_rows, n) rows; every row's when ``evidence_rows``
        is None), in steps: 1.5e13 / m^3, at most the row's ``max_steps``. What the estimators give the exact GP,
        named or chosen, when given no ``max_steps``."""
        rows = options.get("evidence_rows", option_default(cls, "evidence_rows"))
        m = n if rows is None else min(int(rows), n)
        return max(1, min(cls.training_defaults().max_steps, int(defaults.EXACT_EVIDENCE_BUDGET // m**3)))

    def __init__(self, n_features: int, *, evidence_rows: int | None = 5000, inference: str = "auto",
                 cg_tolerance: float = 1e-6, max_cg_iterations: int = 1000, preconditioner_rank: int = 100,
                 n_probes: int = 16, variance_rank: int | None = 256, **kwargs):
        super().__init__(n_features, **kwargs)
        self.evidence_rows = evidence_rows
        self.inference = inference
        self.cg_tolerance = cg_tolerance
        self.max_cg_iterations = max_cg_iterations
        self.preconditioner_rank = preconditioner_rank
        self.n_probes = n_probes
        self.variance_rank = variance_rank
        self.check_posterior_options()
        self.register_buffer("evidence_seed", torch.tensor(0))

    def check_posterior_options(self) -> None:
        if self.inference not in INFERENCES:
            raise ValueError(f"inference must be one of {', '.join(map(repr, INFERENCES))}, got {self.inference!r}.")
        if self.evidence_rows is not None and int(self.evidence_rows) < 2:
            raise ValueError(f"evidence_rows must be at least 2, or None for every row; got {self.evidence_rows!r}.")

    def initialise_from_data(self, X: Tensor, y: Tensor, seed: int = 0) -> None:
        self.evidence_seed.fill_(seed)

    # --- the solver ----------------------------------------------------------------------------------------
    def solver(self, n: int, comm: Comm = LOCAL, matrices: int = 1) -> str:
        """``"cholesky"`` or ``"iterative"``: what ``inference`` means for n rows held by ``comm``'s processes, where
        the Cholesky path holds ``matrices`` n x n matrices (:func:`cholesky_bytes`)."""
        if self.inference != "auto":
            return self.inference
        # every process forms the factor of all the rows; every process must take the same decision
        fits = cholesky_bytes(n, matrices) <= CHOLESKY_MEMORY_FRACTION * per_process_bytes(self.device, comm)
        return "cholesky" if fits else "iterative"

    def Ky(self, X: Tensor) -> Tensor:
        """``K + sigma^2 I`` [n, n]."""
        K = self.kernel(X, X)
        return K + self.noise.to(K.dtype) * torch.eye(X.shape[0], dtype=K.dtype, device=K.device)

    # --- training ------------------------------------------------------------------------------------------
    def log_marginal_likelihood(self, X: Tensor, y: Tensor, comm: Comm = LOCAL) -> Tensor:
        """``log N(y | 0, K + sigma^2 I)`` of the rows (X, y) that ``comm``'s processes hold together: by the
        Cholesky factor (``-1/2 y^T alpha - sum log diag L - n/2 log 2 pi``, gathered on every process) or by the
        iterative solver (each process its rows), as :meth:`solver` says."""
        n = global_count(X.shape[0], comm)
        if self.solver(n, comm, EVIDENCE_MATRICES) == "cholesky":
            self._check_evidence_fits(n)
            X, y = comm.all_gather(X), comm.all_gather(y)
            return gaussian_log_likelihood(self.Ky(X), y, what="training covariance K + sigma^2 I")
        return self._iterative_log_marginal_likelihood(X, y, comm)

    def loss(self, X: Tensor, y: Tensor, num_data: int, comm: Comm = LOCAL, share: float = 1.0) -> Tensor:
        X, y = self.evidence_subset(X, y, num_data, comm)
        return -self.log_marginal_likelihood(X, y, comm) / global_count(X.shape[0], comm)

    def evidence_subset(self, X: Tensor, y: Tensor, num_data: int, comm: Comm = LOCAL) -> tuple[Tensor, Tensor]:
        """This process's rows of the ``evidence_rows`` that training sees, from its shard (X [n_r, d], y [n_r]) of
        ``num_data`` rows: a seeded draw of global row indices, in order, split among the processes in contiguous
        blocks; every row when there are at most ``evidence_rows``."""
        if self.evidence_rows is None or num_data <= self.evidence_rows:
            return X, y
        generator = torch.Generator().manual_seed(int(self.evidence_seed))
        rows = torch.randperm(num_data, generator=generator)[: int(self.evidence_rows)].sort().values
        if comm.world_size == 1:
            rows = rows.to(X.device)
            return X[rows], y[rows]
        bounds = row_blocks(rows.shape[0], comm.world_size)  # this process's block of the subset's rows
        X, y = gather_rows(X, y, rows, row_offset(X.shape[0], comm), comm)
        mine = slice(int(bounds[comm.rank]), int(bounds[comm.rank + 1]))
        return X[mine], y[mine]

    def _iterative_log_marginal_likelihood(self, X: Tensor, y: Tensor, comm: Comm) -> Tensor:
        """The evidence by BBMM: its value from one preconditioned CG run on [y, z_1 .. z_t] (alpha, and the
        Lanczos quadrature of log|Khat|); its gradient through the surrogate
        ``1/2 alpha^T Khat(theta) alpha - 1/2 mean_i w_i^T Khat(theta) q_i`` with w_i = Khat^{-1} z_i and
        q_i = P^{-1} z_i held constant, whose gradient is the evidence's (in expectation over the probes)."""
        op = BlockedKernel(self.kernel, X, comm)
        noise = self.noise
        run = solve_and_logdet(op, noise.detach(), y.detach().unsqueeze(-1), num_probes=self.n_probes,
                               generator=torch.Generator().manual_seed(int(self.evidence_seed)),
                               preconditioner=self._preconditioner(op), tol=self.cg_tolerance,
                               max_iterations=self.max_cg_iterations)
        value = -0.5 * run.inv_quad[0] - 0.5 * run.logdet - 0.5 * op.n_global * math.log(2 * math.pi)
        t = run.probe_solutions.shape[1]
        # [alpha, W / t] and [alpha, -Q]: both terms of the surrogate in one pass over K
        left = torch.cat([run.solution, run.probe_solutions / t], 1)
        right = torch.cat([run.solution, -run.probe_preconditioned], 1)
        quadratic = op.bilinear(left, right) + noise * (left * right).sum()
        surrogate = 0.5 * comm.all_reduce_sum(quadratic)
        return value.to(surrogate.dtype) + surrogate - surrogate.detach()

    def _preconditioner(self, op: BlockedKernel) -> Preconditioner:
        check_tensors_fit((op.n_local, self.preconditioner_rank), op.dtype, device=self.device,
                          what=f"The pivoted-Cholesky preconditioner of {op.n_local:,} rows",
                          advice="Use a smaller preconditioner_rank= (more conjugate-gradient iterations), or "
                                 "distributed=True, each process holding a share of the rows.")
        return Preconditioner.from_operator(op, self.noise.detach(), self.preconditioner_rank)

    def _cg_solve(self, op: BlockedKernel, B: Tensor) -> Tensor:
        """``Khat^{-1} B`` [n_r, c] by conjugate gradients preconditioned by :meth:`_preconditioner`."""
        return cg(op, self.noise.detach(), B.to(op.dtype), preconditioner=self._preconditioner(op),
                  tol=self.cg_tolerance, max_iterations=self.max_cg_iterations).solution

    # --- the posterior -------------------------------------------------------------------------------------
    @torch.no_grad()
    def fit_posterior(self, X: Tensor, y: Tensor, comm: Comm = LOCAL) -> None:
        self.check_posterior_options()
        n = global_count(X.shape[0], comm)
        if self.solver(n, comm) == "cholesky":
            X, y = comm.all_gather(X), comm.all_gather(y)
            L = self._factor(X)
            alpha = cho_solve_triangular(L, y.to(CORE).unsqueeze(-1)).squeeze(-1)
            self.cache = {"X": X.clone(), "alpha": alpha, "L": L}
            return
        self._check_variance_cache_fits(n)
        op = BlockedKernel(self.kernel, X, comm)
        alpha = self._cg_solve(op, y.unsqueeze(-1))[:, 0]
        self.cache = {"X": comm.all_gather(X).clone(), "alpha": comm.all_gather(alpha).to(CORE)}
        if self.variance_rank is not None:
            start = op.matmul(torch.ones(X.shape[0], 1, dtype=X.dtype, device=X.device))[:, 0]
            love = LanczosVariance(op, self.noise.detach(), start, self.variance_rank)
            self.cache["R"] = comm.all_gather(love.factor).to(CORE)

    def posterior_description(self) -> str:
        """How the posterior was computed, for ``summary()``."""
        if "alpha" not in self.cache:
            return ""
        n = self.cache["X"].shape[0]
        if "R" in self.cache:
            variances = f"variances from a rank-{self.cache['R'].shape[1]} Lanczos cache"
        elif "L" in self.cache or self.solver(n) == "cholesky":
            return f"posterior over {n:,} rows by a float64 Cholesky factor ({gib(cholesky_bytes(n))})"
        else:
            variances = "variances by conjugate gradients"
        return (f"posterior over {n:,} rows by conjugate gradients (tolerance {self.cg_tolerance:g}, pivoted-Cholesky "
                f"preconditioner of rank {self.preconditioner_rank}), {variances}")

    def _factor(self, X: Tensor) -> Tensor:
        """The lower Cholesky factor of K + sigma^2 I [n, n] over the rows X, formed in place in float64 after a
        check that it fits in memory."""
        n = X.shape[0]
        self._check_factor_fits(n)
        op = BlockedKernel(self.kernel, X)
        factor = torch.empty(n, n, dtype=CORE, device=X.device)
        noise = self.noise.detach().to(CORE)
        return cholesky_in_place(factor, lambda A: op.fill_lower(A, noise),
                                 what="training covariance K + sigma^2 I")

    def _check_factor_fits(self, n: int) -> None:
        """Raise :class:`~gpscale.memory.InsufficientMemoryError` where the posterior's factor of n rows does not
        fit in the free memory of the model's device."""
        check_fits(cholesky_bytes(n), what=f"The exact GP's Cholesky factor of {n:,} rows (8 n^2 bytes)",
                   device=self.device, fraction=1.0,
                   advice=f"Use inference='iterative' (memory O(n)), fewer rows (at most about "
                          f"{math.isqrt(int(available_bytes(self.device) * CHOLESKY_MEMORY_FRACTION) // 8):,} fit "
                          "now), or an approximation such as method='sgpr'.")

    def _check_evidence_fits(self, n: int) -> None:
        """Raise :class:`~gpscale.memory.InsufficientMemoryError` where the evidence of n rows and its gradient by a
        Cholesky factor do not fit in the free memory of the model's device."""
        check_fits(cholesky_bytes(n, EVIDENCE_MATRICES), device=self.device, fraction=1.0,
                   what=f"The exact evidence of {n:,} rows and its gradient by a Cholesky factor (about "
                        f"{EVIDENCE_MATRICES} n x n matrices)",
                   advice="Train on fewer rows (evidence_rows=...) or use inference='iterative'.")

    def _check_variance_cache_fits(self, n: int) -> None:
        """Raise :class:`~gpscale.memory.InsufficientMemoryError` where the iterative solver's Lanczos variance cache
        of n rows (this process's and the gathered one) does not fit in the free memory of the model's device."""
        if self.variance_rank is not None:
            check_tensors_fit((n, self.variance_rank), CORE, copies=2, device=self.device,
                              what=f"The Lanczos variance cache of {n:,} rows",
                              advice="Use a smaller variance_rank=, or variance_rank=None (exact variances by "
                                     "conjugate gradients, a chunk of test rows at a time).")

    def check_memory(self, n: int, comm: Comm = LOCAL) -> None:
        """Refuse, before training on n rows, a factor that would not fit: the Cholesky factors of the evidence of
        the rows training sees and of the posterior of all n (under ``inference="auto"`` the iterative solver takes
        over where they would not fit, so only ``"cholesky"`` refuses them), or the iterative posterior's variance
        cache."""
        rows = n if self.evidence_rows is None else min(n, int(self.evidence_rows))
        if self.solver(rows, comm, EVIDENCE_MATRICES) == "cholesky":
            self._check_evidence_fits(rows)
        if self.solver(n, comm) == "cholesky":
            self._check_factor_fits(n)
        else:
            self._check_variance_cache_fits(n)

    def rows_per_chunk(self) -> int:
        """Test rows per chunk: each is held against every training row (n x c numbers) at least once."""
        n = self.cache["X"].shape[0] if self.cache else 1
        return max(1, min(self.chunk_size, BLOCK_ELEMENTS // n))

    def _solve(self, B: Tensor) -> Tensor:
        """``Khat^{-1} B`` [n, c] for B [n, c]: by the Cholesky factor where :meth:`solver` says so (formed first if
        a loaded model has none yet), else by preconditioned conjugate gradients."""
        if "L" not in self.cache and self.solver(self.cache["X"].shape[0]) == "cholesky":
            self.cache["L"] = self._factor(self.cache["X"])
        if "L" in self.cache:
            return cho_solve_triangular(self.cache["L"], B.to(CORE))
        op = BlockedKernel(self.kernel, self.cache["X"])
        if "P" not in self.cache:  # the preconditioner's factor, formed once for every chunk of test rows
            self.cache["P"] = pivoted_cholesky(op, self.preconditioner_rank)
        P = Preconditioner(op, self.noise.detach(), self.cache["P"])
        return cg(op, self.noise.detach(), B.to(op.dtype), preconditioner=P, tol=self.cg_tolerance,
                  max_iterations=self.max_cg_iterations).solution.to(CORE)

    def _explained(self, Kxs: Tensor) -> Tensor:
        """``diag(K_*X Khat^{-1} K_X*)`` [c] for K_X* [n, c]: ``|L^{-1} K_X*|^2`` by the factor, ``|R^T K_X*|^2`` by the
        Lanczos cache, else ``K_X* . Khat^{-1} K_X*`` by conjugate gradients."""
        if "R" in self.cache:
            return (self.cache["R"].T @ Kxs).square().sum(0)
        if "L" in self.cache or self.solver(self.cache["X"].shape[0]) == "cholesky":
            if "L" not in self.cache:
                self.cache["L"] = self._factor(self.cache["X"])
            return solve_lower(self.cache["L"], Kxs).square().sum(0)
        return (Kxs * self._solve(Kxs)).sum(0)

    def predict_chunk(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """Mean ``K_*X alpha`` and variance ``k_** - diag(K_*X Khat^{-1} K_X*)`` (Alg. 2.1, lines 4-6)."""
        Kxs = self.kernel(self.cache["X"], X).to(CORE)  # [n, c]
        var = (self.prior_variance(X).to(CORE) - self._explained(Kxs)).clamp_min(0.0)  # the clamp: round-off only
        return (Kxs.T @ self.cache["alpha"]).to(X.dtype), var.to(X.dtype)

    @torch.no_grad()
    def predict_cov(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """Mean [n*] and covariance ``K_** - K_*X Khat^{-1} K_X*`` [n*, n*] at X [n*, d], a block of columns at a
        time: Z_j = Khat^{-1} K_X,j for a chunk j of the test rows, then the blocks ``K_*i,*j - K_*i,X Z_j`` for i
        >= j, each mirrored above the diagonal; the memory beside the result is O(n c), not O(n n*)."""
        if not self.cache:
            raise NotFittedPosteriorError("The exact model has no posterior yet: call fit_posterior(X, y) first.")
        self.check_joint_fits(X.shape[0], 1 if X.dtype == CORE else 2)  # the float64 result, and its copy in X's dtype
        X = to_device(X, self.device)
        train, chunks = self.cache["X"], X.split(self.rows_per_chunk())
        cov = torch.empty(X.shape[0], X.shape[0], dtype=CORE, device=X.device)
        means, start = [], 0
        for Xj in chunks:
            Kj = self.kernel(train, Xj).to(CORE)
            means.append(Kj.T @ self.cache["alpha"])
            Zj = self.cache["R"] @ (self.cache["R"].T @ Kj) if "R" in self.cache else self._solve(Kj)
            row = start
            for Xi in X[start:].split(self.rows_per_chunk()):
                block = self.kernel(Xi, Xj).to(CORE) - self.kernel(train, Xi).to(CORE).T @ Zj
                cov[row:row + Xi.shape[0], start:start + Xj.shape[0]] = block
                cov[start:start + Xj.shape[0], row:row + Xi.shape[0]] = block.T
                row += Xi.shape[0]
            start += Xj.shape[0]
        return torch.cat(means).to(X.dtype), cov.to(X.dtype)

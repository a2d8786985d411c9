"""BBMM-style iterative inference (gpscale.iterative) against dense float64 references: the pivoted Cholesky
factor, the Woodbury preconditioner, batched CG and the Lanczos tridiagonals it recovers, the stochastic Lanczos
log-determinant, the LOVE variance cache, and two gloo processes against one."""
import itertools
import math
import os
import socket
import time
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gpscale.distributed import LOCAL, TorchComm
from gpscale.iterative import (
    LanczosVariance,
    Preconditioner,
    cg,
    lanczos_logdet,
    pivoted_cholesky,
    solve_and_logdet,
)
from gpscale.linalg import NumericalWarning

pytestmark = pytest.mark.usefixtures("one_thread")

F64 = torch.float64
NOISE = 0.05


def rbf(n, seed=0, lengthscale=0.5, outputscale=1.3):
    """An RBF kernel matrix [n, n] on n uniform points of [-2, 2]^2 (float64) and the points."""
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 2, generator=g, dtype=F64) * 4 - 2
    return outputscale * torch.exp(-0.5 * torch.cdist(X, X) ** 2 / lengthscale**2), X


class DenseRows:
    """The row-partitioned operator of a dense K [n, n]: this rank holds rows [start, stop)."""

    def __init__(self, K, comm=LOCAL, rows=None):
        start, stop = rows if rows is not None else (0, K.shape[0])
        self.comm, self.rows = comm, K[start:stop]
        self.offset, self.n_local, self.n_global = start, stop - start, K.shape[0]
        self.dtype, self.device = K.dtype, K.device

    def matmul(self, V):
        return self.rows @ self.comm.all_gather(V)

    def diagonal(self):
        return self.rows.diagonal(offset=self.offset)

    def columns(self, index):
        return self.rows[:, index]


def khat(K, noise=NOISE):
    return K + noise * torch.eye(K.shape[0], dtype=K.dtype)


def greedy_pivoted_cholesky(K, k):
    """The textbook algorithm on the dense matrix: factor and pivots."""
    L, d, pivots = torch.zeros(K.shape[0], k, dtype=K.dtype), K.diagonal().clone(), []
    for m in range(k):
        p = int(torch.argmax(d))
        pivots.append(p)
        L[:, m] = (K[:, p] - L[:, :m] @ L[p, :m]) / d[p].sqrt()
        d = K.diagonal() - (L[:, :m + 1] ** 2).sum(1)
    return L, pivots


def relative(a, b):
    return float((a - b).norm() / b.norm())


# ------------------------------------------------------------------------------------------------ pivoted Cholesky


def test_pivoted_cholesky_of_full_rank_reproduces_K():
    K, _ = rbf(40)
    L = pivoted_cholesky(DenseRows(K), 40)
    assert (L @ L.T - K).abs().max() < 1e-10


def test_pivoted_cholesky_is_the_greedy_factor_with_a_falling_residual_trace():
    K, _ = rbf(60)
    L = pivoted_cholesky(DenseRows(K), 15, tol=0.0)
    reference, pivots = greedy_pivoted_cholesky(K, 15)
    assert L.shape == (60, 15)
    assert torch.allclose(L, reference, atol=1e-12)
    # each step takes the largest residual diagonal, and the residual trace falls with every column
    traces = [float(torch.trace(K - L[:, :m] @ L[:, :m].T)) for m in range(16)]
    assert all(a > b for a, b in itertools.pairwise(traces))
    for m, p in enumerate(pivots):
        residual = K.diagonal() - (L[:, :m] ** 2).sum(1)
        assert residual[p] == residual.max()
        assert (L[pivots[:m], m] == 0).all()  # triangular in pivot order


def test_pivoted_cholesky_stops_at_the_trace_tolerance():
    K, _ = rbf(60)
    L = pivoted_cholesky(DenseRows(K), 60, tol=1e-3)
    k = L.shape[1]
    assert 1 < k < 60
    assert torch.trace(K - L @ L.T) <= 1e-3 * torch.trace(K)
    assert torch.trace(K - L[:, :k - 1] @ L[:, :k - 1].T) > 1e-3 * torch.trace(K)


def test_pivoted_cholesky_breaks_ties_to_the_lowest_index():
    K = torch.eye(6, dtype=F64) * 2.0  # every diagonal equal at every step
    L = pivoted_cholesky(DenseRows(K), 3, tol=0.0)
    assert torch.equal(L.abs().argmax(0), torch.arange(3))


# ---------------------------------------------------------------------------------------------- preconditioner


@pytest.mark.parametrize("rank", [0, 8])
def test_preconditioner_solve_and_logdet_against_dense(rank):
    K, _ = rbf(50)
    precond = Preconditioner.from_operator(DenseRows(K), NOISE, rank)
    L = precond.factor
    P = L @ L.T + NOISE * torch.eye(50, dtype=F64)
    B = torch.randn(50, 3, dtype=F64)
    assert relative(precond.solve(B), torch.linalg.solve(P, B)) < 1e-10
    assert abs(float(precond.logdet()) - float(torch.logdet(P))) < 1e-9


def test_preconditioner_draws_are_L_e1_plus_sigma_e2_from_the_generator():
    K, _ = rbf(30)
    precond = Preconditioner.from_operator(DenseRows(K), NOISE, 5)
    Z = precond.sample(4, torch.Generator().manual_seed(7))
    g = torch.Generator().manual_seed(7)
    e1, e2 = torch.randn(5, 4, generator=g, dtype=F64), torch.randn(30, 4, generator=g, dtype=F64)
    assert torch.allclose(Z, precond.factor @ e1 + math.sqrt(NOISE) * e2, rtol=0, atol=1e-14)
    # a rank's rows of the draws are the same rows of the one-process draws
    split = Preconditioner(DenseRows(K, rows=(10, 30)), NOISE, precond.factor[10:])
    assert torch.equal(split.sample(4, torch.Generator().manual_seed(7)), Z[10:])


# ------------------------------------------------------------------------------------------------------- mBCG


@pytest.mark.parametrize("rank", [None, 10])
def test_cg_solves_a_batch_of_columns(rank):
    K, _ = rbf(80)
    op = DenseRows(K)
    precond = None if rank is None else Preconditioner.from_operator(op, NOISE, rank)
    B = torch.randn(80, 4, dtype=F64)
    result = cg(op, NOISE, B, preconditioner=precond, tol=1e-10)
    assert relative(result.solution, torch.linalg.solve(khat(K), B)) < 1e-8
    assert (result.residual <= 1e-10).all()
    true_residual = (B - khat(K) @ result.solution).norm(dim=0) / B.norm(dim=0)
    assert (true_residual < 1e-9).all()


def test_preconditioning_reduces_the_iterations():
    K, _ = rbf(120, lengthscale=1.0)  # a smooth kernel: a few pivots hold most of K
    op = DenseRows(K)
    B = torch.randn(120, 2, dtype=F64)
    plain = cg(op, NOISE, B, tol=1e-8).iterations
    preconditioned = cg(op, NOISE, B, preconditioner=Preconditioner.from_operator(op, NOISE, 20), tol=1e-8).iterations
    assert preconditioned < plain / 2


def test_a_converged_column_stays_frozen():
    K, _ = rbf(60)
    op = DenseRows(K)
    eigenvalues, eigenvectors = torch.linalg.eigh(khat(K))
    easy = eigenvectors[:, -1:]  # one CG step solves an eigenvector exactly
    B = torch.cat([torch.randn(60, 1, dtype=F64), easy, torch.zeros(60, 1, dtype=F64)], dim=1)
    result = cg(op, NOISE, B, tol=1e-10, lanczos=True)
    assert result.iterations > 5
    assert result.lanczos_steps.tolist() == [result.iterations, 1, 0]
    # the easy column is its one-step solution, untouched by the later steps; the zero column stays zero
    assert torch.allclose(result.solution[:, 1], easy[:, 0] / eigenvalues[-1], rtol=0, atol=1e-14)
    assert torch.equal(result.solution[:, 2], torch.zeros(60, dtype=F64))
    assert result.residual[2] == 0
    # their tridiagonals are [lambda] and nothing, padded with the decoupled identity
    T = result.tridiagonal
    assert abs(float(T[1, 0, 0]) - float(eigenvalues[-1])) < 1e-10
    assert torch.equal(T[1, 1:, 1:], torch.eye(result.iterations - 1, dtype=F64))
    assert torch.equal(T[1, 0, 1:], torch.zeros(result.iterations - 1, dtype=F64))
    assert torch.equal(T[2], torch.eye(result.iterations, dtype=F64))


def test_cg_warns_when_max_iterations_is_too_small():
    K, _ = rbf(60)
    B = torch.randn(60, 2, dtype=F64)
    with pytest.warns(NumericalWarning, match=r"after 3 iterations.*tol = 1.0e-10.*Raise max_iterations"):
        result = cg(DenseRows(K), NOISE, B, tol=1e-10, max_iterations=3)
    assert result.iterations == 3 and (result.residual > 1e-10).all()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cg(DenseRows(K), NOISE, B, tol=1e-10)


# -------------------------------------------------------------------------------------------- Lanczos and SLQ


def dense_quadrature(A, P, b, f):
    """``u^T f(P^{-1/2} A P^{-1/2}) u`` for u = P^{-1/2} b, by eigendecompositions."""
    values, vectors = torch.linalg.eigh(P)
    root_inverse = vectors @ torch.diag(values.rsqrt()) @ vectors.T
    values, vectors = torch.linalg.eigh(root_inverse @ A @ root_inverse)
    u = root_inverse @ b
    return float(u @ vectors @ torch.diag(f(values)) @ vectors.T @ u)


@pytest.mark.parametrize("rank", [None, 6])
def test_cg_tridiagonal_is_the_lanczos_matrix_of_the_preconditioned_system(rank):
    K, _ = rbf(70)
    op = DenseRows(K)
    precond = None if rank is None else Preconditioner.from_operator(op, NOISE, rank)
    P = torch.eye(70, dtype=F64)
    if precond is not None:
        P = precond.factor @ precond.factor.T + NOISE * P
    B = torch.randn(70, 3, dtype=F64)
    result = cg(op, NOISE, B, preconditioner=precond, tol=1e-11, lanczos=True)
    for c in range(3):
        m = int(result.lanczos_steps[c])
        T = result.tridiagonal[c]
        e1 = torch.zeros(T.shape[0], dtype=F64)
        e1[0] = 1.0
        # b^T Khat^{-1} b = (b^T P^{-1} b) e1^T T^{-1} e1, and the same for f = log (Gauss quadrature, converged)
        inverse_quad = float(result.rhs_norms[c] * torch.linalg.solve(T, e1)[0])
        assert abs(inverse_quad / float(B[:, c] @ torch.linalg.solve(khat(K), B[:, c])) - 1) < 1e-9
        values, vectors = torch.linalg.eigh(T[:m, :m])
        log_quad = float(result.rhs_norms[c] * (vectors[0] ** 2 * values.log()).sum())
        reference = dense_quadrature(khat(K), P, B[:, c], torch.log)
        assert abs(log_quad - reference) < 1e-6 * abs(reference) + 1e-8
        assert float(result.rhs_norms[c]) == pytest.approx(float(B[:, c] @ torch.linalg.solve(P, B[:, c])), rel=1e-10)


@pytest.mark.parametrize("rank", [None, 15])
def test_slq_logdet_is_close_to_the_dense_logdet(rank):
    K, _ = rbf(300, lengthscale=0.7)
    op = DenseRows(K)
    precond = None if rank is None else Preconditioner.from_operator(op, NOISE, rank)
    Y = torch.randn(300, 1, dtype=F64)
    out = solve_and_logdet(op, NOISE, Y, num_probes=30, generator=torch.Generator().manual_seed(3),
                           preconditioner=precond, tol=1e-8)
    exact = float(torch.logdet(khat(K)))
    assert abs(float(out.logdet) / exact - 1) < 0.03


def test_slq_logdet_with_the_exact_preconditioner_is_exact():
    K, _ = rbf(50)
    op = DenseRows(K)
    precond = Preconditioner.from_operator(op, NOISE, 50)
    Z = precond.sample(3, torch.Generator().manual_seed(0))
    result = cg(op, NOISE, Z, preconditioner=precond, tol=1e-10, lanczos=True)
    assert result.iterations <= 2  # P^{-1} Khat = I
    assert abs(float(lanczos_logdet(result, precond)) - float(torch.logdet(khat(K)))) < 1e-8


def test_solve_and_logdet_returns_the_gradient_vectors():
    K, _ = rbf(100)
    op = DenseRows(K)
    precond = Preconditioner.from_operator(op, NOISE, 12)
    P = precond.factor @ precond.factor.T + NOISE * torch.eye(100, dtype=F64)
    Y = torch.randn(100, 2, dtype=F64)
    out = solve_and_logdet(op, NOISE, Y, num_probes=200, generator=torch.Generator().manual_seed(1),
                           preconditioner=precond, tol=1e-10)
    assert relative(out.solution, torch.linalg.solve(khat(K), Y)) < 1e-8
    assert torch.allclose(out.inv_quad, (Y * torch.linalg.solve(khat(K), Y)).sum(0), rtol=1e-9)
    assert relative(out.probe_solutions, torch.linalg.solve(khat(K), out.probes)) < 1e-8
    assert relative(out.probe_preconditioned, torch.linalg.solve(P, out.probes)) < 1e-10
    assert torch.equal(out.probes, precond.sample(200, torch.Generator().manual_seed(1)))
    # the unbiased trace estimate tr(Khat^{-1} dK) ~ mean w^T dK q, for dK = K (the log outputscale's derivative)
    estimate = float((out.probe_solutions * (K @ out.probe_preconditioned)).sum(0).mean())
    assert estimate == pytest.approx(float(torch.trace(torch.linalg.solve(khat(K), K))), rel=0.05)


def test_a_float32_operator_keeps_its_vectors_float32_and_its_cores_float64():
    K, _ = rbf(100)
    op = DenseRows(K.float())
    precond = Preconditioner.from_operator(op, NOISE, 10)
    Y = torch.randn(100, 2)
    out = solve_and_logdet(op, NOISE, Y, num_probes=4, generator=torch.Generator().manual_seed(0),
                           preconditioner=precond, tol=1e-5)
    assert precond.factor.dtype == out.solution.dtype == out.probe_solutions.dtype == torch.float32
    assert out.cg.tridiagonal.dtype == out.logdet.dtype == out.inv_quad.dtype == F64
    assert relative(out.solution.double(), torch.linalg.solve(khat(K), Y.double())) < 1e-4
    cache = LanczosVariance(op, NOISE, Y[:, 0], 20)
    assert cache.factor.dtype == torch.float32 and cache.tridiagonal.dtype == F64


# ---------------------------------------------------------------------------------------- predictive variances


def test_lanczos_variance_of_full_rank_is_exact():
    K, _ = rbf(50)
    Kxs = torch.randn(50, 6, dtype=F64)
    cache = LanczosVariance(DenseRows(K), NOISE, torch.randn(50, dtype=F64), 50, tol=0.0)
    exact = (Kxs * torch.linalg.solve(khat(K), Kxs)).sum(0)
    assert cache.rank == 50
    assert torch.allclose(cache.explained(Kxs), exact, rtol=1e-8, atol=0)
    R = cache.factor
    assert relative(R @ R.T, torch.linalg.inv(khat(K))) < 1e-8


def test_lanczos_variance_errors_fall_with_the_rank():
    K, X = rbf(150, lengthscale=0.7)
    g = torch.Generator().manual_seed(5)
    Xs = torch.rand(10, 2, generator=g, dtype=F64) * 4 - 2
    Kxs = 1.3 * torch.exp(-0.5 * torch.cdist(X, Xs) ** 2 / 0.7**2)
    y = torch.randn(150, dtype=F64, generator=g)
    exact = (Kxs * torch.linalg.solve(khat(K), Kxs)).sum(0)
    errors = []
    for k in (5, 10, 20, 40):
        explained = LanczosVariance(DenseRows(K), NOISE, y, k).explained(Kxs)
        assert (explained <= exact + 1e-10).all()  # the variance is never underestimated
        errors.append(float((exact - explained).max()))
    assert all(a > b for a, b in itertools.pairwise(errors))
    assert errors[-1] < 0.05 * errors[0]


def test_lanczos_variance_stops_on_an_invariant_subspace():
    K, _ = rbf(40)
    _, eigenvectors = torch.linalg.eigh(khat(K))
    start = eigenvectors[:, -2:].sum(1)  # spans a 2-dimensional invariant subspace
    cache = LanczosVariance(DenseRows(K), NOISE, start, 10)
    assert cache.rank == 2
    Kxs = eigenvectors[:, -2:] @ torch.tensor([[1.0, 0.5], [-2.0, 0.3]], dtype=F64)
    assert torch.allclose(cache.explained(Kxs), (Kxs * torch.linalg.solve(khat(K), Kxs)).sum(0), rtol=1e-9)


# --------------------------------------------------------------------------------------------- two processes

WORLD, N_SPLIT, SPLIT = 2, 61, 31  # rows [0, 31) and [31, 61)
# CG amplifies the round-off of sums taken in another order by about the condition number (with 0.05, the probes'
# solutions of the two runs differed by 3e-10 relative): a larger noise keeps the comparison at 1e-10 meaningful
SPLIT_NOISE = 0.3


def split_problem():
    K, _ = rbf(N_SPLIT, seed=4)
    Y = torch.randn(N_SPLIT, 2, dtype=F64, generator=torch.Generator().manual_seed(9))
    return K, Y


def iterative_pipeline(op, Y):
    """Everything that reduces across ranks: the pivoted Cholesky factor, one mBCG run with probes and the SLQ
    log-determinant, and a LOVE cache."""
    precond = Preconditioner.from_operator(op, SPLIT_NOISE, 12)
    out = solve_and_logdet(op, SPLIT_NOISE, Y, num_probes=4, generator=torch.Generator().manual_seed(2),
                           preconditioner=precond, tol=1e-10)
    cache = LanczosVariance(op, SPLIT_NOISE, Y[:, 0], 15)
    return {"factor": precond.factor, "solution": out.solution, "probe_solutions": out.probe_solutions,
            "logdet": out.logdet, "inv_quad": out.inv_quad, "iterations": out.cg.iterations,
            "explained": cache.explained(Y)}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _split_worker(rank, port, folder):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        K, Y = split_problem()
        rows = (0, SPLIT) if rank == 0 else (SPLIT, N_SPLIT)
        op = DenseRows(K, TorchComm(), rows)
        torch.save(iterative_pipeline(op, Y[rows[0]:rows[1]]), f"{folder}/rank{rank}.pt")
    except BaseException:
        dist.destroy_process_group()
        raise
    # leave at once after the last collective: a gloo thread releasing tensors during interpreter shutdown can
    # abort the process (see gpscale.distributed.leave_job)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


def test_two_processes_give_the_one_process_numbers(tmp_path):
    context = mp.start_processes(_split_worker, args=(_free_port(), str(tmp_path)), nprocs=WORLD, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + 300  # no timing assumption: only a deadlock should reach this
    while not context.join(timeout=max(0.0, deadline - time.monotonic())):
        if time.monotonic() >= deadline:
            for process in context.processes:
                process.kill()
            pytest.fail("the two-process run did not finish in 300 s (a collective deadlocked?)")
    parts = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(WORLD)]
    K, Y = split_problem()
    one = iterative_pipeline(DenseRows(K), Y)
    assert torch.allclose(torch.cat([part["factor"] for part in parts]), one["factor"], rtol=0, atol=1e-12)
    for name in ("solution", "probe_solutions"):
        assert relative(torch.cat([part[name] for part in parts]), one[name]) < 1e-10, name
    assert relative(one["solution"], torch.linalg.solve(khat(K, SPLIT_NOISE), Y)) < 1e-8
    for part in parts:
        assert part["iterations"] == one["iterations"]
        for name in ("logdet", "inv_quad", "explained"):
            assert torch.allclose(part[name], one[name], rtol=1e-10, atol=1e-10), name

"""The exact GP over every row: the in-place Cholesky path and the iterative (BBMM) path against dense formulas and
each other; the evidence subset; chunked joint covariances; a model file without its factor; the memory check."""
import copy
import math

import numpy as np
import pytest
import torch

from gpscale import GPRegressor
from gpscale.linalg import NotPSDError, NumericalWarning, cholesky_in_place
from gpscale.memory import InsufficientMemoryError, available_bytes, check_fits
from gpscale.models.exact import blocked_kernel as _blocked_kernel
from gpscale.models.exact import gp as exact_module
from gpscale.models.exact.blocked_kernel import BlockedKernel
from gpscale.models.exact.gp import ExactGP

from conftest import toy_regression

pytestmark = pytest.mark.usefixtures("one_thread")
DT = torch.float64


def model(**options) -> ExactGP:
    torch.manual_seed(0)
    m = ExactGP(2, **options).to(DT)
    with torch.no_grad():  # hyperparameters away from the defaults, so a formula that drops one shows
        m.kernel.raw_lengthscale.copy_(torch.tensor([0.3, -0.2], dtype=DT))
        m.kernel.raw_outputscale.fill_(0.4)
        m.likelihood.raw_noise.fill_(-3.0)
    return m


def dense_posterior(m: ExactGP, X, y, Xs):
    Khat = m.kernel(X, X) + m.noise * torch.eye(X.shape[0], dtype=DT)
    Ks = m.kernel(X, Xs)
    mean = Ks.T @ torch.linalg.solve(Khat, y)
    cov = m.kernel(Xs, Xs) - Ks.T @ torch.linalg.solve(Khat, Ks)
    return mean, cov


@pytest.fixture(scope="module")
def data():
    X, y = toy_regression(n=300, d=2, seed=1)
    Xs, _ = toy_regression(n=40, d=2, seed=2)
    return X, y, Xs


# --- the factor formed in place ------------------------------------------------------------------------------
@pytest.mark.parametrize("n, block", [(211, 50), (211, 211), (200, 50), (1, 8)])
def test_the_factor_formed_in_place_is_the_cholesky_factor_and_leaves_the_upper_triangle(n, block):
    """Blocks of 50 of 211 columns leave a short last panel; of 50 of 200, none; one block is LAPACK's factor."""
    X, _ = toy_regression(n=n, d=3)
    K = torch.exp(-torch.cdist(X, X) ** 2) + 1e-3 * torch.eye(n, dtype=DT)
    A = torch.full((n, n), math.nan, dtype=DT)
    L = cholesky_in_place(A, lambda M: M.copy_(K.tril()), block=block)
    assert L.data_ptr() == A.data_ptr()
    torch.testing.assert_close(L.tril(), torch.linalg.cholesky(K), rtol=0, atol=1e-12)
    assert not L.triu(1).any()  # the upper triangle as fill left it: never written


def test_the_factor_in_place_adds_jitter_after_refilling_and_names_a_nan():
    ones = torch.ones(5, 5, dtype=DT)  # rank one: PD only with jitter
    fills = []
    with pytest.warns(NumericalWarning, match="added jitter of 1.0e-08"):
        L = cholesky_in_place(torch.empty(5, 5, dtype=DT), lambda M: fills.append(1) or M.copy_(ones)).tril()
    torch.testing.assert_close(L @ L.T, ones + 1e-8 * torch.eye(5, dtype=DT))
    assert len(fills) == 2  # once, then again after the failed try overwrote it
    nan = ones.clone()
    nan[3, 1] = math.nan
    with pytest.raises(NotPSDError, match="NaN/inf"):
        cholesky_in_place(torch.empty(5, 5, dtype=DT), lambda M: M.copy_(nan))


# --- the kernel matrix in blocks ----------------------------------------------------------------------------
def test_the_blocked_kernel_multiplies_fills_and_differentiates_as_the_dense_matrix(data, monkeypatch):
    X, _, _ = data
    m = model()
    monkeypatch.setattr(_blocked_kernel, "BLOCK_ELEMENTS", 7 * 300)  # blocks of 7 rows: 43 blocks
    op = BlockedKernel(m.kernel, X, block_elements=7 * 300)
    assert op.rows_per_block == 7
    K = m.kernel(X, X).detach()
    V = torch.randn(300, 3, dtype=DT)
    torch.testing.assert_close(op.matmul(V), K @ V)
    torch.testing.assert_close(op.diagonal(), K.diagonal())
    torch.testing.assert_close(op.columns(torch.tensor([5, 0, 299])), K[:, [5, 0, 299]])
    A = torch.zeros(300, 300, dtype=DT)
    op.fill_lower(A, 0.25)
    torch.testing.assert_close(A.tril(), (K + 0.25 * torch.eye(300, dtype=DT)).tril())
    assert not A.triu(7).any()  # above each block of 7 rows' last column: never computed
    left, right = torch.randn(300, 2, dtype=DT), torch.randn(300, 2, dtype=DT)
    value = op.bilinear(left, right)
    value.backward()
    blocked = [p.grad.clone() for p in m.kernel.parameters()]
    m.zero_grad()
    dense = (left * (m.kernel(X, X) @ right)).sum()
    dense.backward()
    torch.testing.assert_close(value, dense.detach())
    for ours, ref in zip(blocked, (p.grad for p in m.kernel.parameters())):
        torch.testing.assert_close(ours, ref)


# --- the posterior ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("inference, variance_rank", [("cholesky", 256), ("iterative", None), ("iterative", 300)])
def test_the_posterior_equals_the_dense_formulas(data, inference, variance_rank):
    """The Cholesky path and the iterative one (CG to 1e-10; variances by CG, or by a Lanczos cache of full rank,
    exact then) give Alg. 2.1's mean, variances and joint covariance."""
    X, y, Xs = data
    m = model(inference=inference, cg_tolerance=1e-10, variance_rank=variance_rank)
    m.fit_posterior(X, y)
    assert ("L" in m.cache) == (inference == "cholesky") and ("R" in m.cache) == (variance_rank == 300)
    mean, cov = dense_posterior(m, X, y, Xs)
    with torch.no_grad():
        ours_mean, ours_var = m.predict(Xs)
        joint_mean, joint_cov = m.predict_cov(Xs)
    torch.testing.assert_close(ours_mean, mean.detach(), rtol=1e-8, atol=1e-9)
    torch.testing.assert_close(ours_var, cov.diagonal().detach(), rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(joint_mean, mean.detach(), rtol=1e-8, atol=1e-9)
    torch.testing.assert_close(joint_cov, cov.detach(), rtol=1e-7, atol=1e-9)


def test_the_joint_covariance_is_assembled_from_chunks_of_test_rows(data, monkeypatch):
    X, y, Xs = data
    m = model()
    m.fit_posterior(X, y)
    whole = m.predict_cov(Xs)[1]
    monkeypatch.setattr(exact_module, "BLOCK_ELEMENTS", 300 * 7)  # 7 test rows a chunk: 6 chunks of 40
    assert m.rows_per_chunk() == 7
    torch.testing.assert_close(m.predict_cov(Xs)[1], whole, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(m.predict(Xs)[1], whole.diagonal(), rtol=1e-10, atol=1e-12)


def test_a_low_rank_lanczos_cache_underestimates_what_the_data_explain_less_as_its_rank_grows(data):
    X, y, Xs = data
    exact = model()
    exact.fit_posterior(X, y)
    errors = []
    for rank in (10, 40, 120):
        m = model(inference="iterative", cg_tolerance=1e-10, variance_rank=rank)
        m.fit_posterior(X, y)
        with torch.no_grad():
            gap = m.predict(Xs)[1] - exact.predict(Xs)[1]
        assert (gap >= -1e-10).all()  # |R^T k|^2 <= k^T Khat^{-1} k: the cache's variance is never too small
        errors.append(gap.max().item())
    assert errors[0] > errors[1] > errors[2]


# --- the evidence ---------------------------------------------------------------------------------------------
def test_the_iterative_evidence_and_its_gradient_estimate_the_exact_ones(data):
    """BBMM's value (SLQ with 64 probes) and its stochastic gradient against the Cholesky evidence's: the value
    to 1e-3 per row, the gradient of every hyperparameter within a few percent of its scale."""
    X, y, _ = data
    grads, values = [], []
    for inference in ("cholesky", "iterative"):
        m = model(inference=inference, n_probes=64, cg_tolerance=1e-8)
        loss = m.loss(X, y, X.shape[0])
        loss.backward()
        values.append(loss.item())
        grads.append(torch.cat([p.grad.reshape(-1) for p in m.parameters()]))
    assert abs(values[0] - values[1]) < 1e-3
    assert torch.allclose(grads[0], grads[1], rtol=0.1, atol=0.05 * grads[0].abs().max().item())


def test_training_sees_a_seeded_subset_of_evidence_rows_and_the_posterior_every_row(data):
    X, y, _ = data
    m = model(evidence_rows=120)
    Xe, ye = m.evidence_subset(X, y, X.shape[0])
    assert Xe.shape == (120, 2)
    rows = [int(torch.nonzero((X == x).all(1))[0]) for x in Xe]
    assert rows == sorted(rows) and torch.equal(ye, y[rows])
    torch.testing.assert_close(m.loss(X, y, 300), -m.log_marginal_likelihood(Xe, ye) / 120)
    m.initialise_from_data(X, y, seed=1)
    assert not torch.equal(m.evidence_subset(X, y, 300)[0], Xe)  # the seed draws other rows
    assert model(evidence_rows=None).evidence_subset(X, y, 300)[0] is X
    m.fit_posterior(X, y)
    assert m.cache["X"].shape[0] == 300


# --- the estimator: save, load, memory ----------------------------------------------------------------------
def test_a_model_file_holds_no_factor_and_the_loaded_model_forms_it_again(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, (250, 3))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.standard_normal(250)
    reg = GPRegressor(method="exact", max_steps=5, progress=False).fit(X, y)
    reg.save(tmp_path / "m.gps")
    assert "L" not in reg.model_.get_extra_state()
    back = GPRegressor.load(tmp_path / "m.gps")
    assert "L" not in back.model_.cache
    np.testing.assert_array_equal(back.predict(X[:30]), reg.predict(X[:30]))  # the mean needs alpha only
    for ours, ref in zip(back.predict(X[:30], return_std=True), reg.predict(X[:30], return_std=True)):
        np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-14)
    assert "L" in back.model_.cache


def test_a_factor_that_does_not_fit_is_refused_before_it_is_allocated(monkeypatch):
    monkeypatch.setattr(exact_module, "available_bytes", lambda device: 100_000)
    monkeypatch.setattr("gpscale.memory.available_bytes", lambda device: 100_000)
    X, y = toy_regression(n=200)
    m = model(inference="cholesky")
    with pytest.raises(InsufficientMemoryError, match=r"Cholesky factor of 200 rows .* inference='iterative'"):
        m.fit_posterior(X, y)
    with pytest.raises(InsufficientMemoryError,
                       match=r"exact evidence of 200 rows .* Train on fewer rows \(evidence_rows="):
        m.loss(X, y, 200)
    # "auto": the iterative solver when the factor does not fit, with ranks whose n x k matrices fit in the 100 kB
    auto = model(preconditioner_rank=20, variance_rank=20)
    assert auto.solver(200) == "iterative"
    auto.fit_posterior(X, y)
    assert "R" in auto.cache and "L" not in auto.cache
    assert torch.isfinite(auto.loss(X, y, 200))  # BBMM's evidence, in O(n) memory


def test_free_memory_is_read_from_the_system_and_checked():
    assert 0 < available_bytes("cpu") < 2**62
    check_fits(1024, what="a small matrix", advice="")
    with pytest.raises(InsufficientMemoryError, match=r"a huge matrix needs .* GiB, but cpu memory has .* Do less\."):
        check_fits(2**62, what="a huge matrix", advice="Do less.")


def test_options_with_no_meaning_are_refused():
    with pytest.raises(ValueError, match="inference must be one of 'auto', 'cholesky', 'iterative'"):
        ExactGP(2, inference="lanczos")
    with pytest.raises(ValueError, match="evidence_rows must be at least 2"):
        ExactGP(2, evidence_rows=1)


@pytest.mark.slow
def test_the_iterative_path_agrees_with_the_cholesky_path_on_5000_rows():
    """The issue's check at n = 5,000 (Friedman #1, d = 10, hyperparameters from 1,000 rows): the iterative
    posterior's mean and CG variances within 1e-4 relative of the Cholesky ones (CG to 1e-10), and its evidence
    within 1e-3 per row."""
    from gpscale.data import load_dataset
    from gpscale.train import fit

    ds = load_dataset("friedman1", n=5_600)
    X, y = torch.tensor(ds.X_train[:5000]), torch.tensor(ds.y_train[:5000])
    Xs = torch.tensor(ds.X_test[:500])
    chol = ExactGP(10, evidence_rows=1000, inference="cholesky").to(DT)
    fit(chol, X, y, progress=False)
    it = ExactGP(10, evidence_rows=1000, inference="iterative", cg_tolerance=1e-10, variance_rank=None).to(DT)
    it.load_state_dict(chol.state_dict())
    it.fit_posterior(X, y)
    (m1, v1), (m2, v2) = chol.predict(Xs), it.predict(Xs)
    torch.testing.assert_close(m2, m1, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(v2, v1, rtol=1e-4, atol=0)
    with torch.no_grad():
        e1 = chol.log_marginal_likelihood(X, y)
        e2 = it.log_marginal_likelihood(X, y)
    assert abs(e1 - e2).item() / 5000 < 1e-3


def test_a_refit_posterior_forms_a_new_factor_without_copying_the_old(monkeypatch):
    rng = np.random.default_rng(1)
    X = rng.uniform(-2, 2, (200, 2))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.standard_normal(200)
    reg = GPRegressor(method="exact", max_steps=5, progress=False).fit(X, y)
    old, copied, deepcopy = reg.model_.cache["L"], [], copy.deepcopy

    def watching(value, memo=None):
        if isinstance(value, ExactGP):
            copied.append("L" in value.cache)
        return deepcopy(value, memo)

    monkeypatch.setattr(copy, "deepcopy", watching)
    reg.refit_posterior(X, y)
    assert copied == [False] and reg.model_.cache["L"].data_ptr() != old.data_ptr()
    torch.testing.assert_close(reg.model_.cache["L"].tril(), old.tril())

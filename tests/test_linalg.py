import pytest
import torch

from gpscale import linalg
from gpscale.linalg import products
from gpscale.linalg.factor import CHOLESKY_PADDING
from gpscale.linalg import (NotPSDError, NumericalWarning, StreamingQR, cholesky, cholesky_inverse, gram,
                            inverse_cholesky, lower_inverse, lower_transpose_product, qr_r, solve_lower,
                            squared_norms, transposed_times, tril_matmul, tril_outer, weighted_sum, whitened_solve)


def spd(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(n, n, generator=g, dtype=torch.float64)
    return A @ A.T + n * torch.eye(n, dtype=torch.float64)


def test_cholesky_of_spd_matrix_needs_no_jitter(recwarn):
    A = spd(20)
    L = cholesky(A)
    torch.testing.assert_close(L @ L.T, A)
    assert not [w for w in recwarn if issubclass(w.category, NumericalWarning)]


def test_cholesky_escalates_jitter_with_a_warning():
    v = torch.randn(30, 3, dtype=torch.float64)
    A = v @ v.T  # rank 3: singular, but PSD
    with pytest.warns(NumericalWarning, match="added jitter"):
        L = cholesky(A)
    assert torch.allclose(L @ L.T, A, atol=1e-5 * A.diagonal().mean())


def test_cholesky_raises_actionable_error_when_jitter_cannot_help():
    A = -spd(5)
    with pytest.raises(NotPSDError, match="float64|noise"):
        cholesky(A, max_tries=3)


@pytest.mark.parametrize("i, j, value", [(2, 1, float("nan")), (3, 3, float("nan")), (3, 0, float("inf")),
                                          (2, 2, float("inf"))])
def test_cholesky_rejects_nan_and_inf_in_the_triangle_it_reads(i, j, value):
    A = spd(4)
    A[i, j] = value
    with pytest.raises(NotPSDError, match="NaN"):
        cholesky(A)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", [(128, 128), (192, 192), (256, 256)])
def test_cholesky_at_an_order_lapack_aliases_is_lapacks_factor_info_layout_and_gradient(shape, dtype):
    """An order that is a multiple of 64 is factored padded with an identity block (LAPACK's own runs at a third of
    the speed there): the same factor to round-off, in LAPACK's column-major layout, the same info for a failure
    anywhere, and the same gradient."""
    m = shape[-1]
    X = torch.randn(*shape[:-1], 2 * m, generator=torch.Generator().manual_seed(m), dtype=torch.float64)
    A = (X @ X.mT / m + 0.1 * torch.eye(m, dtype=torch.float64)).to(dtype)
    expected, expected_info = torch.linalg.cholesky_ex(A)
    L, info = linalg.cholesky_ex(A)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(L, expected, rtol=tol, atol=tol)
    assert torch.equal(info, expected_info) and L.stride() == expected.stride()
    for j in (0, m // 2, m - 1):  # a leading minor of order j + 1 that is not positive definite
        B = A.clone()
        B[..., j, j] = -1.0
        assert torch.equal(linalg.cholesky_ex(B)[1], torch.linalg.cholesky_ex(B)[1])
    G = torch.randn(shape, generator=torch.Generator().manual_seed(1), dtype=dtype)
    grads = []
    for factor in (lambda a: torch.linalg.cholesky_ex(a)[0], lambda a: linalg.cholesky_ex(a)[0]):
        leaf = A.clone().requires_grad_(True)
        (factor(leaf) * G).sum().backward()
        grads.append(leaf.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=100 * tol, atol=100 * tol)


def test_cholesky_pads_only_the_orders_lapack_aliases(monkeypatch):
    orders = []
    factor = torch.linalg.cholesky_ex
    monkeypatch.setattr(torch.linalg, "cholesky_ex", lambda A: orders.append(A.shape[-1]) or factor(A))
    for m in (60, 64, 100, 128, 1, 192):
        cholesky(spd(m))
    cholesky(spd(128).expand(3, 128, 128))  # a batch: LAPACK's own, padded it took longer
    assert orders == [60, 64, 100, 128 + CHOLESKY_PADDING, 1, 192 + CHOLESKY_PADDING, 128]


def test_cholesky_rejects_nan_at_an_order_it_pads():
    A = spd(128)
    A[100, 50] = float("nan")
    with pytest.raises(NotPSDError, match="NaN"):
        cholesky(A)


def test_streaming_qr_equals_one_shot_qr():
    A = torch.randn(1000, 12, dtype=torch.float64)
    R = StreamingQR.of_chunks(A.split(97))
    torch.testing.assert_close(R, qr_r(A), rtol=1e-10, atol=1e-10)
    assert (R.diagonal() > 0).all()


def test_streaming_qr_with_chunks_smaller_than_width():
    A = torch.randn(50, 8, dtype=torch.float64)
    torch.testing.assert_close(StreamingQR.of_chunks(A.split(3)), qr_r(A), rtol=1e-10, atol=1e-10)


def test_gaussian_log_likelihood_value_and_closed_form_gradient():
    from torch.distributions import MultivariateNormal

    from gpscale.linalg import gaussian_log_likelihood

    K = spd(6, seed=2).requires_grad_()
    y = torch.randn(6, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(gaussian_log_likelihood(K, y),
                               MultivariateNormal(torch.zeros(6, dtype=torch.float64), K).log_prob(y))
    # symmetric perturbations only: K lives on the symmetric matrices
    assert torch.autograd.gradcheck(lambda A, b: gaussian_log_likelihood((A + A.T) / 2, b), (K, y))


@pytest.mark.parametrize("shape", [(), (3,)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_transposed_times_is_a_transpose_times_b_and_differentiable(shape, dtype):
    g = torch.Generator().manual_seed(5)
    A = torch.randn(*shape, 40, 7, generator=g, dtype=dtype, requires_grad=True)
    B = torch.randn(*shape, 40, 3, generator=g, dtype=dtype, requires_grad=True)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-13, atol=1e-13)
    ours, theirs = transposed_times(A, B), A.transpose(-2, -1) @ B
    assert ours.shape == (*shape, 7, 3)
    torch.testing.assert_close(ours, theirs, **tol)
    G = torch.randn(*shape, 7, 3, generator=g, dtype=dtype)
    for got, want in zip(torch.autograd.grad(ours, [A, B], G), torch.autograd.grad(theirs, [A, B], G)):
        torch.testing.assert_close(got, want, **tol)


def test_gram_equals_the_product_and_its_gradient_is_autograds():
    g = torch.Generator().manual_seed(0)
    M = torch.randn(7, 4, generator=g, dtype=torch.float64, requires_grad=True)
    G = torch.randn(4, 4, generator=g, dtype=torch.float64)  # not symmetric: the backward must use G + G^T
    ours = torch.autograd.grad((gram(M) * G).sum(), M)[0]
    reference = torch.autograd.grad(((M.T @ M) * G).sum(), M)[0]
    torch.testing.assert_close(gram(M), M.T @ M)
    torch.testing.assert_close(ours, reference)
    assert torch.autograd.gradcheck(gram, (M,))


@pytest.mark.parametrize("L_batch, B_batch", [((), ()), ((3,), (3,)), ((3,), ()), ((), (2,))])
def test_solve_lower_is_the_solve_and_it_and_its_gradient_come_back_row_major(L_batch, B_batch):
    g = torch.Generator().manual_seed(1)
    L = torch.linalg.cholesky(spd(9).expand(*L_batch, 9, 9)).requires_grad_(True)
    B = torch.randn(*B_batch, 9, 5, generator=g, dtype=torch.float64, requires_grad=True)
    W = torch.randn(*torch.broadcast_shapes(L_batch, B_batch), 9, 5, generator=g, dtype=torch.float64)
    X = solve_lower(L, B)
    torch.testing.assert_close(L @ X, B.expand_as(X))
    ours = torch.autograd.grad((X * W).sum(), [L, B])
    reference = torch.autograd.grad((torch.linalg.solve_triangular(L, B, upper=False) * W).sum(), [L, B])
    for a, b in zip(ours, reference):
        torch.testing.assert_close(a, b)
    # element-wise work that mixes layouts runs at a twentieth of its speed: the result and dB are row-major
    assert X.is_contiguous() and ours[1].is_contiguous()
    assert cholesky_inverse(L.detach()).is_contiguous()


def _factor_and_whiten(dtype, batch, through_factorisation, m=9, c=13):
    """A = L^{-1} K for L = chol(Kuu), with a loss of A, and the gradients of K and Kuu: autograd through torch's
    factorisation and solve, or :func:`whitened_solve` from a factor without a graph."""
    g = torch.Generator().manual_seed(2)
    X = torch.randn(*batch, m, 2 * m, generator=g, dtype=torch.float64)
    Kuu = (X @ X.mT / m + 0.1 * torch.eye(m, dtype=torch.float64)).requires_grad_(True)
    K = torch.randn(*batch, m, c, generator=g, dtype=dtype, requires_grad=True)
    W = torch.randn(*batch, m, c, generator=g, dtype=dtype)
    if through_factorisation:
        A = torch.linalg.solve_triangular(torch.linalg.cholesky(Kuu).to(dtype), K, upper=False)
    else:
        A = whitened_solve(K, torch.linalg.cholesky(Kuu.detach()), Kuu)
    loss = (A * W).sum() + (A**2).sum()
    return (A, *torch.autograd.grad(loss, [K, Kuu]))


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize("batch", [(), (3,)])
def test_whitened_solve_has_the_gradients_of_the_factorisation_and_the_solve(dtype, tolerance, batch):
    ours = _factor_and_whiten(dtype, batch, through_factorisation=False)
    reference = _factor_and_whiten(dtype, batch, through_factorisation=True)
    for name, a, b in zip(("A", "dK", "dKuu"), ours, reference):
        torch.testing.assert_close(a, b, rtol=tolerance, atol=tolerance * b.abs().max().item(), msg=name)
    assert ours[2].dtype == torch.float64 and ours[0].is_contiguous()


@pytest.mark.parametrize("m", [7, 300, 512])  # one block, uneven blocks, four blocks of 128
@pytest.mark.parametrize("S_batch, A_batch", [((), ()), ((3,), (3,)), ((2, 3), (2, 1))])
def test_triangular_products_skip_the_zero_triangle_and_equal_the_dense_ones(m, S_batch, A_batch):
    g = torch.Generator().manual_seed(m)
    S = torch.randn(*S_batch, m, m, generator=g, dtype=torch.float64).tril().requires_grad_(True)
    A = torch.randn(*A_batch, m, 9, generator=g, dtype=torch.float64, requires_grad=True)
    W = torch.randn(*torch.broadcast_shapes(S_batch, A_batch), m, 9, generator=g, dtype=torch.float64)
    ours = lower_transpose_product(S, A)
    reference = S.mT @ A
    torch.testing.assert_close(ours, reference)
    for a, b in zip(torch.autograd.grad((ours * W).sum(), [S, A]),
                    torch.autograd.grad((reference * W).sum(), [S, A])):
        torch.testing.assert_close(a.tril(), b.tril())  # S's upper triangle is not a parameter
    torch.testing.assert_close(tril_outer(A.detach(), W), torch.tril(A.detach() @ W.mT))
    torch.testing.assert_close(tril_matmul(S.detach(), W), S.detach() @ W)


@pytest.mark.parametrize("batch", [(), (3,), (2, 3)])  # the variational mean, HVGP's blocks, blocks and classes
def test_weighted_sum_and_its_backward_are_the_sum_s_w_s_K_s(batch):
    """Against the einsum in value, and its own backward (a broadcast multiply for dL/dK, g K^T for dL/dw) against
    finite differences in both inputs and each alone."""
    g = torch.Generator().manual_seed(len(batch))
    w = torch.randn(*batch, 4, generator=g, dtype=torch.float64, requires_grad=True)
    K = torch.randn(*batch, 4, 5, generator=g, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(weighted_sum(w, K), torch.einsum("...s,...sn->...n", w, K))
    assert torch.autograd.gradcheck(weighted_sum, (w, K))
    assert torch.autograd.gradcheck(lambda K: weighted_sum(w.detach(), K), (K,))
    assert torch.autograd.gradcheck(lambda w: weighted_sum(w, K.detach()), (w,))

    M = K.detach().mT.contiguous().requires_grad_()  # a sum over a matrix's last axis: K a transposed view
    torch.testing.assert_close(weighted_sum(w, M.mT), torch.einsum("...s,...ns->...n", w, M))
    assert torch.autograd.gradcheck(lambda w, M: weighted_sum(w, M.mT), (w, M))
    weighted_sum(w.detach(), M.mT).sum().backward()
    assert M.grad.is_contiguous()  # the gradient comes back in M's own layout


@pytest.mark.parametrize("shape, dim", [((7, 3), -1), ((2, 5, 3), -1), ((2, 5, 3), 2), ((2, 5, 3), -2), ((4, 3), 0),
                                        ((2, 5, 3), 1), ((2, 3, 4, 5), -3), ((5,), 0), ((3, 0), -1), ((0, 3), -1)])
def test_squared_norms_and_their_backward_are_the_sums_of_squares_along_an_axis(shape, dim, monkeypatch):
    """In blocks of 2 rows along the last axis (so that several blocks and a short last one are summed): the value
    is (M * M).sum(dim) and the backward 2 g M, checked by finite differences."""
    monkeypatch.setattr(products, "_NORM_ROWS", 2)
    M = torch.randn(*shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(squared_norms(M, dim), (M * M).sum(dim), rtol=1e-14, atol=0)
    assert torch.autograd.gradcheck(lambda M: squared_norms(M, dim), (M,))


@pytest.mark.parametrize("m, block", [(1, 4), (5, 4), (37, 4), (300, 128)])
def test_lower_inverse_by_halves_is_the_inverse(m, block):
    g = torch.Generator().manual_seed(m)
    L = torch.tril(torch.randn(m, m, generator=g, dtype=torch.float64)) + 3 * torch.eye(m, dtype=torch.float64)
    inverse = lower_inverse(L, block)
    assert torch.equal(inverse, torch.tril(inverse))
    torch.testing.assert_close(inverse, torch.linalg.solve_triangular(L, torch.eye(m, dtype=torch.float64),
                                                                      upper=False), rtol=1e-10, atol=1e-12)


def test_lower_inverse_is_batched():
    g = torch.Generator().manual_seed(0)
    L = torch.tril(torch.randn(3, 40, 40, generator=g, dtype=torch.float64)) + 3 * torch.eye(40, dtype=torch.float64)
    inverse = lower_inverse(L, block=8)
    for i in range(3):
        torch.testing.assert_close(inverse[i], lower_inverse(L[i], block=8), rtol=0, atol=1e-13)


@pytest.mark.parametrize("m", [7, 300])
def test_inverse_cholesky_is_the_lower_factor_of_the_inverse(m):
    g = torch.Generator().manual_seed(4)
    A = torch.randn(m, m, generator=g, dtype=torch.float64)
    P = A @ A.T + 0.5 * torch.eye(m, dtype=torch.float64)
    L = inverse_cholesky(P)
    assert torch.equal(L, torch.tril(L)) and bool((L.diagonal() > 0).all())
    torch.testing.assert_close(L @ L.T, torch.linalg.inv(P))
    with pytest.raises(NotPSDError):
        inverse_cholesky(-P)

"""Stationary kernels: RBF and Matérn 1/2, 3/2, 5/2 with an outputscale and a shared or ARD lengthscale.

Notation: ``k(x, x') = s^2 g(r)``, ``r = ||(x - x') / l||`` with lengthscale(s) ``l`` and outputscale ``s^2``.
Positive hyperparameters are stored unconstrained and mapped through softplus.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable
from torch.nn.functional import softplus

from ..linalg import transposed_times, weighted_sum

__all__ = ["Kernel", "Stationary", "RBF", "Matern", "Periodic", "Sum", "inverse_softplus", "median_distance",
           "SOFTPLUS_ZERO", "underflow_cutoff", "weighted_grams"]

# The starting value of every positive hyperparameter (lengthscales, outputscale, noise): softplus(0) = ln 2, as
# in GPyTorch. Measured on pol (SGPR, m=512, 50 Adam steps at lr 0.1): starting the noise at 0.1 instead ends in
# a worse optimum (test RMSE 0.202 vs 0.145) because the noise first has to grow through a region where the
# kernel explains little.
SOFTPLUS_ZERO = math.log(2.0)


def inverse_softplus(x: Tensor | float) -> Tensor:
    """The unconstrained value whose softplus is ``x`` (> 0)."""
    x = torch.as_tensor(x, dtype=torch.get_default_dtype() if not torch.is_tensor(x) else x.dtype)
    return x + torch.log(-torch.expm1(-x))


def median_distance(X: Tensor, max_rows: int = 1000, seed: int = 0) -> float:
    """The median of the pairwise distances between the rows of X [n, d] (the median heuristic for a lengthscale),
    from a seeded random subset of at most ``max_rows`` rows: O(max_rows^2 d)."""
    if len(X) > max_rows:
        X = X[torch.randperm(len(X), generator=torch.Generator().manual_seed(seed))[:max_rows].to(X.device)]
    D = torch.cdist(X, X)
    return D[torch.triu_indices(len(X), len(X), offset=1, device=X.device).unbind()].median().item()


class Kernel(nn.Module):
    """A covariance function. Subclasses implement ``forward(X1, X2) -> K [n1, n2]`` and ``diag(X) -> [n]``, and
    gpscale's own kernels ``config()``: their constructor's arguments, from which a saved model rebuilds them
    (:func:`gpscale.kernels.kernel_spec`)."""

    #: whether ``forward`` also takes inputs with a leading batch axis, X1 [B, n1, d] and X2 [B, n2, d] -> [B, n1, n2]
    #: (a subclass of a kernel that does, whose ``forward`` does not, sets it False)
    takes_batches: bool = False

    def config(self) -> dict | None:
        """The constructor arguments (JSON values; nested kernels as kernels) that rebuild this kernel's structure,
        its values then coming from ``state_dict``; None for a kernel gpscale cannot rebuild."""
        return None

    def forward(self, X1: Tensor, X2: Tensor) -> Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def diag(self, X: Tensor) -> Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def matvec(self, X1: Tensor, X2: Tensor, v: Tensor) -> Tensor:
        """``K(X1, X2) v`` [n1] in v's dtype; a kernel with structure (:class:`AdditiveMatern`) may take it without
        forming K."""
        return self(X1, X2).to(v.dtype) @ v

    def weighted_self_grams(self, A: Tensor, weights: Tensor) -> Tensor:
        """``sum_pq W_pq k(a_ip, a_iq)`` [c] for each of c point sets A [c, r, d], with a symmetric W [r, r] (the
        variance of a weighted sum of f over each set): one Gram matrix per set here; :class:`Stationary` forms
        them all in one call, with a backward of its own."""
        return torch.stack([(self(a, a) * weights).sum() for a in A])

    def weighted_grams(self, A: Tensor, B: Tensor, weights: Tensor) -> Tensor:
        """``sum_s W[t, s] k(a_tsi, b_j)`` [T, m, c] for T groups of S point sets A [T, S, m, d], points B [c, d] and
        weights W [T, S] (HVGP's sub-kernels against a batch, from the orbits of each block's inducing points): one
        kernel matrix and a weighted sum here (:func:`weighted_grams`); :class:`Stationary` takes them in one call,
        with a backward of its own."""
        return weighted_grams(self, A, B, weights)


def weighted_grams(kernel, A: Tensor, B: Tensor, weights: Tensor) -> Tensor:
    """:meth:`Kernel.weighted_grams` for any callable ``kernel(X1, X2) -> K``: K [T S m, c] and its weighted sum over
    s, laid out [T, S, m c] so that the sum reads K's own memory."""
    T, S, m, d = A.shape
    K = kernel(A.reshape(T * S * m, d), B)
    return weighted_sum(weights, K.view(T, S, m * B.shape[0])).view(T, m, B.shape[0])


class Stationary(Kernel):
    """Shared machinery of kernels that depend on the scaled distance ``r`` only.

    Args:
        n_features: input dimension d.
        ard: one lengthscale per dimension (True) or one shared (False).
        lengthscale: initial lengthscale(s).
        outputscale: initial outputscale s^2.
    """

    takes_batches = True
    #: whether :meth:`weighted_slope` reads the kernel matrix K (else only the state :meth:`gram` returns with it)
    slope_reads_gram: bool = True

    def __init__(self, n_features: int, ard: bool = True, lengthscale: float = SOFTPLUS_ZERO,
                 outputscale: float = SOFTPLUS_ZERO):
        super().__init__()
        self.n_features = int(n_features)
        self.ard = bool(ard)
        n_ls = self.n_features if self.ard else 1
        self.raw_lengthscale = nn.Parameter(inverse_softplus(torch.full((n_ls,), float(lengthscale))))
        self.raw_outputscale = nn.Parameter(inverse_softplus(torch.tensor(float(outputscale))))

    @property
    def lengthscale(self) -> Tensor:
        """[d] if ARD else [1]."""
        return softplus(self.raw_lengthscale)

    def config(self) -> dict:
        return {"n_features": self.n_features, "ard": self.ard}

    def extra_repr(self) -> str:
        return f"lengthscale={_values(self.lengthscale)}, outputscale={_values(self.outputscale)}"

    @property
    def outputscale(self) -> Tensor:
        return softplus(self.raw_outputscale)

    def scaled_sq_dist(self, X1: Tensor, X2: Tensor) -> Tensor:
        """``||(x - x')/l||^2`` [n1, n2], by the Gram expansion (one matmul), clamped at 0 against round-off."""
        ls = self.lengthscale.to(X1.dtype)
        A = X1 / ls
        return _sq_dist(A, A if X2 is X1 else X2 / ls)

    def gram(self, A: Tensor, B: Tensor, outputscale: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:  # pragma: no cover
        """``K = s^2 g(||a - b||^2)`` [..., n1, n2] for scaled inputs A [..., n1, d] and B [..., n2, d], a tensor of
        its own formed in as few passes over n1 x n2 memory as the profile allows (these passes, not the distances'
        product, are most of the time of the large kernel matrices), and what :meth:`weighted_slope` needs. It works
        in place, for the forward pass of a custom autograd Function: call it with autograd off."""
        raise NotImplementedError

    def weighted_slope(self, grad: Tensor, K: Tensor,
                       state: tuple[Tensor, ...]) -> tuple[Tensor, float]:  # pragma: no cover - interface
        """``(H, c)`` with ``c H = grad * s^2 dg / d(||a - b||^2)``: H a new tensor, formed in as few passes as the
        profile allows, and the number c applied later to the [n, d] results instead of the [n1, n2] matrix. K is
        :meth:`gram`'s output, ``s^2 g``, and state what it returned beside K."""
        raise NotImplementedError

    def forward(self, X1: Tensor, X2: Tensor) -> Tensor:
        """K [..., n1, n2] for X1 [..., n1, d] and X2 [..., n2, d] (leading batch axes alike, or none)."""
        ls = self.lengthscale.to(X1.dtype)
        A = X1 / ls
        return _StationaryGram.apply(A, A if X2 is X1 else X2 / ls, self.outputscale.to(X1.dtype), self)

    def weighted_self_grams(self, A: Tensor, weights: Tensor) -> Tensor:
        ls = self.lengthscale.to(A.dtype)
        return _WeightedSelfGrams.apply(A / ls, weights, self.outputscale.to(A.dtype), self)

    def weighted_grams(self, A: Tensor, B: Tensor, weights: Tensor) -> Tensor:
        if weights.requires_grad:  # the closed form below has no gradient for the weights
            return super().weighted_grams(A, B, weights)
        ls = self.lengthscale.to(B.dtype)
        return _WeightedGrams.apply(A / ls, B / ls, weights.to(B.dtype), self.outputscale.to(B.dtype), self)

    def diag(self, X: Tensor) -> Tensor:
        return self.outputscale.to(X.dtype).expand(X.shape[0]).clone()


def underflow_cutoff(dtype: torch.dtype) -> float:
    """The exponent ``c`` at which a kernel's ``exp`` is held: ``e^c = tiny^(1/3)`` (2.3e-13 in float32, 2.8e-103 in
    float64), so that a product of two kernel values, or of one with a number above tiny^(2/3), is a normal number.

    Numbers below ``tiny`` (subnormals) and the exponentials that produce them are slow on x86 processors: on an
    Intel Xeon (torch 2.13, two threads, a million float32 numbers) ``exp`` took 7 to 19 ms below -87.3, where its
    result leaves the normal range, against 0.2 ms above, and a product with a subnormal result 2.4 ms against
    0.26 ms. A kernel matrix of far-apart points (pol's 26 features at the start lengthscale) is mostly such
    numbers, and every pass over it, its gradient and the products formed from it paid that: SVGP's epoch on pol
    took 3.8 s where it now takes 0.32 s. Held at sqrt(tiny) instead of tiny^(1/3), the products of two kernel
    values were still subnormal, and a step on pol took 80 ms against 54 ms with the processor flushing them to 0.
    Held, an entry is off by at most ``s^2 e^c`` times the Matérn polynomial at the held distance (7e-11 s^2 for
    Matérn-5/2 in float32), far below the dtype's resolution of s^2 (eps 1.2e-7), and k(x, x) is s^2 as before.
    The held entries are flat in the inputs, but the closed-form backward still gives each a slope of its held
    value times the scaled difference, where the exact slope is 0."""
    return math.log(torch.finfo(dtype).tiny) / 3


def _sq_dist(A: Tensor, B: Tensor, scale: float = 1.0, bound: float | None = None) -> Tensor:
    """``scale ||a - b||^2`` [..., n1, n2] for rows of A [..., n1, d] and B [..., n2, d] (no batch axis, or one): one
    product of the rows augmented by two columns each,

        [a, scale |a|^2, scale] . [-2 scale b, 1, |b|^2] = scale (|a|^2 - 2 a.b + |b|^2),

    so that the product writes the n1 x n2 buffer once and a kernel's scale of the distance costs no pass of its own.
    Where the product took -2 a.b and both norms were joined in passes of their own (an ``addmm`` onto the row norms
    broadcast, then the column norms added in place), [2,048, 1,024] distances of 26 features took 1.3 to 1.5 ms and
    now take 1.1 to 1.2 (float32, two threads, an Intel Xeon; one thread 2.4 -> 1.45 ms; 2,000 points of 8 features
    against themselves 2.0 -> 1.1 ms), equal to the bit in those tests; tiny ones ([256, 128]) take 10 us longer
    (the augmented rows are four more operators). Clamped at 0 against round-off, which can leave a squared
    distance below 0 (so that the kernel's value there is its value at distance 0), and at ``bound`` (where a
    kernel's value is held, :func:`underflow_cutoff`) on the other side, in the same pass. Where B is A (points
    against themselves) the diagonal is 0 exactly: the expanded form leaves about eps |a|^2 there, whose root
    (Matérn's distance) is some 1e-8 |a|: Matérn-1/2's k(a, a) missed s^2 by up to 5e-7 relative in float64."""
    norms_A = (A * A).sum(-1, keepdim=True)
    norms_B = norms_A if B is A else (B * B).sum(-1, keepdim=True)
    rows = torch.cat([A, norms_A * scale, torch.full_like(norms_A, scale)], -1)
    columns = torch.cat([B * (-2.0 * scale), torch.ones_like(norms_B), norms_B], -1)
    sq = rows @ columns.transpose(-2, -1)
    if B is A:
        sq.diagonal(dim1=-2, dim2=-1).zero_()
    return sq.clamp_(0.0, bound) if scale > 0 else sq.clamp_(bound, 0.0)


def _distance_gradient(H: Tensor, X: Tensor, Y: Tensor, weights: Tensor | None = None,
                       transposed: bool = False) -> Tensor:
    """``sum_j H_ij w_j (x_i - y_j)`` [..., n1, d], half the gradient of ``sum_ij H_ij w_j ||x_i - y_j||^2`` with
    respect to X [..., n1, d], for Y [..., n2, d], H [..., n1, n2] (with ``transposed``, H is given as its transpose
    [..., n2, n1]) and weights w [..., n2, 1] on Y's points (all 1 when None): ``rowsum(H w) X - H (w Y)`` from one
    product of H with ``[w Y, w]``, whose last column is the weighted row sums. A row sum of its own read the
    n1 x n2 matrix once more, and so did a product of H with the weights alone: for HVGP's [2,048, 1,024] float32
    blocks, 0.25 to 0.3 ms each under a dispatch mode, where the product's extra column costs about nothing (it
    reads H once either way)."""
    augmented = torch.cat([Y, torch.ones_like(Y[..., :1])], -1)
    if weights is not None:
        augmented.mul_(weights)
    product = transposed_times(H, augmented) if transposed else H @ augmented
    return product[..., -1:] * X - product[..., :-1]


class _StationaryGram(torch.autograd.Function):
    """``s^2 g(||a - b||^2)`` [..., n1, n2] for scaled inputs A [..., n1, d], B [..., n2, d], with the backward in
    closed form.

    With ``G = dL/dK * s^2 g'`` = c H (the kernel's :meth:`~Stationary.weighted_slope`), the Gram expansion gives
    ``dL/dA = 2 c (rowsum(H) A - H B)`` and ``dL/dB = 2 c (colsum(H) B - H^T A)``, and ``dL/ds^2 = <dL/dK, K> / s^2``.
    Autograd through the expression instead keeps every n1 x n2 intermediate (distance, root, exponential,
    polynomial) and takes a pass over each on the way back: for the kernel matrices that dominate an HVGP or SVGP
    step (a batch against every inducing point of every orbit), element-wise work is most of the time. Here the
    output K is saved in place of g (g = K / s^2), the scalars c and s^2 are applied to [n, d] results, and the
    backward reads n1 x n2 matrices only to form H and <dL/dK, K>, besides the two products (whose extra column
    gives H's row and column sums, :func:`_distance_gradient`).
    """

    @staticmethod
    def forward(ctx, A: Tensor, B: Tensor, outputscale: Tensor, kernel: Stationary) -> Tensor:
        K, state = kernel.gram(A, B, outputscale)
        ctx.kernel = kernel
        ctx.save_for_backward(A, B, outputscale, K, *state)
        return K

    @staticmethod
    @once_differentiable  # the saved K and state are not differentiable functions of A and B
    def backward(ctx, grad: Tensor):
        A, B, outputscale, K, *state = ctx.saved_tensors
        need_A, need_B, need_scale, _ = ctx.needs_input_grad
        dA = dB = dscale = None
        if need_scale:
            dscale = torch.tensordot(grad, K, dims=K.dim()) / outputscale
        if need_A or need_B:
            H, c = ctx.kernel.weighted_slope(grad, K, tuple(state))
            if need_A:
                dA = _distance_gradient(H, A, B).mul_(2.0 * c)
            if need_B:
                dB = _distance_gradient(H, B, A, transposed=True).mul_(2.0 * c)
        return dA, dB, dscale, None


class _WeightedSelfGrams(torch.autograd.Function):
    """``v_i = sum_pq W_pq s^2 g(||a_ip - a_iq||^2)`` [c] for scaled inputs A [c, r, d] and a symmetric W [r, r],
    with the backward in closed form.

    Both arguments of each Gram matrix are the same points, and with W symmetric so is H (as
    :class:`_StationaryGram`'s, here with dL/dK_i = dL/dv_i W), so the gradients through the two arguments are equal
    and ``dL/dA = 4 c (rowsum(H) A - H A)``: one product a set where the Gram matrix's own backward takes two, and
    no [c, r, r] gradient formed from the weighted sum's backward first. ``dL/dW = sum_i dL/dv_i K_i`` and
    ``dL/ds^2 = sum_i dL/dv_i v_i / s^2``.
    """

    @staticmethod
    def forward(ctx, A: Tensor, weights: Tensor, outputscale: Tensor, kernel: Stationary) -> Tensor:
        K, state = kernel.gram(A, A, outputscale)
        values = K.flatten(-2) @ weights.reshape(-1)
        ctx.kernel = kernel
        ctx.save_for_backward(A, weights, outputscale, K, values, *state)
        return values

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        A, weights, outputscale, K, values, *state = ctx.saved_tensors
        need_A, need_weights, need_scale, _ = ctx.needs_input_grad
        dA = dweights = dscale = None
        if need_scale:
            dscale = (grad @ values) / outputscale
        if need_weights:
            dweights = torch.mv(K.flatten(-2).T, grad).view_as(weights)  # not a product of inner dimension c
        if need_A:
            H, c = ctx.kernel.weighted_slope(weights * grad[:, None, None], K, tuple(state))
            dA = _distance_gradient(H, A, A).mul_(4.0 * c)
        return dA, dweights, dscale, None


class _WeightedGrams(torch.autograd.Function):
    """``V_t = sum_s W[t, s] K_ts`` [T, m, c], ``K_ts = s^2 g(||a_tsi - b_j||^2)``, for scaled inputs A [T, S, m, d],
    B [c, d] and constant weights W [T, S], with the backward in closed form.

    dL/dK_ts is ``W[t, s] dL/dV_t``: with H_ts formed from dL/dV_t broadcast over s (as :class:`_StationaryGram`'s
    H, one pass over the [T, S, m, c] matrices, none to form dL/dK), the weights scale the rows of A's results and
    of A: ``dL/dA_ts = 2 c W[t, s] (rowsum(H_ts) A_ts - H_ts B)``, ``dL/dB = 2 c sum_ts (colsum(W[t, s] H_ts) B -
    H_ts^T W[t, s] A_ts)``, and ``dL/ds^2 = <dL/dV, V> / s^2``, a pass over the [T, m, c] output instead of the
    kernel matrices. Only what the kernel's slope reads is kept for the backward (Matérn's, not the kernel matrix).
    For HVGP's step at the floor protocol's paper size (1,024 rows, eight blocks of 256 points, orbits of eight) the
    sum's backward formed dL/dK in a [8, 262,144] pass per block and <dL/dK, K> read the kernel matrices again.
    """

    @staticmethod
    def forward(ctx, A: Tensor, B: Tensor, weights: Tensor, outputscale: Tensor, kernel: Stationary) -> Tensor:
        T, S, m, d = A.shape
        rows = A.reshape(T * S * m, d)
        K, state = kernel.gram(rows, B, outputscale)
        V = (weights.unsqueeze(-2) @ K.view(T, S, m * B.shape[0])).view(T, m, B.shape[0])
        ctx.kernel, ctx.shape = kernel, (T, S, m, B.shape[0], d)
        ctx.save_for_backward(rows, B, weights, outputscale, V, K if kernel.slope_reads_gram else None, *state)
        return V

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        rows, B, weights, outputscale, V, K, *state = ctx.saved_tensors
        need_A, need_B, _, need_scale, _ = ctx.needs_input_grad
        T, S, m, c, d = ctx.shape
        grad = grad.contiguous()  # H takes grad's layout, and is viewed [T S m, c] below (a transposed V's is not)
        dA = dB = dscale = None
        if need_scale:
            dscale = torch.tensordot(grad, V, dims=3) / outputscale
        if need_A or need_B:
            by_set = (lambda t: None if t is None else t.view(T, S, m, c))
            H, scale = ctx.kernel.weighted_slope(grad.unsqueeze(1), by_set(K), tuple(map(by_set, state)))
            H = H.view(T * S * m, c)
            row_weights = weights.unsqueeze(-1).expand(T, S, m).reshape(T * S * m, 1)  # W[t, s] on A_ts's rows
            if need_A:
                dA = _distance_gradient(H, rows, B).mul_(row_weights * (2.0 * scale)).view(T, S, m, d)
            if need_B:
                dB = _distance_gradient(H, B, rows, row_weights, transposed=True).mul_(2.0 * scale)
        return dA, dB, None, dscale, None


class RBF(Stationary):
    """Squared exponential: ``g = exp(-r^2 / 2)``, ``dg / d(r^2) = -g / 2``."""

    def gram(self, A, B, outputscale):
        """``s^2 exp(-r^2 / 2)``, the distance's scale -1/2 taken in the product's buffer, its exponent held at
        :func:`underflow_cutoff` in the same pass."""
        return _sq_dist(A, B, scale=-0.5, bound=underflow_cutoff(A.dtype)).exp_().mul_(outputscale), ()

    def weighted_slope(self, grad, K, state):
        """``s^2 dg / d(r^2) = -K / 2``."""
        return grad * K, -0.5


class Matern(Stationary):
    """Matérn with smoothness ``nu`` in {1/2, 3/2, 5/2}; ``z = sqrt(2 nu) r``:

    - nu = 1/2: ``g = exp(-z)``
    - nu = 3/2: ``g = (1 + z) exp(-z)``
    - nu = 5/2: ``g = (1 + z + z^2 / 3) exp(-z)``
    """

    slope_reads_gram = False

    def __init__(self, n_features: int, nu: float = 2.5, **kwargs):
        if nu not in (0.5, 1.5, 2.5):
            raise ValueError(f"Matern nu must be 0.5, 1.5 or 2.5, got {nu}.")
        super().__init__(n_features, **kwargs)
        self.nu = float(nu)

    def config(self) -> dict:
        return {**super().config(), "nu": self.nu}

    def extra_repr(self) -> str:
        return f"nu={self.nu}, {super().extra_repr()}"

    def gram(self, A, B, outputscale):
        """From ``z`` (the distances of inputs scaled by sqrt(2 nu), then their root) and ``s^2 exp(-z)``, with the
        polynomial in two fused multiply-adds: eight passes over n1 x n2 memory after the product for nu = 5/2,
        where the distance's scale, the polynomial one term at a time and the outputscale last took twelve. The
        outputscale is a product, not a term of the exponent (``exp(log s^2 - z)``, a pass shorter), so that the
        kernel at distance 0 is s^2 exactly, as ``diag`` gives it: off by an ulp there, the float32 posterior of a
        deep convolutional model (the contract tests') moved 2.5 times as far from its float64 one. For nu = 3/2
        the state is ``s^2 exp(-z)`` alone, the slope's factor (z is not kept). Keeping ``s^2 (1 + z) exp(-z)``
        for nu = 5/2's slope instead of z and ``s^2 exp(-z)`` saved its backward a pass but cost its forward a
        fresh buffer for z: 2.7 -> 3.2 ms at [2,048, 1,024] float32, 14.0 -> 16.0 ms at [2,000, 2,000] float64
        (two threads; alternating, medians of 25), not kept."""
        root = math.sqrt(2.0 * self.nu)  # scales the inputs, not the buffer, so that equal rows stay at distance 0
        scaled = A * root
        # z held at -underflow_cutoff: exp(-z) at most 2.3e-13 above its value beyond (float32), never subnormal
        z = _sq_dist(scaled, scaled if B is A else B * root, bound=underflow_cutoff(A.dtype) ** 2).sqrt_()
        decay = torch.neg(z).exp_().mul_(outputscale)  # s^2 exp(-z)
        if self.nu == 0.5:
            return decay.clone(), (z, decay)
        if self.nu == 1.5:
            return torch.addcmul(decay, decay, z), (decay,)
        K = torch.addcmul(z, z, z, value=1.0 / 3.0)  # z + z^2 / 3
        return torch.addcmul(decay, decay, K, out=K), (z, decay)

    def weighted_slope(self, grad, K, state):
        """``s^2 dg / d(r^2) = s^2 g'(r) / (2 r)``: -s^2 exp(-z) / (2 r), -3/2 s^2 exp(-z), -5/6 s^2 (1 + z) exp(-z)
        (z = sqrt(2 nu) r); for nu = 1/2, 0 where r = 0 (as the derivative of the root floored above 0). The state's
        ``s^2 exp(-z)`` carries the outputscale."""
        if self.nu == 1.5:
            return grad * state[0], -1.5
        z, decay = state
        H = grad * decay
        if self.nu == 0.5:
            return H.div_(z).masked_fill_(z <= 1e-15, 0.0), -0.5
        return H.addcmul_(H, z), -5.0 / 6.0


class Periodic(Kernel):
    """The exp-sine-squared kernel ``s^2 exp(-2 sum_d sin^2(pi |x_d - x'_d| / p) / l^2)`` (MacKay 1998), with a
    learned period p, lengthscale l and outputscale s^2 (shared across inputs).

    Args:
        n_features: input dimension d.
        period, lengthscale, outputscale: initial values.
    """

    def __init__(self, n_features: int, period: float = 1.0, lengthscale: float = SOFTPLUS_ZERO,
                 outputscale: float = SOFTPLUS_ZERO):
        super().__init__()
        self.n_features = int(n_features)
        self.raw_period = nn.Parameter(inverse_softplus(torch.tensor(float(period))))
        self.raw_lengthscale = nn.Parameter(inverse_softplus(torch.tensor(float(lengthscale))))
        self.raw_outputscale = nn.Parameter(inverse_softplus(torch.tensor(float(outputscale))))

    @property
    def period(self) -> Tensor:
        return softplus(self.raw_period)

    def config(self) -> dict:
        return {"n_features": self.n_features}

    def extra_repr(self) -> str:
        return (f"period={_values(self.period)}, lengthscale={_values(self.lengthscale)}, "
                f"outputscale={_values(self.outputscale)}")

    @property
    def lengthscale(self) -> Tensor:
        return softplus(self.raw_lengthscale)

    @property
    def outputscale(self) -> Tensor:
        return softplus(self.raw_outputscale)

    def forward(self, X1: Tensor, X2: Tensor) -> Tensor:
        angle = math.pi * (X1.unsqueeze(-2) - X2.unsqueeze(-3)) / self.period.to(X1.dtype)  # [n1, n2, d]
        exponent = -2 * (torch.sin(angle) ** 2).sum(-1) / self.lengthscale.to(X1.dtype) ** 2
        # held as the stationary kernels' (underflow_cutoff): a short lengthscale takes it far below exp's range
        return self.outputscale.to(X1.dtype) * torch.exp(exponent.clamp_min(underflow_cutoff(X1.dtype)))

    def diag(self, X: Tensor) -> Tensor:
        return self.outputscale.to(X.dtype).expand(X.shape[0]).clone()


class Sum(Kernel):
    """``k_1 + k_2``: the covariance of the sum of two independent GPs."""

    def __init__(self, first: Kernel, second: Kernel):
        super().__init__()
        self.first, self.second = first, second

    def config(self) -> dict | None:
        if self.first.config() is None or self.second.config() is None:
            return None
        return {"first": self.first, "second": self.second}

    def forward(self, X1: Tensor, X2: Tensor) -> Tensor:
        return self.first(X1, X2) + self.second(X1, X2)

    def diag(self, X: Tensor) -> Tensor:
        return self.first.diag(X) + self.second.diag(X)


def _values(t: Tensor) -> str:
    """A hyperparameter for a repr: a number, or a list of numbers, to 4 significant digits."""
    values = t.detach().double().cpu().reshape(-1).tolist()
    shown = [f"{v:.4g}" for v in values]
    return shown[0] if len(shown) == 1 else "[" + ", ".join(shown) + "]"

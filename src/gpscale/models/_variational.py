"""Engine for every SVGP-family method, generic over inducing features.

A method supplies an :class:`~gpscale.models.inducing.InducingFeatures` object with ``Kuu()``, ``Kuf(X)`` and
``Kff_diag(X)`` (and, for a structured Kuu, ``Kuu_operator``). :class:`VariationalGP` keeps a Gaussian q over the
inducing features u and trains on the minibatch ELBO (Hensman et al. 2013)

    ELBO = num_data / b * sum_{i in batch} E_q log p(y_i | f_i) - KL(q || p(u)),

``loss`` returning ``-ELBO / num_data`` so that the learning rate does not depend on n. Two parametrisations of q,
chosen by ``whiten``:

- whitened (default): ``q(v) = N(m, S S^T)`` with ``u = L v``, ``L L^T = Kuu``, so the prior is N(0, I) and

      q(f(x)) = N(a^T m,  k(x, x) - a^T a + a^T S S^T a),   a = L^{-1} k_u(x);

  it takes features in independent blocks (HVGP's sub-GPs) and several latent functions (multiclass);
- unwhitened: ``q(u) = N(m, S)`` against the prior N(0, Kuu), which is only ever solved with, through its operator
  (so a structured Kuu, such as Fourier features', keeps its structure):

      q(f(x)) = N(phi^T Kuu^{-1} m,  k(x, x) - phi^T Kuu^{-1} phi + phi^T Kuu^{-1} S Kuu^{-1} phi),
      phi = Kuf(x) = Cov(u, f(x)).

Either q takes natural-gradient steps by default (:meth:`VariationalGP.natural_gradient_step`) and everything else
Adam. The orthogonally decoupled mean basis (:mod:`gpscale.models.decoupled`) extends the unwhitened q.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..distributed import LOCAL, Comm
from ..linalg import (
    CORE,
    cholesky,
    lower_transpose_product,
    solve_lower,
    squared_norms,
    tril_outer,
    weighted_sum,
    whiten,
)
from ..options import check_options
from ._gaussian_q import gauss_kl_whitened, natural_gradient_update, projected_moments, warn_skipped_step
from ._unwhitened import UnwhitenedQ
from .base import GPModel, PredictiveFactors
from .inducing import add_jitter, jittered_cholesky

__all__ = ["VariationalGP"]


class VariationalGP(UnwhitenedQ, GPModel):
    """A GP with a Gaussian q over inducing features, trained on the minibatch ELBO (see the module docstring).

    Subclasses set ``self.features`` (an :class:`InducingFeatures`) in ``__init__`` and call
    :meth:`init_variational` once its size is known. A whitened q may carry two leading axes:

    - blocks: features in T independent blocks (the sub-GPs of HVGP) have Kuu [T, m, m] and Kuf [T, m, c]; q is
      block diagonal, q_mu [T, m] and q_sqrt [T, m, m], and f = sum_t f_t, each block whitened by its own
      Cholesky factor;
    - latent functions: a likelihood with ``n_latent`` = C > 1 (multiclass) has C independent GPs that share the
      features and the kernel, q_mu [(T,) C, m] and q_sqrt [(T,) C, m, m]; the moments are then [c, C].

    Args:
        whiten: the parametrisation of q: whitened (default) or against the prior N(0, Kuu) (one block, one latent
            function). An unwhitened q starts at the prior (S = Kuu) when the model calls
            :meth:`start_at_prior`.
        jitter: added to the diagonal of Kuu (absolute).
        natural_gradients: move q by natural-gradient steps (:meth:`natural_gradient_step`) before every Adam
            step, and leave it out of Adam. A natural-gradient step follows q's own geometry: with a Gaussian
            likelihood, one step of size 1 on the full batch lands on the optimal q. Adam on the entries of m and S
            (``False``, as the papers' baselines and GPyTorch's examples) needs thousands of steps. Default None:
            the likelihood's ``natural_steps`` (True but for the robust-max likelihood, whose expected
            log-likelihood, a bounded near-step function of the means, natural-gradient steps overshoot).
        natgrad_step: that step's size rho (default 0.1, for minibatches; see
            :func:`~gpscale.models._gaussian_q.natural_gradient_update`). A step that would make S indefinite is
            halved until it does not.
    """

    likelihoods = ("gaussian", "bernoulli", "softmax", "robustmax")

    def __init__(self, n_features: int, *, whiten: bool = True, jitter: float = 1e-6,
                 natural_gradients: bool | None = None, natgrad_step: float = 0.1, **kwargs):
        super().__init__(n_features, **kwargs)
        check_options({"natgrad_step": natgrad_step, "jitter": jitter})
        if not isinstance(whiten, bool):
            raise ValueError(f"whiten must be True or False, got {whiten!r}.")
        self.whiten = whiten
        self.jitter = float(jitter)
        if natural_gradients is None:
            natural_gradients = self.likelihood.natural_steps
        self.natural_gradients = bool(natural_gradients)
        self.natgrad_step = float(natgrad_step)
        self.n_latent = getattr(self.likelihood, "n_latent", 1)
        self.blocks: int | None = None
        self._step_kernels: dict | None = None  # see step_shared

    def init_variational(self, m: int, blocks: int | None = None) -> None:
        """q = N(0, I): q_mu [(blocks,) (C,) m] and q_sqrt [(blocks,) (C,) m, m]."""
        if not self.whiten and (blocks is not None or self.n_latent > 1):
            raise ValueError(f"{self.key or type(self).__name__} with whiten=False takes one block of features and "
                             f"one latent function (this one has {blocks or 1} and {self.n_latent}): pass "
                             "whiten=True.")
        self.blocks = blocks
        batch = (() if blocks is None else (int(blocks),)) + (() if self.n_latent == 1 else (self.n_latent,))
        self.q_mu = nn.Parameter(torch.zeros(*batch, m))
        self.q_sqrt_raw = nn.Parameter(torch.eye(m).expand(*batch, m, m).clone())  # only its lower triangle is used

    def start_at_prior(self) -> None:
        """q = p(u), so that q(f) starts at the prior: S = I whitened, S = Kuu unwhitened; m = 0."""
        with torch.no_grad():
            self.q_mu.zero_()
            if self.whiten:
                self.q_sqrt_raw.copy_(torch.eye(self.q_mu.shape[-1]).expand_as(self.q_sqrt_raw))
            else:
                self.q_sqrt_raw.copy_(cholesky(self.Kuu_operator().to_dense(), what="Kuu"))

    @property
    def q_sqrt(self) -> Tensor:
        """S [m, m] (with the leading axes of q_mu), lower triangular."""
        return torch.tril(self.q_sqrt_raw)

    def parameter_groups(self) -> list[dict]:
        natural = {id(self.q_mu), id(self.q_sqrt_raw)} if self.natural_gradients else set()
        return [{"params": [p for p in self.parameters() if p.requires_grad and id(p) not in natural]}]

    def prior_variance(self, X: Tensor) -> Tensor:
        return self.features.Kff_diag(X)

    # --- the objective ------------------------------------------------------------------------------------
    def elbo(self, X: Tensor, y: Tensor, num_data: int, q_mu: Tensor | None = None,
             q_sqrt: Tensor | None = None) -> Tensor:
        """Unbiased minibatch estimate of the ELBO of a set of ``num_data`` points, at q = N(q_mu, q_sqrt q_sqrt^T)
        (default: the model's)."""
        q_mu = self.q_mu if q_mu is None else q_mu
        q_sqrt = self.q_sqrt if q_sqrt is None else q_sqrt
        if not X.shape[0]:  # a process holding none of a batch's rows: no expected log-likelihood to estimate
            return -self.prior_kl(q_mu, q_sqrt)
        if not self.whiten:
            return self.unwhitened_elbo(X, y, num_data, q_mu.to(CORE), q_sqrt.to(CORE))
        conditional = self.projected_conditional if self.projects(X) else self.conditional
        mean, var = conditional(X, self.Lu(), q_mu, q_sqrt)
        expected = self.likelihood.expected_log_prob(y, mean, var).sum()
        return (num_data / X.shape[0]) * expected.to(CORE) - self.prior_kl(q_mu, q_sqrt)

    def prior_kl(self, q_mu: Tensor | None = None, q_sqrt: Tensor | None = None) -> Tensor:
        """KL(q || p(u)) (float64) at q = N(q_mu, q_sqrt q_sqrt^T) (default: the model's), blocks and latent
        functions summed."""
        q_mu = (self.q_mu if q_mu is None else q_mu).to(CORE)
        q_sqrt = (self.q_sqrt if q_sqrt is None else q_sqrt).to(CORE)
        if self.whiten:
            return gauss_kl_whitened(q_mu, q_sqrt)
        return self.unwhitened_kl(q_mu, q_sqrt)

    def loss(self, X: Tensor, y: Tensor, num_data: int, comm: Comm = LOCAL, share: float = 1.0) -> Tensor:
        # a sum over the batch's rows plus a term of the parameters: each process's part is its rows' estimate
        if self._step_kernels is None:  # no natural-gradient step opened it: the loss's own matrices, each once
            self.open_step(X)
        try:
            return -self.elbo(X, y, num_data, *self.q_for_loss()) / num_data
        finally:  # the step's kernel matrices serve this loss only (see step_shared)
            self._step_kernels = None

    def q_for_loss(self) -> tuple[Tensor, Tensor]:
        """(m, S) as the optimiser's loss sees them: detached when natural-gradient steps alone move q, so that
        Adam computes no gradient for them."""
        if self.natural_gradients:
            return self.q_mu.detach(), self.q_sqrt.detach()
        return self.q_mu, self.q_sqrt

    # --- whitened q ---------------------------------------------------------------------------------------
    def Lu(self) -> Tensor:
        """Cholesky factor of :meth:`jittered_Kuu` [m, m] (or [T, m, m]), float64; shared within a training
        step."""
        return self.step_shared("Lu", None, lambda: cholesky(self.jittered_Kuu(), what="inducing covariance Kuu"))

    def jittered_Kuu(self) -> Tensor:
        """``Kuu + jitter I`` [(T,) m, m] in float64, the matrix :meth:`Lu` factors; shared within a training step."""
        return self.step_shared("Kuu+jitter", None, lambda: add_jitter(self.features.Kuu(), self.jitter))

    def cholesky_Kuu(self, Kuu: Tensor) -> Tensor:
        """The Cholesky factor of ``Kuu + jitter I`` [..., m, m] in float64."""
        return jittered_cholesky(Kuu, self.jitter)

    def conditional(self, X: Tensor, Lu: Tensor, q_mu: Tensor, q_sqrt: Tensor) -> tuple[Tensor, Tensor]:
        """Mean and variance [c] (or [c, C]) of q(f) at X [c, d], given L [m, m] and q(v) = N(q_mu, q_sqrt q_sqrt^T)
        (blocks summed)."""
        Kuf, Kff_diag = self.batch_kernels(X)
        return self.marginals(Kff_diag, *self.whitened_moments(self.whitened_Kuf(X, Lu, Kuf), q_mu, q_sqrt))

    def whitened_Kuf(self, X: Tensor, Lu: Tensor, Kuf: Tensor) -> Tensor:
        """``A = L^{-1} Kuf`` [(T,) m, c] in X's dtype, shared within a training step (:meth:`step_shared`). With
        the training step's factor (:meth:`Lu`, which carries a graph), the gradient goes to :meth:`jittered_Kuu`
        by :func:`~gpscale.linalg.whiten`, not through the factorisation (a jitter the factorisation had to add
        counts as a constant)."""
        if Lu.requires_grad:
            return self.step_shared("A", X, lambda: whiten(Kuf, Lu, self.jittered_Kuu()))
        return self.step_shared("A", X, lambda: solve_lower(Lu.to(X.dtype), Kuf))

    def batch_kernels(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """``Kuf(X)`` [(T,) m, c] and ``Kff_diag(X)`` [c], shared within a training step (:meth:`step_shared`)."""
        return (self.step_shared("Kuf", X, lambda: self.checked_Kuf(X)),
                self.step_shared("Kff_diag", X, lambda: self.features.Kff_diag(X)))

    def checked_Kuf(self, X: Tensor) -> Tensor:
        """``Kuf(X)`` [(T,) m, c], after a check that it fits in the free memory of the model's device with the
        matrices of its size a step forms from it: ``A = L^{-1} Kuf`` and ``S^T A`` for each latent function."""
        inducing, rows = self.q_mu.shape[-1] * (self.blocks or 1), X.shape[0]
        self.check_batch_fits((inducing, rows), X.dtype, copies=2 + self.n_latent,
                              what=f"The covariance K_uf of {inducing:,} inducing features with {rows:,} rows",
                              advice="Use a smaller batch_size= (training) or chunk_size= (prediction), or fewer "
                                     "inducing points (n_inducing=...).")
        return self.features.Kuf(X)

    def open_step(self, X: Tensor) -> None:
        """Start sharing kernel matrices within a training step on the batch X: between its natural-gradient step,
        which opens it, and its loss (which opens it when no natural-gradient step did)."""
        self._step_kernels = {"X": X, "versions": self._kernel_versions(X)} if torch.is_grad_enabled() else None

    def step_shared(self, name: str, X: Tensor | None, compute):
        """The matrix ``name`` (or tuple of them, as the unwhitened projection and its residual), ``compute()``, of
        the batch X (None: of the parameters alone), formed once a training step: the natural-gradient step (which
        opens the step, :meth:`open_step`) forms it with its graph, and the loss of the same step takes it instead
        of forming it again; only q moved in between, and no kernel matrix depends on q; within the loss, a matrix
        two of its terms read (K_uu + jitter I, its factor) is formed once.
        A matrix is taken only for the step's very batch tensor, unchanged, with every other parameter unchanged
        since (their version counters say so), with gradients enabled; else the step is opened anew here.
        :meth:`loss` ends the step."""
        memo = self._step_kernels
        if memo is None or not torch.is_grad_enabled():
            return compute()
        if (X is not None and memo["X"] is not X) or memo["versions"] != self._kernel_versions(memo["X"]):
            self.open_step(memo["X"] if X is None else X)  # what the step formed is stale: share anew from here
            memo = self._step_kernels
        if name not in memo:
            memo[name] = compute()
        return memo[name]

    def _kernel_versions(self, X: Tensor) -> tuple[int, ...]:
        """The in-place version counters of X and of every parameter but q's: what Kuf(X) and Kff_diag(X) read."""
        q = {id(self.q_mu), id(self.q_sqrt_raw)}
        return (X._version, *(p._version for p in self.parameters() if id(p) not in q))

    def whitened_moments(self, A: Tensor, q_mu: Tensor, q_sqrt: Tensor,
                         nystrom: bool = True) -> tuple[Tensor, Tensor, Tensor | None]:
        """``(a^T m, |S^T a|^2, |a|^2)`` [(C,) c], each summed over the blocks, for A = L^{-1} Kuf [(T,) m, c]; the
        last is None without ``nystrom`` (features whose k(x, x) is a^T a exactly leave no Nyström residual)."""
        q_mu = q_mu.to(A.dtype)
        mean = q_mu @ A if self.n_latent > 1 else weighted_sum(q_mu, A)  # [(T,) (C,) c]
        if self.n_latent > 1:
            A = A.unsqueeze(-3)  # shared by the C latent functions: [(T,) 1, m, c]
        SA = lower_transpose_product(q_sqrt.to(A.dtype), A)  # S^T L^{-1} Kuf, [(T,) (C,) m, c]
        moments = (mean, squared_norms(SA, -2), squared_norms(A, -2) if nystrom else None)
        return moments if self.blocks is None else tuple(None if t is None else t.sum(0) for t in moments)

    def marginals(self, Kff_diag: Tensor | None, mean: Tensor, variance: Tensor,
                  nystrom: Tensor | None) -> tuple[Tensor, Tensor]:
        """q(f(X)) [c] (or [c, C]) from the prior variances ``Kff_diag`` [c] at X and :meth:`whitened_moments`;
        ``Kff_diag`` and ``nystrom`` None where k(x, x) = a^T a exactly."""
        if Kff_diag is not None:
            # k(x, x) - a^T a is the Nyström residual, >= 0 in exact arithmetic; clamping removes round-off only
            variance = (Kff_diag - nystrom).clamp_min(0.0) + variance
        return (mean, variance) if self.n_latent == 1 else (mean.T, variance.T)

    def projects(self, X: Tensor) -> bool:
        """Whether the ELBO on the batch X takes :meth:`projected_conditional`: float64, one latent function and
        m at most half the batch."""
        return X.dtype == CORE and self.n_latent == 1 and 2 * self.q_mu.shape[-1] <= X.shape[0]

    def projected_conditional(self, X: Tensor, Lu: Tensor, q_mu: Tensor, q_sqrt: Tensor) -> tuple[Tensor, Tensor]:
        """The moments of :meth:`conditional` by :func:`~gpscale.models._gaussian_q.projected_moments`, which does
        the m x m algebra once per batch; for the float64 training objective only (prediction keeps
        :meth:`conditional`)."""
        return projected_moments(*self.batch_kernels(X), Lu, q_mu, q_sqrt)

    # --- natural gradients --------------------------------------------------------------------------------
    def natural_gradient_step(self, X: Tensor, y: Tensor, num_data: int, comm: Comm = LOCAL,
                              share: float = 1.0) -> None:
        """One natural-gradient step of size ``natgrad_step`` on every block's and latent function's q = N(m, S),
        the rest fixed (:func:`~gpscale.models._gaussian_q.natural_gradient_update`, with K = I whitened and
        K = Kuu unwhitened). S enters the ELBO only through the batch's variances ``... + diag(A^T S A)``, with
        A = L^{-1} Kuf whitened and Kuu^{-1} Kuf unwhitened, so the data term of ``dELBO / dS`` is
        ``A diag(g_var) A^T``, one [M, b] x [b, M] product, where g_var is the expected log-likelihood's gradient
        with respect to the batch's variances. Under data parallelism the global batch's gradients are the sum over
        processes of ``share`` times each process's."""
        if not self.natural_gradients:
            return
        self.open_step(X)
        gradients = self._whitened_gradients if self.whiten else self.unwhitened_gradients
        m, L, g_m, data_term, prior_precision, S_inv = gradients(X, y, num_data, comm, share)
        with torch.no_grad():
            step = natural_gradient_update(m, S_inv, g_m, data_term, prior_precision, self.natgrad_step)
            if step is None:
                warn_skipped_step(self.natgrad_step)
                return
            self.q_mu.copy_(step[0].to(self.q_mu))
            self.q_sqrt_raw.copy_(step[1].to(self.q_sqrt_raw))
            self._precision = (self._q_sqrt_state(), step[2])  # S^{-1} for the next step, while nothing else writes L

    def train(self, mode: bool = True):
        # each epoch (fit calls train() at its start) forms S^{-1} afresh from q, as a fit resumed from the epoch's
        # checkpoint does, which must reach the same model to the bit; within an epoch, steps pass it on
        self._precision = None
        return super().train(mode)

    def step_state(self) -> dict[str, Tensor]:
        """S^{-1}, which the last natural-gradient step passed on to the next, while it holds for q."""
        state, precision = getattr(self, "_precision", None) or (None, None)
        return {"precision": precision} if state == self._q_sqrt_state() else {}

    def set_step_state(self, state: dict[str, Tensor]) -> None:
        if "precision" in state:
            self._precision = (self._q_sqrt_state(), state["precision"].to(device=self.device))

    def _whitened_gradients(self, X, y, num_data, comm, share):
        """With a = L^{-1} k_u(x) [(T,) m, b], the batch's means are ``a^T m``, so ``dELBO / dm = a g_mean - m``.
        The batch's terms are formed in its dtype, as the loss forms them (A, with its graph, is the loss's own:
        see :meth:`step_shared`), and summed into the float64 step."""
        with torch.no_grad():
            m, L = self.q_mu.detach().to(CORE), self.q_sqrt.detach().to(CORE)
        if X.shape[0]:
            Kuf, Kff_diag = self.batch_kernels(X)
            Lu = self.Lu()
            if isinstance(Lu, list):  # blocks placed on several devices (HVGP): the step runs on the batch's
                A = solve_lower(torch.cat([part.detach().to(X.device) for part in Lu]).to(X.dtype), Kuf.detach())
            else:
                A = self.whitened_Kuf(X, Lu, Kuf).detach()  # [(T,) m, b]
            with torch.no_grad():
                mean, variance, nystrom = (t.to(CORE) for t in self.whitened_moments(A, m.to(A.dtype),
                                                                                     L.to(A.dtype)))
            mean.requires_grad_(True)
            variance.requires_grad_(True)
            f_mean, f_var = self.marginals(Kff_diag.detach().to(CORE), mean, variance, nystrom)
            expected = self.likelihood.expected_log_prob(y.to(CORE), f_mean, f_var).sum()
            g_mean, g_var = torch.autograd.grad((num_data / X.shape[0]) * expected, [mean, variance])
            if self.n_latent > 1:
                A = A.unsqueeze(-3)  # shared by the C latent functions
            g_m = share * (A * g_mean.to(A.dtype).unsqueeze(-2)).sum(-1).to(CORE)  # [(T,) (C,) m]
            lower = tril_outer(A * (share * g_var).to(A.dtype).unsqueeze(-2), A)  # of the symmetric A diag(g) A^T
            data_term = (lower + lower.tril(-1).mT).to(CORE)  # [(T,) (C,) m, m]
        else:  # none of the global batch's rows are here
            g_m, data_term = torch.zeros_like(m), torch.zeros_like(L)
        g_m, data_term = comm.all_reduce_sum(g_m) - m, comm.all_reduce_sum(data_term)  # - m: the KL's gradient
        eye = torch.eye(m.shape[-1], dtype=CORE, device=m.device)
        return m, L, g_m, data_term, eye, self._S_inverse(L)

    # --- posterior ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def fit_posterior(self, X: Tensor, y: Tensor, comm: Comm = LOCAL) -> None:
        # q is the posterior; the cache fixes it with Kuu's Cholesky factor (and the unwhitened mean's weights)
        if self.whiten:
            self.cache = {"Lu": self.Lu(), "q_mu": self.q_mu.detach().clone(), "q_sqrt": self.q_sqrt.detach().clone()}
            return
        self.cache = self.unwhitened_posterior()

    def predict_chunk(self, X: Tensor) -> tuple[Tensor, Tensor]:
        if not self.whiten:
            return super().predict_chunk(X)
        # the conditional of training: blocks on their devices, one column per latent function
        return self.conditional(X, self.cache["Lu"], self.cache["q_mu"], self.cache["q_sqrt"])

    def predictive_factors(self, X: Tensor) -> PredictiveFactors:
        """q(f) at X [c, d]. Whitened, with ``a = L^{-1} Kuf`` over every block: mean ``a^T m`` and covariance
        ``K - a^T a + (S^T a)^T (S^T a)`` (one latent function, blocks on one device). Unwhitened: mean
        ``phi^T w`` (plus a mean basis) and covariance ``K - V^T V + (L_S^T A)^T (L_S^T A)`` with
        ``V = L^{-1} phi`` (so ``V^T V = phi^T Kuu^{-1} phi``) and ``A = Kuu^{-1} phi``."""
        Lu = self.cache["Lu"]
        if not self.whiten:
            return self.unwhitened_predictive_factors(X)
        if self.n_latent > 1 or isinstance(Lu, list):
            raise NotImplementedError(f"The joint predictive of {self.key or type(self).__name__} is computed for "
                                      "one latent function with its blocks on one device; use the marginal "
                                      "predictive (predict) instead.")
        A = solve_lower(Lu.to(X.dtype), self.features.Kuf(X))  # [(T,) m, c]
        mean = (A * self.cache["q_mu"].to(A.dtype).unsqueeze(-1)).sum(-2)
        SA = self.cache["q_sqrt"].to(A.dtype).mT @ A
        if self.blocks is not None:
            mean = mean.sum(0)
        return PredictiveFactors(mean, A.reshape(-1, A.shape[-1]), SA.reshape(-1, SA.shape[-1]))

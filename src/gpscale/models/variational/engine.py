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

Each parametrisation is an object with one interface
(:class:`~gpscale.models.variational.parametrisation.QParametrisation`:
:class:`~gpscale.models.variational.whitened.WhitenedQ`,
:class:`~gpscale.models.variational.unwhitened.UnwhitenedQ`), chosen once at construction; the orthogonally
decoupled mean basis (:class:`~gpscale.models.variational.decoupled.DecoupledQ`) extends the unwhitened one. The features' side of the
whitened q (Kuu's factor, ``A = L^{-1} Kuf`` and the moments of q(f)) is the model's, for a method to specialise.

Either q takes natural-gradient steps by default and everything else Adam. The trainer calls
:meth:`VariationalGP.training_loss`, one training step: the natural-gradient step on q, then the loss at the moved
q, both from one set of kernel matrices (:meth:`VariationalGP.step_shared`), since only q moves in between and no
kernel matrix depends on q.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import Tensor

from ...distributed import LOCAL, Comm
from ...linalg import (
    CORE,
    cholesky,
    cholesky_inverse,
    lower_transpose_product,
    solve_lower,
    squared_norms,
    weighted_sum,
    whitened_solve,
)
from ...options import check_options
from ..base import GPModel, PredictiveFactors
from ..inducing import add_jitter, jittered_cholesky
from .gaussian_q import natural_gradient_update, projected_moments, warn_skipped_step
from .parametrisation import QParametrisation
from .unwhitened import UnwhitenedQ
from .whitened import WhitenedQ

__all__ = ["VariationalGP"]


class VariationalGP(GPModel):
    """A GP with a Gaussian q over inducing features, trained on the minibatch ELBO (see the module docstring).

    Subclasses set ``self.features`` (an :class:`InducingFeatures`) in ``__init__`` and call
    :meth:`initialise_q` once its size is known. A whitened q may carry two leading axes:

    - blocks: features in T independent blocks (the sub-GPs of HVGP) have Kuu [T, m, m] and Kuf [T, m, c]; q is
      block diagonal, q_mu [T, m] and q_sqrt [T, m, m], and f = sum_t f_t, each block whitened by its own
      Cholesky factor;
    - latent functions: a likelihood with ``n_latent`` = C > 1 (multiclass) has C independent GPs that share the
      features and the kernel, q_mu [(T,) C, m] and q_sqrt [(T,) C, m, m]; the moments are then [c, C].

    Args:
        whiten: the parametrisation of q (``self.q``): whitened (default, :class:`WhitenedQ`) or against the prior
            N(0, Kuu) (``unwhitened_q``, one block, one latent function). An unwhitened q starts at the prior
            (S = Kuu) when the model calls :meth:`initialise_q_at_prior`.
        jitter: added to the diagonal of Kuu (absolute).
        natural_gradients: move q by natural-gradient steps (:meth:`natural_gradient_step`) before every Adam
            step, and leave it out of Adam. A natural-gradient step follows q's own geometry: with a Gaussian
            likelihood, one step of size 1 on the full batch lands on the optimal q. Adam on the entries of m and S
            (``False``, as the papers' baselines and GPyTorch's examples) needs thousands of steps. Default None:
            the likelihood's ``natural_steps`` (True but for the robust-max likelihood, whose expected
            log-likelihood, a bounded near-step function of the means, natural-gradient steps overshoot).
        natgrad_step: that step's size rho (default 0.1, for minibatches; see
            :func:`~gpscale.models.variational.gaussian_q.natural_gradient_update`). A step that would make S
            indefinite is halved until it does not.
    """

    likelihoods = ("gaussian", "bernoulli", "softmax", "robustmax")
    unwhitened_q: type[UnwhitenedQ] = UnwhitenedQ  # the parametrisation of whiten=False

    def __init__(self, n_features: int, *, whiten: bool = True, jitter: float = 1e-6,
                 natural_gradients: bool | None = None, natgrad_step: float = 0.1, **kwargs):
        super().__init__(n_features, **kwargs)
        check_options({"natgrad_step": natgrad_step, "jitter": jitter})
        if not isinstance(whiten, bool):
            raise ValueError(f"whiten must be True or False, got {whiten!r}.")
        self.whiten = whiten
        self.q: QParametrisation = WhitenedQ() if whiten else self.unwhitened_q()
        self.jitter = float(jitter)
        if natural_gradients is None:
            natural_gradients = self.likelihood.natural_steps
        self.natural_gradients = bool(natural_gradients)
        self.natgrad_step = float(natgrad_step)
        self.n_latent = getattr(self.likelihood, "n_latent", 1)
        self.blocks: int | None = None
        self.step_kernels: dict | None = None  # open within one training step: see step_shared

    def initialise_q(self, m: int, blocks: int | None = None) -> None:
        """q = N(0, I): q_mu [(blocks,) (C,) m] and q_sqrt [(blocks,) (C,) m, m]."""
        self.q.check(self, blocks)
        self.blocks = blocks
        batch = (() if blocks is None else (int(blocks),)) + (() if self.n_latent == 1 else (self.n_latent,))
        self.q_mu = torch.nn.Parameter(torch.zeros(*batch, m))
        self.q_sqrt_raw = torch.nn.Parameter(torch.eye(m).expand(*batch, m, m).clone())  # its lower triangle is used

    def initialise_q_at_prior(self) -> None:
        """q = p(u), so that q(f) starts at the prior: m = 0 and S the prior's (I whitened, Kuu unwhitened)."""
        with torch.no_grad():
            self.q_mu.zero_()
            self.q_sqrt_raw.copy_(self.q.prior_sqrt(self))

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
        with self.training_step():  # a matrix two of its terms read (K_uu + jitter I, its factor) is formed once
            if not X.shape[0]:  # a process holding none of a batch's rows: no expected log-likelihood to estimate
                return -self.prior_kl(q_mu, q_sqrt)
            return self.q.elbo(self, X, y, num_data, q_mu, q_sqrt)

    def prior_kl(self, q_mu: Tensor | None = None, q_sqrt: Tensor | None = None) -> Tensor:
        """KL(q || p(u)) (float64) at q = N(q_mu, q_sqrt q_sqrt^T) (default: the model's), blocks and latent
        functions summed."""
        q_mu = (self.q_mu if q_mu is None else q_mu).to(CORE)
        q_sqrt = (self.q_sqrt if q_sqrt is None else q_sqrt).to(CORE)
        return self.q.kl(self, q_mu, q_sqrt)

    def loss(self, X: Tensor, y: Tensor, num_data: int, comm: Comm = LOCAL, share: float = 1.0) -> Tensor:
        # a sum over the batch's rows plus a term of the parameters: each process's part is its rows' estimate
        return -self.elbo(X, y, num_data, *self.q_for_loss()) / num_data

    def training_loss(self, X: Tensor, y: Tensor, num_data: int, comm: Comm = LOCAL, share: float = 1.0) -> Tensor:
        """One training step on the batch (X, y): the natural-gradient step on q (:meth:`natural_gradient_step`),
        then :meth:`loss` at the moved q, for the optimiser; both take the kernel matrices of the batch from one
        set, formed once (:meth:`training_step`)."""
        with self.training_step():
            self.natural_gradient_step(X, y, num_data, comm, share)
            return self.loss(X, y, num_data, comm, share)

    def q_for_loss(self) -> tuple[Tensor, Tensor]:
        """(m, S) as the optimiser's loss sees them: detached when natural-gradient steps alone move q, so that
        Adam computes no gradient for them."""
        if self.natural_gradients:
            return self.q_mu.detach(), self.q_sqrt.detach()
        return self.q_mu, self.q_sqrt

    # --- one set of kernel matrices per training step -----------------------------------------------------
    @contextmanager
    def training_step(self):
        """Within it, each matrix that :meth:`step_shared` names is formed once; the outermost one opens the set
        and drops it at its end. What runs within (a natural-gradient step and a loss, or one ELBO) moves q at
        most, and no kernel matrix depends on q, so a matrix formed early in it holds to its end."""
        if self.step_kernels is not None:
            yield
            return
        self.step_kernels = {}
        try:
            yield
        finally:
            self.step_kernels = None

    def step_shared(self, name: str, X: Tensor | None, compute):
        """The matrix ``name`` (or tuple of them, as the unwhitened projection and its residual), ``compute()``, of
        the batch X (None: of the parameters alone), formed once within :meth:`training_step` (with its graph: the
        natural-gradient step forms it, and the loss of the same step takes it); for another batch tensor X (a
        fresh draw of a deep model's hidden layers) it is formed anew. Outside a training step, or with gradients
        off, each call forms its own."""
        memo = self.step_kernels
        if memo is None or not torch.is_grad_enabled():
            return compute()
        if name not in memo or memo[name][0] is not X:
            memo[name] = (X, compute())
        return memo[name][1]

    # --- the features' side of the whitened q -------------------------------------------------------------
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
        by :func:`~gpscale.linalg.whitened_solve`, not through the factorisation (a jitter the factorisation had to add
        counts as a constant)."""
        if Lu.requires_grad:
            return self.step_shared("A", X, lambda: whitened_solve(Kuf, Lu, self.jittered_Kuu()))
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
        """The moments of :meth:`conditional` by :func:`~gpscale.models.variational.gaussian_q.projected_moments`,
        which does the m x m algebra once per batch; for the float64 training objective only (prediction keeps
        :meth:`conditional`)."""
        return projected_moments(*self.batch_kernels(X), Lu, q_mu, q_sqrt)

    def Kuu_operator(self):
        """Kuu + jitter I as an operator (float64), which the unwhitened q solves with; structured features keep
        their structure. Shared within a training step, with the factorisation it caches."""
        return self.step_shared("Kuu", None, lambda: self.features.Kuu_operator(self.jitter))

    # --- natural gradients --------------------------------------------------------------------------------
    def natural_gradient_step(self, X: Tensor, y: Tensor, num_data: int, comm: Comm = LOCAL,
                              share: float = 1.0) -> None:
        """One natural-gradient step of size ``natgrad_step`` on every block's and latent function's q = N(m, S),
        the rest fixed (:func:`~gpscale.models.variational.gaussian_q.natural_gradient_update`, with K = I whitened
        and K = Kuu unwhitened). S enters the ELBO only through the batch's variances ``... + diag(A^T S A)``, with
        A = L^{-1} Kuf whitened and Kuu^{-1} Kuf unwhitened, so the data term of ``dELBO / dS`` is
        ``A diag(g_var) A^T``, one [M, b] x [b, M] product, where g_var is the expected log-likelihood's gradient
        with respect to the batch's variances. Under data parallelism the global batch's gradients are the sum over
        processes of ``share`` times each process's."""
        if not self.natural_gradients:
            return
        with self.training_step():
            m, L, g_m, data_term, prior_precision = self.q.natural_gradient_terms(self, X, y, num_data, comm, share)
        with torch.no_grad():
            step = natural_gradient_update(m, self._S_inverse(L), g_m, data_term, prior_precision, self.natgrad_step)
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

    def _q_sqrt_state(self) -> tuple:
        raw = self.q_sqrt_raw
        return raw.data_ptr(), raw._version, raw.device, raw.dtype

    def _S_inverse(self, L: Tensor) -> Tensor:
        """S^{-1} [..., M, M] (float64): the precision the last natural-gradient step factored, while nothing has
        written to L since (its version counter says so), which saves a cholesky_inverse (2/3 M^3 flops) per
        step; otherwise from L."""
        state, precision = getattr(self, "_precision", None) or (None, None)
        return precision if state == self._q_sqrt_state() else cholesky_inverse(L)

    # --- posterior ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def fit_posterior(self, X: Tensor, y: Tensor, comm: Comm = LOCAL) -> None:
        # q is the posterior; the cache fixes it with Kuu's Cholesky factor (and the unwhitened mean's weights)
        self.cache = self.q.posterior(self)

    def predict_chunk(self, X: Tensor) -> tuple[Tensor, Tensor]:
        return self.q.predict_chunk(self, X)

    def predictive_factors(self, X: Tensor) -> PredictiveFactors:
        """q(f) at X [c, d], a mean and low-rank factors of its covariance (see the parametrisations')."""
        return self.q.predictive_factors(self, X)

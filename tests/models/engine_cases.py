"""Base test cases of the model engines, which every method on an engine runs against dense formulas: a method's
test class subclasses one of them and supplies ``make_model`` (small sizes, float64, initialised).

- :class:`VariationalEngineCase` (``models/variational/engine.py``): the ELBO, the KL, q(f) at training and at
  prediction, and one natural-gradient step of size one under a Gaussian likelihood, each against the dense
  algebra of the same q (whitened: u = L v; unwhitened: q(u) against N(0, Kuu), with a decoupled mean basis if the
  model has one).
- :class:`LinearEngineCase` (``models/linear/engine.py``): the log evidence (and Titsias' bound for a collapsed
  model) and the predictive, against the dense GP of the method's feature map phi.
"""
from __future__ import annotations

import copy
import math

import torch
from torch.distributions import MultivariateNormal, kl_divergence

from gpscale.models.base import GPModel
from gpscale.models.variational.decoupled import OrthogonallyDecoupledGP

F64 = torch.float64


def gaussian_expected_log_prob(y, mean, var, noise):
    """E_{f ~ N(mean, var)} log N(y | f, noise), summed over the rows."""
    return (-0.5 * torch.log(2 * math.pi * noise) - 0.5 * ((y - mean) ** 2 + var) / noise).sum()


class VariationalEngineCase:
    """A method on the variational engine against the dense algebra of its q; ``make_model(**options)`` returns the
    model (Gaussian likelihood, float64, ``initialise_from_data`` done) and its data (X [n, d], y [n])."""

    rows = 24  # training rows; the first ``small_batch`` of them make a batch on the whitened conditional's path
    small_batch = 3
    rtol, atol = 1e-8, 1e-9

    def make_model(self, **options):  # pragma: no cover - interface
        raise NotImplementedError

    def inputs(self, model, X):
        """What the model's features take for the rows X (a method on a network's basis rows overrides this)."""
        return X

    def model_and_data(self, **options):
        model, X, y = self.make_model(**options)
        g = torch.Generator().manual_seed(11)
        with torch.no_grad():  # a q away from the prior, S lower triangular with a positive diagonal
            model.q_mu.copy_(0.5 * torch.randn(model.q_mu.shape, generator=g, dtype=F64))
            m = model.q_mu.shape[-1]
            noise = 0.2 * torch.randn(model.q_sqrt_raw.shape, generator=g, dtype=F64)
            model.q_sqrt_raw.copy_(model.q.prior_sqrt(model).to(F64) @ (torch.eye(m, dtype=F64) + noise.tril()))
            if isinstance(model, OrthogonallyDecoupledGP):
                model.a_gamma.copy_(torch.randn(model.n_mean_inducing, generator=g, dtype=F64))
        return model, X, y

    # --- the dense algebra ----------------------------------------------------------------------------------
    def dense_terms(self, model, X):
        """For q's variables of each block (leading axis T, or none): the prior covariance K [(T,) m, m], the map
        A [(T,) m, c] with q(f)'s mean ``A^T m + offset`` and variance ``residual + diag(A^T S A)``, the offset
        (the decoupled mean basis, else 0) [c] and the residual k(x, x) - Nystrom [c] (blocks summed)."""
        P = self.inputs(model, X)
        Kuu = model.features.Kuu().to(F64)
        Kuu = Kuu + model.jitter * torch.eye(Kuu.shape[-1], dtype=F64)
        Kuf = model.features.Kuf(P).to(F64)
        kff = model.features.Kff_diag(P).to(F64)
        offset = torch.zeros(X.shape[0], dtype=F64)
        if model.whiten:
            A = torch.linalg.solve_triangular(torch.linalg.cholesky(Kuu), Kuf, upper=False)
            K, nystrom = torch.eye(Kuu.shape[-1], dtype=F64).expand_as(Kuu), (A * A).sum(-2)
        else:
            A, K = torch.linalg.solve(Kuu, Kuf), Kuu
            nystrom = (Kuf * A).sum(-2)
            if isinstance(model, OrthogonallyDecoupledGP) and model.n_mean_inducing:
                a, gamma = model.a_gamma.to(F64), model.gamma
                offset = model.kernel(X, gamma).to(F64) @ a - A.T @ (model.features.Kuf(gamma).to(F64) @ a)
        residual = kff - (nystrom.sum(0) if model.blocks is not None else nystrom)
        return K, A, offset, residual

    def dense_moments(self, model, X):
        K, A, offset, residual = self.dense_terms(model, X)
        m, L = model.q_mu.detach().to(F64), model.q_sqrt.detach().to(F64)
        mean = (A * m.unsqueeze(-1)).sum(-2)
        var = ((L.mT @ A) ** 2).sum(-2)
        if model.blocks is not None:
            mean, var = mean.sum(0), var.sum(0)
        return mean + offset, residual + var

    def dense_kl(self, model, X):
        K, _, _, _ = self.dense_terms(model, X)
        m, L = model.q_mu.detach().to(F64), model.q_sqrt.detach().to(F64)
        kl = kl_divergence(MultivariateNormal(m, scale_tril=L), MultivariateNormal(torch.zeros_like(m), K)).sum()
        if isinstance(model, OrthogonallyDecoupledGP) and model.n_mean_inducing:
            a, gamma = model.a_gamma.to(F64), model.gamma
            c = model.features.Kuf(gamma).to(F64) @ a
            kl = kl + 0.5 * (a @ model.kernel(gamma, gamma).to(F64) @ a - c @ torch.linalg.solve(K, c))
        return kl

    # --- the cases ------------------------------------------------------------------------------------------
    def test_the_kl_is_the_dense_gaussian_kl(self):
        model, X, _ = self.model_and_data()
        with torch.no_grad():
            torch.testing.assert_close(model.prior_kl(), self.dense_kl(model, X), rtol=self.rtol, atol=self.atol)

    def test_the_elbo_is_the_dense_elbo_of_the_same_q(self):
        model, X, y = self.model_and_data()
        num_data = 2 * self.rows  # the batch's expected log-likelihood is scaled by num_data / b
        for rows in (self.small_batch, self.rows):
            Xb, yb = X[:rows], y[:rows]
            with torch.no_grad():
                mean, var = self.dense_moments(model, Xb)
                expected = gaussian_expected_log_prob(yb.to(F64), mean, var, model.noise.to(F64))
                dense = num_data / rows * expected - self.dense_kl(model, X)
                torch.testing.assert_close(model.elbo(Xb, yb, num_data), dense, rtol=self.rtol, atol=self.atol)

    def test_the_predictive_is_the_dense_q_of_f(self):
        model, X, y = self.model_and_data()
        Xs = X[: self.small_batch + 2] + 0.01
        with torch.no_grad():
            model.fit_posterior(X, y)
            mean, var = self.dense_moments(model, Xs)
            marginal = model.predict(Xs)
            joint = GPModel.predict_chunk(model, Xs)  # the diagonal of the predictive factors' covariance
        for ours in (marginal, joint):
            torch.testing.assert_close(ours[0].to(F64), mean, rtol=self.rtol, atol=self.atol)
            torch.testing.assert_close(ours[1].to(F64), var, rtol=self.rtol, atol=self.atol)

    def test_a_natural_gradient_step_of_one_on_the_full_batch_is_the_closed_form(self):
        """Under a Gaussian likelihood each block's q moves to ``S = (K^{-1} + A A^T / s2)^{-1}`` and
        ``m = S A (y - other blocks' and the mean basis's mean) / s2``, the others held at their old q."""
        model, X, y = self.model_and_data(natural_gradients=True, natgrad_step=1.0)
        with torch.no_grad():
            K, A, offset, _ = self.dense_terms(model, X)
            m = model.q_mu.detach().to(F64)
            means = (A * m.unsqueeze(-1)).sum(-2)  # [(T,) c]
            others = (means.sum(0) - means if model.blocks is not None else 0 * means) + offset
            s2 = model.noise.to(F64)
            precision = torch.linalg.inv(K) + A @ A.mT / s2
            S = torch.linalg.inv(precision)
            target = (S @ (A @ (y.to(F64) - others).unsqueeze(-1))).squeeze(-1) / s2
        model.natural_gradient_step(X, y, X.shape[0])
        with torch.no_grad():
            L = model.q_sqrt.to(F64)
            torch.testing.assert_close(model.q_mu.to(F64), target, rtol=1e-6, atol=1e-8)
            torch.testing.assert_close(L @ L.mT, S, rtol=1e-6, atol=1e-8)

    def test_a_training_step_is_its_natural_gradient_step_and_then_its_loss(self):
        """training_loss shares one set of kernel matrices between the two: the loss and every gradient are those
        of the step and the loss taken apart."""
        model, X, y = self.model_and_data(natural_gradients=True)
        apart = copy.deepcopy(model)
        together = model.training_loss(X, y, X.shape[0])
        apart.natural_gradient_step(X, y, X.shape[0])
        alone = apart.loss(X, y, X.shape[0])
        torch.testing.assert_close(together, alone, rtol=1e-12, atol=1e-12)
        together.backward()
        alone.backward()
        for (name, a), b in zip(model.named_parameters(), apart.parameters()):
            assert (a.grad is None) == (b.grad is None), name
            if a.grad is not None:
                torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-12, msg=name)


class LinearEngineCase:
    """A method on the linear engine against the dense GP of its feature map: ``make_model()`` returns the model
    (float64, ``initialise_from_data`` done, no noise calibration) and its data (X [n, d], y [n])."""

    rtol, atol = 1e-8, 1e-9

    def make_model(self):  # pragma: no cover - interface
        raise NotImplementedError

    def dense(self, model, X, y):
        """Phi [n, r], the noise, and log N(y | 0, Phi Phi^T + s2 I)."""
        Phi = model.phi(X).to(F64)
        s2 = model.noise.to(F64)
        cov = Phi @ Phi.T + s2 * torch.eye(X.shape[0], dtype=F64)
        return Phi, s2, MultivariateNormal(torch.zeros(X.shape[0], dtype=F64), cov).log_prob(y.to(F64))

    def test_the_evidence_is_the_dense_evidence_of_the_feature_kernel(self):
        model, X, y = self.make_model()
        with torch.no_grad():
            Phi, s2, evidence = self.dense(model, X, y)
            torch.testing.assert_close(model.log_marginal_likelihood(X, y), evidence, rtol=self.rtol,
                                       atol=self.atol)
            if model.trace_term:  # Titsias' bound: the evidence less tr(K - Phi Phi^T) / (2 s2)
                bound = evidence - 0.5 * (model.prior_variance(X).to(F64).sum() - (Phi * Phi).sum()) / s2
                torch.testing.assert_close(model.elbo(X, y), bound, rtol=self.rtol, atol=self.atol)

    def test_the_predictive_is_the_dense_posterior_of_the_weights(self):
        """w | y ~ N(Sigma Phi^T y / s2, Sigma), Sigma = (I + Phi^T Phi / s2)^{-1}; f(x) = phi(x)^T w, plus
        k(x, x) - |phi(x)|^2 for a collapsed model."""
        model, X, y = self.make_model()
        Xs = X[:5] + 0.01
        with torch.no_grad():
            Phi, s2, _ = self.dense(model, X, y)
            Sigma = torch.linalg.inv(torch.eye(Phi.shape[1], dtype=F64) + Phi.T @ Phi / s2)
            Phis = model.phi(Xs).to(F64)
            mean = Phis @ (Sigma @ Phi.T @ y.to(F64)) / s2
            var = ((Phis @ Sigma) * Phis).sum(-1)
            if model.trace_term:
                var = var + model.prior_variance(Xs).to(F64) - (Phis * Phis).sum(-1)
            model.fit_posterior(X, y)
            ours = model.predict(Xs)
        torch.testing.assert_close(ours[0].to(F64), mean, rtol=self.rtol, atol=self.atol)
        torch.testing.assert_close(ours[1].to(F64), var, rtol=self.rtol, atol=self.atol)

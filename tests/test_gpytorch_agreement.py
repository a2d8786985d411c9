"""Agreement with GPyTorch (1.15) on identical parameters: objectives, predictions, gradients, training.

The GPyTorch side is gpscale.bench.peers (the benchmark's baselines); copy_hyperparameters puts our parameters
into it. Conventions that differ, and how each test accounts for them:

- GPyTorch's InducingPointKernel adds no jitter to K_uu: our SGPR runs with jitter=0.
- GPyTorch's whitened VariationalStrategy adds jitter_val to K_uu (as ours) and also to k(x, x) of every
  predicted point: its latent variance is ours + jitter_val, so its expected log-likelihood, hence its ELBO, is
  lower than ours by exactly n * jitter_val / (2 sigma^2).
- GPyTorch's SGPR predicts with FITC's equations by default (diagonal correction on the joint train/test
  covariance); with the correction off its mean is Titsias' and its variance lacks k** - Q**.
- GPyTorch's noise is 1e-4 + softplus(raw); ours is noise_floor + softplus(raw): the training-trajectory tests
  use noise_floor=1e-4 so the raw parameters, which Adam updates, coincide.
"""
from __future__ import annotations

import pytest
import torch

gpytorch = pytest.importorskip("gpytorch")

from gpscale.bench.peers import copy_hyperparameters, make_peer  # noqa: E402
from gpscale.kernels.stationary import inverse_softplus  # noqa: E402
from gpscale.models.exact.gp import ExactGP  # noqa: E402
from gpscale.models.inducing import kmeans_centers  # noqa: E402
from gpscale.models.linear.sgpr import SGPR  # noqa: E402
from gpscale.models.variational.svgp import SVGP  # noqa: E402
from gpscale.train import fit  # noqa: E402

DT = torch.float64
N, D, M = 300, 3, 30
LENGTHSCALE = (0.7, 1.3, 0.9)
OUTPUTSCALE, NOISE = 1.7, 0.05
RTOL = 1e-6


@pytest.fixture(autouse=True)
def _float64():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(DT)
    yield
    torch.set_default_dtype(previous)


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(1234)
    X = (torch.rand(N, D, generator=g, dtype=DT) * 4 - 2)
    f = torch.sin(2 * X[:, 0]) + 0.5 * X[:, 1] ** 2 - X[:, 2] + 0.5 * X[:, 0] * X[:, 2]
    y = f + 0.2 * torch.randn(N, generator=g, dtype=DT)
    y = (y - y.mean()) / y.std()
    Xs = torch.rand(60, D, generator=g, dtype=DT) * 5 - 2.5  # partly outside the training box
    Z = X[torch.randperm(N, generator=g)[:M]] + 0.05 * torch.randn(M, D, generator=g, dtype=DT)
    return X, y, Xs, Z


def _close(a, b, rtol=RTOL, atol_rel=0.0, what=""):
    """rtol on each entry; atol_rel * max|b| only for entries that can be ~0 (means, gradients)."""
    a, b = torch.as_tensor(a, dtype=DT).reshape(-1), torch.as_tensor(b, dtype=DT).reshape(-1)
    atol = atol_rel * b.abs().max().item()
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def _with_hypers(model):
    with torch.no_grad():
        model.kernel.raw_lengthscale.copy_(inverse_softplus(torch.tensor(LENGTHSCALE, dtype=DT)))
    assert torch.allclose(model.kernel.outputscale, torch.tensor(OUTPUTSCALE))
    return model


def _exact(**kwargs):
    return _with_hypers(ExactGP(D, outputscale=OUTPUTSCALE, noise=NOISE, **kwargs).to(DT))


def _sgpr(Z, solver="cholesky", **kwargs):
    model = _with_hypers(SGPR(D, n_inducing=M, jitter=0.0, solver=solver, outputscale=OUTPUTSCALE, noise=NOISE,
                              **kwargs).to(DT))
    with torch.no_grad():
        model.features.Z.copy_(Z)
    return model


def _svgp(Z, jitter, seed=7, **kwargs):
    model = _with_hypers(SVGP(D, n_inducing=M, jitter=jitter, outputscale=OUTPUTSCALE, noise=NOISE,
                              **kwargs).to(DT))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.features.Z.copy_(Z)
        model.q_mu.copy_(0.5 * torch.randn(M, generator=g, dtype=DT))
        lower = 0.2 * torch.randn(M, M, generator=g, dtype=DT).tril(-1)
        diag = torch.diag(0.3 + 0.7 * torch.rand(M, generator=g, dtype=DT))
        upper = torch.randn(M, M, generator=g, dtype=DT).triu(1)  # ignored by both: only the lower triangle counts
        model.q_sqrt_raw.copy_(lower + diag + upper)
    return model


def _peer(ours, name, **kwargs):
    peer = make_peer(name, D, None if name == "gpytorch-exact" else M, dtype=DT, **kwargs)
    return copy_hyperparameters(ours, peer)


def _dense_nystrom(peer, A, B):
    """Q(A, B) = K_AZ K_ZZ^-1 K_ZB with GPyTorch's own base kernel, densely."""
    k = peer.scale_kernel
    Z = peer.inducing_points
    with torch.no_grad():
        Kaz, Kzz, Kzb = (k(A, Z).to_dense(), k(Z, Z).to_dense(), k(Z, B).to_dense())
        return Kaz @ torch.linalg.solve(Kzz, Kzb)


# --- parameters are copied, not assumed -------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["gpytorch-exact", "gpytorch-sgpr", "gpytorch-svgp"])
def test_copy_hyperparameters_sets_every_parameter(data, name):
    X, y, Xs, Z = data
    make = {"gpytorch-exact": _exact, "gpytorch-sgpr": lambda: _sgpr(Z), "gpytorch-svgp": lambda: _svgp(Z, 1e-6)}
    ours = make[name]()
    peer = _peer(ours, name)
    _close(peer.lengthscale, LENGTHSCALE, rtol=1e-12, what="lengthscale")
    _close(peer.outputscale, OUTPUTSCALE, rtol=1e-12, what="outputscale")
    _close(peer.noise, NOISE, rtol=1e-12, what="noise")
    if name != "gpytorch-exact":
        _close(peer.inducing_points, Z, rtol=0, what="Z")
    if name == "gpytorch-svgp":
        q = peer.model.variational_strategy.variational_distribution  # GPyTorch's whitened q(v)
        _close(q.mean, ours.q_mu, rtol=0, what="q mean")
        S = ours.q_sqrt
        _close(q.covariance_matrix, S @ S.T, rtol=1e-12, atol_rel=1e-14, what="q covariance")
        assert peer.model.variational_strategy.jitter_val == ours.jitter
    with pytest.raises(ValueError):  # kinds must correspond
        copy_hyperparameters(ours, make_peer("gpytorch-exact" if name != "gpytorch-exact" else "gpytorch-sgpr",
                                             D, M, dtype=DT))


# --- exact GP ----------------------------------------------------------------------------------------------------

def test_exact_log_marginal_likelihood_and_predictions(data):
    X, y, Xs, _ = data
    ours = _exact()
    peer = _peer(ours, "gpytorch-exact")
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(peer.likelihood, peer.model)
    peer.model.set_train_data(X, y, strict=False)
    peer.model.train()
    theirs = mll(peer.model(X), y) * N
    _close(ours.log_marginal_likelihood(X, y).detach(), theirs.detach(), what="log marginal likelihood")

    ours.fit_posterior(X, y)
    mean, var = ours.predict(Xs)
    peer.model.eval(), peer.likelihood.eval()
    with torch.no_grad(), gpytorch.settings.fast_pred_var(False):
        f = peer.model(Xs)
        y_dist = peer.likelihood(peer.model(Xs))
    _close(mean, f.mean, atol_rel=1e-9, what="latent mean")
    _close(var, f.variance, what="latent variance")
    y_mean, y_var = ours.likelihood.predictive(mean, var)
    _close(y_mean, y_dist.mean, atol_rel=1e-9, what="predictive mean")
    _close(y_var, y_dist.variance, what="predictive variance")
    # the peer's chunked predict is the same computation
    peer.chunk_size = 7
    p_mean, p_var = peer.predict(Xs)
    _close(p_mean, y_dist.mean, rtol=1e-10, atol_rel=1e-12, what="chunked peer predict (mean)")
    _close(p_var, y_dist.variance, rtol=1e-10, what="chunked peer predict (variance)")


# --- SGPR --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("solver", ["cholesky", "qr"])
def test_sgpr_bound_equals_gpytorch(data, solver):
    X, y, _, Z = data
    ours = _sgpr(Z, solver)
    peer = _peer(ours, "gpytorch-sgpr")
    theirs = peer.objective(X, y)  # ExactMarginalLogLikelihood * n, the trace term added as an added loss term
    _close(ours.elbo(X, y).detach(), theirs.detach(), what=f"Titsias bound ({solver})")

    # the test discriminates: without the trace term (log N(y | 0, Q + sigma^2 I) alone) it would fail by far
    peer.model.train()
    with torch.no_grad():
        no_trace = peer.likelihood(peer.model(X)).log_prob(y)
    assert abs(no_trace - theirs).item() > 1e4 * RTOL * abs(theirs).item()


@pytest.mark.parametrize("solver", ["cholesky", "qr"])
def test_sgpr_predictions_equal_gpytorch_without_diagonal_correction(data, solver):
    X, y, Xs, Z = data
    ours = _sgpr(Z, solver, chunk_size=16)  # several chunks in fit_posterior and predict
    ours.fit_posterior(X, y)
    mean, var = ours.predict(Xs)
    peer = _peer(ours, "gpytorch-sgpr", diagonal_correction=False)
    peer.objective(X, y)  # sets the training data
    g_mean, g_var = peer.predict_latent(Xs)
    residual = peer.scale_kernel(Xs, diag=True).detach() - _dense_nystrom(peer, Xs, Xs).diagonal()  # k** - Q**
    _close(mean, g_mean, atol_rel=1e-9, what="latent mean")
    _close(var, g_var + residual, what="latent variance = GPyTorch's SoR variance + (k** - Q**)")
    assert residual.max() > 1e-2  # so that a missing residual would fail
    y_mean, y_var = peer.predict(Xs)
    _close(ours.likelihood.predictive(mean, var)[1], y_var + residual, what="predictive variance")


def test_gpytorch_sgpr_default_prediction_is_fitc_not_ours(data):
    """Documents the benchmark peer: GPyTorch's default SGPR predicts with FITC's equations."""
    X, y, Xs, Z = data
    ours = _sgpr(Z)
    peer = _peer(ours, "gpytorch-sgpr")
    peer.objective(X, y)
    g_mean, g_var = peer.predict_latent(Xs)
    Q = _dense_nystrom(peer, X, X)
    Qsf = _dense_nystrom(peer, Xs, X)
    with torch.no_grad():
        kff = peer.scale_kernel(X, diag=True)
        kss = peer.scale_kernel(Xs, diag=True)
    C = Q + torch.diag(kff - Q.diagonal() + NOISE)  # FITC's training covariance
    _close(g_mean, Qsf @ torch.linalg.solve(C, y), atol_rel=1e-9, what="FITC mean")
    _close(g_var, kss - (Qsf @ torch.linalg.solve(C, Qsf.T)).diagonal(), what="FITC variance")
    ours.fit_posterior(X, y)
    assert (ours.predict(Xs)[0] - g_mean).abs().max() > 1e-2


# --- SVGP --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("jitter", [0.0, 1e-6])
def test_svgp_elbo_kl_and_predictions(data, jitter):
    X, y, Xs, Z = data
    ours = _svgp(Z, jitter)
    peer = _peer(ours, "gpytorch-svgp")
    offset = N * jitter / (2 * NOISE)  # GPyTorch's extra jitter on k(x, x) inside the expected log-likelihood
    theirs = peer.objective(X, y)  # VariationalELBO(num_data=n) * n on the full batch
    _close(ours.elbo(X, y, num_data=N).detach(), theirs.detach() + offset, what="ELBO")
    kl = peer.model.variational_strategy.kl_divergence()
    _close(ours.prior_kl().detach(), kl.detach(), what="KL(q(v) || p(v))")
    assert kl.item() > 10.0  # a non-trivial q: a wrong KL would show

    # a minibatch estimate with num_data = n
    b = 97
    theirs_b = peer.objective(X[:b], y[:b], num_data=N)
    _close(ours.elbo(X[:b], y[:b], num_data=N).detach(), theirs_b.detach() + offset, what="minibatch ELBO")

    ours.fit_posterior(X, y)
    mean, var = ours.predict(Xs)
    g_mean, g_var = peer.predict_latent(Xs)
    _close(mean, g_mean, atol_rel=1e-9, what="latent mean")
    _close(var + jitter, g_var, what="latent variance (+ GPyTorch's jitter_val)")
    y_mean, y_var = peer.predict(Xs)
    _close(ours.likelihood.predictive(mean, var)[1] + jitter, y_var, what="predictive variance")


# --- gradients ---------------------------------------------------------------------------------------------------

def _constrained_grads_ours(model):
    """d objective / d (lengthscale [d], outputscale, noise) from the raw gradients: all are
    offset + softplus(raw), so d/d value = d/d raw / sigmoid(raw)."""
    k, lik = model.kernel, model.likelihood
    return torch.cat([
        k.raw_lengthscale.grad / torch.sigmoid(k.raw_lengthscale.detach()),
        (k.raw_outputscale.grad / torch.sigmoid(k.raw_outputscale.detach())).reshape(1),
        (lik.raw_noise.grad / torch.sigmoid(lik.raw_noise.detach())).reshape(1),
    ])


def _constrained_grads_peer(peer):
    base = peer.scale_kernel
    rbf, noise = base.base_kernel, peer.likelihood.noise_covar
    for module, name in ((rbf, "raw_lengthscale"), (base, "raw_outputscale"), (noise, "raw_noise")):
        transform = getattr(module, name + "_constraint")._transform  # value = lower bound + softplus(raw)
        assert isinstance(transform, torch.nn.Softplus) and transform.beta == 1
    return torch.cat([
        (rbf.raw_lengthscale.grad / torch.sigmoid(rbf.raw_lengthscale.detach())).reshape(-1),
        (base.raw_outputscale.grad / torch.sigmoid(base.raw_outputscale.detach())).reshape(1),
        (noise.raw_noise.grad / torch.sigmoid(noise.raw_noise.detach())).reshape(1),
    ])


@pytest.mark.parametrize("solver", ["cholesky", "qr"])
def test_sgpr_gradients_equal_gpytorch(data, solver):
    X, y, _, Z = data
    ours = _sgpr(Z, solver, chunk_size=128)  # 3 chunks: the checkpointed (recomputed) path of the linear engine
    peer = _peer(ours, "gpytorch-sgpr")
    ours.elbo(X, y).backward()
    peer.objective(X, y).backward()
    g_ours, g_peer = _constrained_grads_ours(ours), _constrained_grads_peer(peer)
    _close(g_ours, g_peer, atol_rel=1e-9, what="d bound / d (lengthscale, outputscale, noise)")
    _close(ours.features.Z.grad, peer.model.covar_module.inducing_points.grad, atol_rel=1e-9, what="d bound / d Z")
    # discriminates: the trace term alone moves the noise gradient by far more than the tolerance
    trace = (N * OUTPUTSCALE - _dense_nystrom(peer, X, X).trace()) / (2 * NOISE**2)  # d/d noise of -tr/(2 s2)
    assert trace.abs() > 1e3 * RTOL * g_peer[-1].abs()


def test_exact_and_svgp_gradients_equal_gpytorch(data):
    X, y, _, Z = data
    ours = _exact()
    peer = _peer(ours, "gpytorch-exact")
    ours.log_marginal_likelihood(X, y).backward()
    peer.objective(X, y).backward()
    _close(_constrained_grads_ours(ours), _constrained_grads_peer(peer), atol_rel=1e-9, what="exact gradients")

    ours = _svgp(Z, jitter=0.0)
    peer = _peer(ours, "gpytorch-svgp")
    ours.elbo(X, y, num_data=N).backward()
    peer.objective(X, y).backward()
    _close(_constrained_grads_ours(ours), _constrained_grads_peer(peer), atol_rel=1e-9, what="SVGP hyper gradients")
    strategy = peer.model.variational_strategy
    q = strategy._variational_distribution
    _close(ours.features.Z.grad, strategy.inducing_points.grad, atol_rel=1e-9, what="d ELBO / d Z")
    _close(ours.q_mu.grad, q.variational_mean.grad, atol_rel=1e-9, what="d ELBO / d q_mu")
    _close(ours.q_sqrt_raw.grad.tril(), q.chol_variational_covar.grad.tril(), atol_rel=1e-9,
           what="d ELBO / d q_sqrt")


# --- training: our loop and the peer's take the same Adam steps ------------------------------------------------

@pytest.mark.parametrize("name", ["gpytorch-exact", "gpytorch-sgpr", "gpytorch-svgp"])
def test_training_trajectories_agree(data, name):
    X, y, _, _ = data
    common = dict(outputscale=OUTPUTSCALE, noise=NOISE, noise_floor=1e-4)  # GPyTorch's noise parametrisation
    if name == "gpytorch-exact":
        ours = _exact(noise_floor=1e-4)
    elif name == "gpytorch-sgpr":
        ours = _with_hypers(SGPR(D, n_inducing=M, jitter=0.0, **common).to(DT))
    else:
        # GPyTorch's examples train q with Adam, as ours does without natural gradients
        ours = _with_hypers(SVGP(D, n_inducing=M, jitter=0.0, natural_gradients=False, **common).to(DT))
    peer = _peer(ours, name)
    Z0 = None if name == "gpytorch-exact" else kmeans_centers(X, M, 0)  # what fit's model.initialise_from_data uses
    epochs, lr, batch = 6, 0.05, 64
    fit(ours, X, y, epochs=epochs, lr=lr, batch_size=batch, seed=0, progress=False)
    seconds = peer.fit(X, y, epochs=epochs, lr=lr, batch_size=batch, seed=0, Z=Z0)
    assert len(seconds) == epochs and all(s > 0 for s in seconds)
    moved = (ours.kernel.lengthscale - torch.tensor(LENGTHSCALE)).abs().min()
    assert moved > 1e-2  # training did something, so agreement is not trivial
    _close(peer.lengthscale, ours.kernel.lengthscale.detach(), rtol=1e-6, what="lengthscale after training")
    _close(peer.outputscale, ours.kernel.outputscale.detach(), rtol=1e-6, what="outputscale after training")
    _close(peer.noise, ours.noise.detach(), rtol=1e-6, what="noise after training")
    if name != "gpytorch-exact":
        _close(peer.inducing_points, ours.features.Z.detach(), rtol=1e-6, atol_rel=1e-9, what="Z after training")
    # and the trained models predict alike (y-moments; SGPR: GPyTorch's FITC default is not compared)
    if name != "gpytorch-sgpr":
        mean, var = ours.likelihood.predictive(*ours.predict(X[:50]))
        g_mean, g_var = peer.predict(X[:50])
        _close(mean, g_mean, rtol=1e-5, atol_rel=1e-7, what="trained predictive mean")
        _close(var, g_var, rtol=1e-5, what="trained predictive variance")

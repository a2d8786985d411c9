"""GPyTorch baselines, written as a GPyTorch user would write them, to run side by side with gpscale.

Three GPyTorch peers, registered for the benchmark as methods (``PEERS`` also registers ``softki-official``, the SoftKI
authors' code, from :mod:`gpscale.bench.official_softki`: the same ``fit`` and ``predict``, a mean only):

- ``gpytorch-exact``: :class:`gpytorch.models.ExactGP`, full-batch Adam on ``ExactMarginalLogLikelihood``;
- ``gpytorch-sgpr``: an ExactGP whose kernel is an :class:`~gpytorch.kernels.InducingPointKernel` (Titsias'
  collapsed bound: the trace term enters ``ExactMarginalLogLikelihood`` as an added loss term), full-batch Adam;
- ``gpytorch-svgp``: an :class:`~gpytorch.models.ApproximateGP` with a ``CholeskyVariationalDistribution`` and a
  whitened ``VariationalStrategy(learn_inducing_locations=True)``, Adam on all parameters (model and likelihood)
  on ``VariationalELBO(num_data=n)``, minibatches from a seeded reshuffle every epoch.

All use ``ZeroMean`` (our models are zero-mean on standardised y), ``ScaleKernel(RBFKernel(ard_num_dims=d))`` and
``GaussianLikelihood()`` with a learned noise and GPyTorch's default constraints (noise > 1e-4) and default
settings (for instance Cholesky up to n = 800 and CG/Lanczos above, unless ``max_cholesky_size`` is given).

Interface (uniform over the three)::

    peer = make_peer("gpytorch-svgp", n_features=d, n_inducing=m, dtype=torch.float64)
    seconds = peer.fit(X, y, epochs=50, lr=0.01, batch_size=1024, seed=0, Z=kmeans_centers(X, m, 0))
    mean, var = peer.predict(X_test)            # moments of y (noise included)
    mean_f, var_f = peer.predict_latent(X_test) # moments of the latent f
    value = peer.objective(X, y)                # the training objective (log marginal likelihood / bound /
                                                # ELBO, summed over points, not per point), differentiable

:func:`copy_hyperparameters` puts a gpscale model's parameters into a peer, so that the two can be compared on
identical parameters. Three GPyTorch conventions differ from ours and are *not* changed by it:

- GPyTorch's ``InducingPointKernel`` adds no jitter to K_uu (ours adds ``SGPR.jitter``);
- GPyTorch's whitened ``VariationalStrategy`` adds ``jitter_val`` both to K_uu (as ours adds ``SVGP.jitter``;
  copy_hyperparameters sets ``jitter_val = ours.jitter``) *and* to the prior variance k(x, x) of every predicted
  point, so its latent predictive variance (and hence its expected log-likelihood) is larger than ours by exactly
  ``jitter_val``;
- GPyTorch's SGPR predicts FITC-style by default (see :class:`SGPRPeer`); its objective is Titsias' bound, as ours.
"""
try:
    import gpytorch  # noqa: F401 - every module of this package builds on it
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        "The GPyTorch peer baselines need gpytorch: pip install 'gpscale[bench]' (or pip install gpytorch)."
    ) from err

from .hyperparameters import copy_hyperparameters  # noqa: E402 - after the check for gpytorch
from .methods import PEERS, ExactPeer, SGPRPeer, SVGPPeer, make_peer  # noqa: E402
from .peer import PeerModel  # noqa: E402

__all__ = ["PEERS", "PeerModel", "ExactPeer", "SGPRPeer", "SVGPPeer", "make_peer", "copy_hyperparameters"]

"""A gpscale model's parameters put into its GPyTorch peer, so that the two can be compared on identical
parameters."""
from __future__ import annotations

import torch

from .methods import ExactPeer, SGPRPeer, SVGPPeer
from .peer import PeerModel


def copy_hyperparameters(ours, peer: PeerModel) -> PeerModel:
    """Give ``peer`` the parameters of our model ``ours`` (an ``ExactGP``, ``SGPR`` or ``SVGP`` of gpscale):
    lengthscales, outputscale, noise, inducing points and, for SVGP, the whitened q(v) and the K_uu jitter
    (``jitter_val = ours.jitter``). Returns ``peer``.

    Raises ValueError when the two do not correspond (model kinds, kernel other than RBF, dimensions, number of
    inducing points) or when our noise is below GPyTorch's noise constraint (1e-4 by default).
    """
    from ...kernels.stationary import RBF
    from ...models.exact.gp import ExactGP
    from ...models.linear.sgpr import SGPR
    from ...models.variational.svgp import SVGP

    pairs = {ExactPeer: ExactGP, SGPRPeer: SGPR, SVGPPeer: SVGP}
    expected = pairs[type(peer)]
    if type(ours) is not expected:
        raise ValueError(f"{peer.name} corresponds to gpscale's {expected.__name__}, got {type(ours).__name__}.")
    if not isinstance(ours.kernel, RBF):
        raise ValueError(f"The GPyTorch peers use an RBF kernel; our model has {type(ours.kernel).__name__}.")
    d = peer.n_features
    if ours.n_features != d:
        raise ValueError(f"Input dimensions differ: ours {ours.n_features}, peer {d}.")
    noise = ours.noise.detach()
    lower = peer.likelihood.noise_covar.raw_noise_constraint.lower_bound
    if noise <= lower:
        raise ValueError(f"Our noise {noise.item():.3g} is not above GPyTorch's noise constraint ({lower.item():.3g}).")

    with torch.no_grad():
        base = peer.scale_kernel
        base.base_kernel.lengthscale = ours.kernel.lengthscale.detach().expand(d).reshape(1, d).to(peer.dtype)
        base.outputscale = ours.kernel.outputscale.detach().to(peer.dtype)
        peer.likelihood.noise = noise.reshape(1).to(peer.dtype)
        if isinstance(ours, (SGPR, SVGP)):
            Z = ours.features.Z
            if Z.shape[0] != peer.n_inducing:
                raise ValueError(f"Numbers of inducing points differ: ours {Z.shape[0]}, peer {peer.n_inducing}.")
            peer.set_inducing_points(Z.detach())
    if isinstance(ours, SVGP):
        if not ours.whiten:  # GPyTorch's VariationalStrategy holds the whitened q(v)
            raise ValueError("copy_hyperparameters copies a whitened q; this SVGP has whiten=False.")
        peer.strategy.jitter_val = float(ours.jitter)
        peer.set_variational(ours.q_mu.detach(), ours.q_sqrt.detach())
    peer.reset_caches()
    return peer

"""The variational engine: a Gaussian q(u) over inducing features, trained on the minibatch ELBO; svgp and odvgp."""
from .decoupled import OrthogonallyDecoupledGP
from .engine import VariationalGP
from .odvgp import ODVGP
from .svgp import SVGP

__all__ = ["OrthogonallyDecoupledGP", "ODVGP", "SVGP", "VariationalGP"]

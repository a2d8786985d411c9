"""GP-GRIEF: grief (GP-GRIEF-II, the evidence maximised over the kernel) and grief-i (GP-GRIEF-I, MCMC over the
eigenvalue weights)."""
from .grief_i import GRIEFI
from .grief_ii import GRIEFII

__all__ = ["GRIEFI", "GRIEFII"]

"""Variational Fourier features: vff (the collapsed bound), odvff and vff-svgp (the variational engine)."""
from .vff import ODVFF, VFF, VFFSVGP, FourierFeatures

__all__ = ["FourierFeatures", "ODVFF", "VFF", "VFFSVGP"]

"""Convolutional GPs over image patches: conv-svgp, conv-hvgp and deep-conv-hvgp."""
from .convgp import ConvHVGP, ConvSVGP
from .deep_conv import DeepConvHVGP

__all__ = ["ConvHVGP", "ConvSVGP", "DeepConvHVGP"]

"""Iterative solves of symmetric positive definite systems given only their matrix-vector product."""
from __future__ import annotations

import warnings
from typing import Callable

import torch
from torch import Tensor

from .factor import NumericalWarning


def conjugate_gradients(matvec: Callable[[Tensor], Tensor], b: Tensor, *,
                        preconditioner: Callable[[Tensor], Tensor] | None = None, tol: float = 1e-8,
                        max_iterations: int | None = None) -> tuple[Tensor, int]:
    """Solve ``K x = b`` for a symmetric positive definite K given by ``matvec`` (x -> K x, for b [n]) by
    (preconditioned) conjugate gradients from x = 0, stopping when ``||b - K x|| <= tol ||b||``.

    ``preconditioner`` applies ``M^{-1}`` for an SPD M close to K (e.g. :meth:`gpscale.models.grief.grief_ii.GRIEFII.
    preconditioner`). Returns x and the number of iterations; warns (:class:`NumericalWarning`) when
    ``max_iterations`` (default n) pass without reaching ``tol``.
    """
    precondition = preconditioner if preconditioner is not None else (lambda v: v)
    x = torch.zeros_like(b)
    r = b.clone()
    z = precondition(r)
    d, rz = z, r @ z
    target = tol * torch.linalg.vector_norm(b)
    limit = b.shape[0] if max_iterations is None else max_iterations
    for iteration in range(limit):
        if torch.linalg.vector_norm(r) <= target:
            return x, iteration
        Kd = matvec(d)
        step = rz / (d @ Kd)
        x, r = x + step * d, r - step * Kd
        z = precondition(r)
        rz, rz_old = r @ z, rz
        d = z + (rz / rz_old) * d
    if torch.linalg.vector_norm(r) > target:
        warnings.warn(f"Conjugate gradients stopped after {limit} iterations with a relative residual of "
                      f"{(torch.linalg.vector_norm(r) / torch.linalg.vector_norm(b)).item():.2e} > tol = {tol}. "
                      "Raise max_iterations, loosen tol, or pass a preconditioner.", NumericalWarning, stacklevel=2)
    return x, limit

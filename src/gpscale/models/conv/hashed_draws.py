"""Counter-based standard normal draws: numbers that are a function of a row of inputs and a key alone, so that a
row draws the same numbers in any batch, chunk, order or process, in either dtype and on any device.

An integer hash of (row, key, index) gives two uniforms per number, and the Box-Muller transform a normal one; the
hash is int64 arithmetic mod a prime below 2^31, tensor operations only, nothing read back to the host.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

# a prime below 2^31: a residue (or the prime) times a multiplier stays below 2^62: int64 arithmetic never overflows
PRIME = 2_147_483_647
_ROUNDS = (1_103_515_245, 1_664_525_013, 2_013_314_713)  # multipliers of the hash's rounds, residues mod PRIME
# numbers a block of row_noise on a CPU: twice torch's grain below which an operator runs on one thread, so that
# every block uses all threads while the hash's int64 passes over it stay in cache
NOISE_BLOCK = 65_536


def _mix(x: Tensor) -> Tensor:
    """An elementwise hash of int64 residues mod PRIME: rounds of a multiplication mod PRIME and an xor-shift
    taken mod PRIME. The xor-shift of a residue (below 2^31) is at most 2^31 - 1 = PRIME, so its residue is itself
    but at PRIME, which is 0: the next round's product does not tell them apart, and after the last round one
    comparison sets it, cheaper than an integer division in every round."""
    for a in _ROUNDS:
        x = (x * a + 12345) % PRIME
        x = x ^ (x >> 15)
    return x.masked_fill_(x == PRIME, 0)


def row_noise(X: Tensor, key: int | Tensor, size: int) -> Tensor:
    """Standard normal numbers [n, size] (float64, on X's device) that are a function of ``key`` (an int or a 0-dim
    int64 tensor in [0, 2^31 - 1)) and of the bits of each row of X rounded to float32 alone: a counter-based
    generator, hashing (row, key, index) into two uniforms per number for the Box-Muller transform. So a row draws
    the same numbers in any batch, chunk, order or process, in float32 as in float64, and on any device, with
    tensor operations only (nothing read back to the host)."""
    bits = X.detach().to(torch.float32).contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF  # [n, d]
    weights = _mix(torch.arange(1, X.shape[1] + 1, device=X.device))  # a multiplier per column, [d]
    rows = _mix((((bits % PRIME) * weights) % PRIME).sum(-1) % PRIME)  # [n]
    rows = _mix((rows + key) % PRIME)
    index = _mix(torch.arange(2 * size, device=X.device))  # [2 size]
    noise = torch.empty(X.shape[0], size, dtype=torch.float64, device=X.device)
    # on a CPU in blocks of about NOISE_BLOCK numbers, so that the hash's int64 passes stay in cache
    width = size if X.device.type != "cpu" else min(size, max(256, NOISE_BLOCK // max(1, X.shape[0])))
    for start in range(0, size, max(1, width)):
        columns = slice(start, min(size, start + width))
        radius, angle = _uniforms(rows, index[columns]), _uniforms(rows, index[size:][columns])
        torch.mul((-2.0 * radius.log()).sqrt(), torch.cos(2.0 * math.pi * angle), out=noise[:, columns])
    return noise


def _uniforms(rows: Tensor, index: Tensor) -> Tensor:
    """Uniforms in (0, 1) [n, k] hashed from the rows' hashes [n] and the indices' [k]."""
    return (_mix((rows.unsqueeze(-1) + index) % PRIME).to(torch.float64) + 0.5) / PRIME

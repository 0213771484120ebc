"""Random numbers that belong to a Gaussian, not to a position in memory.

A stream (``torch.normal`` with a generator) hands its numbers out in storage
order, so a split would draw different samples when the same Gaussians are
stored in another order or spread over ranks. Here every number is a hash of
the Gaussian's key and of what it is for (the densification event, the
child, the coordinate): a counter-based generator, the idea of Philox, with
splitmix64's finaliser as the hash.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

_GOLDEN = 0x9E3779B97F4A7C15  # 2^64 / golden ratio: splitmix64's increment
_MUL1, _MUL2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _signed(value: int) -> int:
    """A 64-bit pattern as the int64 torch stores."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def _shift_right(x: Tensor, bits: int) -> Tensor:
    """Logical (unsigned) right shift of int64 bit patterns."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix(x: Tensor) -> Tensor:
    """splitmix64's finaliser on int64 tensors (multiplication wraps modulo 2^64)."""
    x = (x ^ _shift_right(x, 30)) * _signed(_MUL1)
    x = (x ^ _shift_right(x, 27)) * _signed(_MUL2)
    return x ^ _shift_right(x, 31)


def keyed_hash(keys: Tensor, *words: int) -> Tensor:
    """64 random bits per key, a function of the key and ``words`` alone."""
    x = keys
    for word in words:
        x = mix(x + _signed(_GOLDEN * (word + 1)))
    return x


def keyed_uniform(keys: Tensor, *words: int) -> Tensor:
    """float64 in (0, 1) per key: the hash's top 53 bits, centred in their interval."""
    bits = _shift_right(keyed_hash(keys, *words), 11)
    return (bits.to(torch.float64) + 0.5) / 2.0 ** 53


def keyed_normal(keys: Tensor, count: int, *words: int) -> Tensor:
    """[len(keys), count] standard normal float64 samples (Box-Muller)."""
    columns = []
    for i in range(count):
        radius = torch.sqrt(-2.0 * torch.log(keyed_uniform(keys, *words, i, 0)))
        columns.append(radius * torch.cos(2.0 * math.pi * keyed_uniform(keys, *words, i, 1)))
    return torch.stack(columns, dim=1)

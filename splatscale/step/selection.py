"""The k smallest rows of all ranks, chosen without gathering them.

Densification under a budget keeps the rows with the largest gradients, and
MCMC keeps the earliest arrivals; with the rows spread over ranks, each rank
must know which of its own rows are among the k first of the whole. Rows are
ordered by a pair of int64 words (a value made orderable, then the Gaussian's
key, so no two rows tie), and the k-th pair is found by bisection on each
word, one count summed over the ranks per halving: 128 small all-reduces,
whatever the number of rows or ranks, and the same answer for any storage
order or sharding.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

import torch
from torch import Tensor

Number = TypeVar("Number", int, float)


class Total(Protocol):
    """A number summed over the ranks that hold the rows (the identity in one process)."""

    def __call__(self, value: Number, /) -> Number: ...


_INT64 = (-(1 << 63), (1 << 63) - 1)


def ascending(values: Tensor) -> Tensor:
    """int64 words in the order of the float ``values`` (no NaN): smaller first."""
    bits = values.to(torch.float64).view(torch.int64)
    return bits ^ ((bits >> 63) & _INT64[1])  # negatives: all but the sign flipped


def descending(values: Tensor) -> Tensor:
    """int64 words in the reverse order of ``values``: larger first."""
    return ~ascending(values)


def _first_reaching(words: Tensor, need: int, total: Total) -> int:
    """The smallest t with at least ``need`` words <= t over all ranks (need >= 1,
    and reachable)."""
    ordered = torch.sort(words).values
    low, high = _INT64
    while low < high:
        middle = (low + high) // 2
        at_most = int(torch.searchsorted(ordered, torch.tensor([middle]), right=True))
        if total(at_most) >= need:
            high = middle
        else:
            low = middle + 1
    return low


def smallest(primary: Tensor, secondary: Tensor, k: int, total: Total) -> Tensor:
    """Mask of this rank's rows among the ``k`` smallest (primary, secondary) pairs of
    all ranks' rows; pairs are distinct. Collective: every rank calls it with the
    same ``k``."""
    device, everyone = primary.device, total(len(primary))
    if k >= everyone:
        return torch.ones(len(primary), dtype=torch.bool, device=device)
    if k <= 0:
        return torch.zeros(len(primary), dtype=torch.bool, device=device)
    primary, secondary = primary.cpu(), secondary.cpu()
    first = _first_reaching(primary, k, total)
    below = primary < first
    tied = primary == first
    last = _first_reaching(secondary[tied], k - total(int(below.sum())), total)
    chosen = below | (tied & (secondary <= last))
    return chosen.to(device)

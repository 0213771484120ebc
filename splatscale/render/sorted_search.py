"""A binary search in an ascending array, compiled: numpy's ``searchsorted`` (side
left) for one value, written out (numba's took seconds longer to compile)."""

from __future__ import annotations

import numba


@numba.njit(cache=True)
def first_at_least(ascending, value):  # pragma: no cover - compiled
    """The first index of ``ascending`` whose element is at least ``value`` (its length
    if none is)."""
    lo, hi = 0, ascending.shape[0]
    while lo < hi:
        mid = (lo + hi) // 2
        if ascending[mid] < value:
            lo = mid + 1
        else:
            hi = mid
    return lo

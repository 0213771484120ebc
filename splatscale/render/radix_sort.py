"""A stable sort of non-negative 32-bit keys (float32 depths' bit patterns), with
the permutation: a least-significant-digit radix sort, in parallel.

torch's stable sort of int32 keys costs several times this one at the splat counts
of small images (docs/benchmarks.md). Each key is packed with its index into one
64-bit word, so each pass moves one array, and a pass whose digit every key shares
is skipped."""

from __future__ import annotations

import numba
import numpy as np

# (first key bit, bits) of each pass: the 31 bits of a non-negative int32 in three
# digits, the widest 11 bits (buckets beyond a few thousand scatter slower).
PASSES = ((0, 10), (10, 10), (20, 11))
DIGITS = 1 << max(bits for _, bits in PASSES)
KEY_SHIFT = 32  # the key in a word's high half, its index in the low half


def stable_sort(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``keys`` (int32 [N], each >= 0, N < 2**32) sorted ascending, and the int64
    permutation that sorts them, equal keys in their order (``torch.sort(keys,
    stable=True)``'s values and indices)."""
    if keys.dtype != np.int32:
        raise TypeError(f"stable_sort sorts int32 keys, not {keys.dtype}")
    return _radix_sort(np.ascontiguousarray(keys), numba.get_num_threads())


@numba.njit(parallel=True, cache=True)
def _radix_sort(keys, parts):  # pragma: no cover - compiled
    """``parts`` runs of the words are counted and scattered in parallel, each digit
    taking the runs in order: the result is the sequential sort's for any ``parts``."""
    count = keys.shape[0]
    words = np.empty(count, np.uint64)
    spare = np.empty(count, np.uint64)
    for i in numba.prange(count):
        words[i] = (np.uint64(keys[i]) << np.uint64(KEY_SHIFT)) | np.uint64(i)
    size = (count + parts - 1) // parts
    cursors = np.zeros((parts, DIGITS), np.int64)
    for first, bits in PASSES:
        shift, mask = np.uint64(KEY_SHIFT + first), np.uint64((1 << bits) - 1)
        if _count_digits(words, shift, mask, size, cursors):
            _scatter(words, spare, shift, mask, size, cursors)
            words, spare = spare, words
    values, order = np.empty(count, np.int32), np.empty(count, np.int64)
    for i in numba.prange(count):
        values[i] = words[i] >> np.uint64(KEY_SHIFT)
        order[i] = words[i] & np.uint64(0xFFFFFFFF)
    return values, order


@numba.njit(parallel=True, cache=True)
def _count_digits(words, shift, mask, size, cursors):  # pragma: no cover - compiled
    """cursors[p, d]: where run p's first word of digit d (its bits ``mask`` after
    ``shift``) goes; False (and nothing to move) where every word has the same digit."""
    parts = cursors.shape[0]
    for part in numba.prange(parts):
        run = cursors[part]
        run[:] = 0
        for i in range(part * size, min(words.shape[0], (part + 1) * size)):
            run[(words[i] >> shift) & mask] += 1
    start = 0
    for digit in range(DIGITS):
        in_digit = 0
        for part in range(parts):
            in_digit += cursors[part, digit]
        if in_digit == words.shape[0]:
            return False
        for part in range(parts):
            here = cursors[part, digit]
            cursors[part, digit] = start
            start += here
    return True


@numba.njit(parallel=True, cache=True)
def _scatter(words, out, shift, mask, size, cursors):  # pragma: no cover - compiled
    for part in numba.prange(cursors.shape[0]):
        run = cursors[part]
        for i in range(part * size, min(words.shape[0], (part + 1) * size)):
            digit = (words[i] >> shift) & mask
            out[run[digit]] = words[i]
            run[digit] += 1

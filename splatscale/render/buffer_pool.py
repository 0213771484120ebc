"""Large scratch buffers kept from one render for the next (the cpu backend's).

A render's packed splats, one 64-byte row per intersection (over a hundred
megabytes at a million Gaussians in view of a megapixel), lie above glibc's
largest mapping threshold (``allocator.py``): a fresh buffer is mapped, faulted in
page by page and unmapped again on every render. ``BufferPool.lend`` hands out a
buffer an earlier render gave back instead.

Ownership is explicit: a buffer returns to the pool only through ``give_back``,
by its borrower, once nothing reads or writes it any more; one never given back
is freed as any tensor is. So the pool never holds a buffer that is lent.
"""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from splatscale.allocator import MMAP_THRESHOLD

# A buffer is made this much larger than asked for: the next renders' intersections
# grow with the model, and pages never written cost no memory.
HEADROOM = 1.25


def _torch_empty(count: int, dtype: torch.dtype) -> Tensor:
    return torch.empty(count, dtype=dtype)


class BufferPool:
    """Up to ``kept`` buffers given back, each lent again to a request it fits; a new
    buffer ``headroom`` times the size asked for, made by ``allocate(count, dtype)``
    (flat, uninitialised)."""

    def __init__(self, kept: int = 4, headroom: float = HEADROOM,
                 allocate: Callable[[int, torch.dtype], Tensor] = _torch_empty) -> None:
        self.kept, self.headroom, self.allocate = kept, headroom, allocate
        self._free: list[Tensor] = []  # flat, each its storage's whole length
        # The addresses of the buffers lent (one never given back stays: a few integers,
        # as freed memory is mapped again at the same addresses).
        self._lent: set[int] = set()
        self._lock = threading.Lock()  # the viewer renders beside training

    def lend(self, rows: int, width: int, dtype: torch.dtype) -> Tensor:
        """An uninitialised contiguous CPU tensor [rows, width] of ``dtype``: the
        smallest buffer given back that fits it, else a new one. One below glibc's
        mapping threshold is always new (glibc keeps such memory itself)."""
        count = rows * width
        if count == 0 or count * dtype.itemsize < MMAP_THRESHOLD:
            return self.allocate(count, dtype).view(rows, width)
        with self._lock:
            fitting = [b for b in self._free if b.dtype == dtype and b.numel() >= count]
            if fitting:
                buffer = min(fitting, key=Tensor.numel)
                self._drop(buffer)
            else:
                buffer = self.allocate(int(count * self.headroom), dtype)
                # Outgrown: the largest that no longer fits (the one this request had).
                smaller = [b for b in self._free if b.dtype == dtype]
                if smaller:
                    self._drop(max(smaller, key=Tensor.numel))
            self._lent.add(buffer.data_ptr())
        return buffer[:count].view(rows, width)

    def give_back(self, lent: Tensor) -> None:
        """``lent`` (from ``lend``) for later requests. Pre: nothing reads or writes it
        or a view of it any more. The smallest buffer goes where more than ``kept``
        would be held."""
        if lent.numel() == 0 or _nbytes(lent) < MMAP_THRESHOLD:
            return
        whole = torch.empty(0, dtype=lent.dtype).set_(lent.untyped_storage())
        with self._lock:
            if whole.data_ptr() not in self._lent:
                raise ValueError("a buffer given back that is not lent (or given back twice)")
            self._lent.remove(whole.data_ptr())
            self._free.append(whole)
            if len(self._free) > self.kept:
                self._drop(min(self._free, key=_nbytes))

    def held_bytes(self) -> int:
        """The bytes of the buffers given back and not lent again."""
        with self._lock:
            return sum(map(_nbytes, self._free))

    def _drop(self, buffer: Tensor) -> None:
        # By identity: a tensor's == compares its elements.
        self._free = [b for b in self._free if b is not buffer]

    def clear(self) -> None:
        """Free every buffer given back."""
        with self._lock:
            self._free = []


def _nbytes(buffer: Tensor) -> int:
    return buffer.numel() * buffer.dtype.itemsize


def huge_paged(count: int, dtype: torch.dtype) -> Tensor:
    """A buffer numpy allocates: numpy asks the kernel for huge pages for a large array
    (torch does not), and scattered reads and writes then miss the TLB less."""
    return torch.from_numpy(np.empty(count, torch.empty(0, dtype=dtype).numpy().dtype))


# The cpu backend's packed intersections (``rasterize``).
INTERSECTION_ROWS = BufferPool()
# The cpu backend's binning temporaries (``binning``): its rows, boxes and spans.
BINNING_SCRATCH = BufferPool(kept=6, allocate=huge_paged)

"""Buffers for the dense gradients of the CPU kernels' backward passes.

A gradient of every Gaussian is a large buffer (SH's at a million Gaussians: 180 MB),
above glibc's largest mapping threshold (``allocator.py``): a fresh one is mapped
and faulted in, page by page, on every step. Within ``reusing``, ``empty_like``
hands out the buffers the caller gave instead, as they are: the rows that own a
model give last step's gradients back for the next (``engine/rows.py``). The
kernels that take them write every value, zero where a Gaussian has no gradient, so
no pass zeroes them first.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator

import torch
from torch import Tensor

_spares: ContextVar[list[Tensor] | None] = ContextVar("spares", default=None)


@contextmanager
def reusing(buffers: list[Tensor]) -> Iterator[None]:
    """Within: ``empty_like`` takes its buffers from ``buffers`` where one fits,
    removing it from the list. Pre: nothing else reads or writes them; a buffer
    taken is its taker's alone (autograd keeps a gradient that only it holds as the
    parameter's, without copying it)."""
    token = _spares.set(buffers)
    try:
        yield
    finally:
        _spares.reset(token)


def empty_like(like: Tensor) -> Tensor:
    """A contiguous ``torch.empty_like(like)``, its values unset: one of ``reusing``'s
    buffers, as it is, where one has its shape, dtype and device."""
    spares = _spares.get()
    if spares is not None:
        for i, spare in enumerate(spares):
            if (spare.shape == like.shape and spare.dtype == like.dtype
                    and spare.device == like.device and spare.is_contiguous()):
                return spares.pop(i)
    return torch.empty_like(like, memory_format=torch.contiguous_format)

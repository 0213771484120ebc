"""A storage order for Gaussians that follows space: their Morton (Z-order) curve.

Every stage of a step reads a view's splats by storage position: binning and
packing gather them tile by tile, nearest first, and the backward pass scatters
their gradients back. Gaussians near each other in space are near each other in a
tile's list, so stored in Morton order those reads share cache lines and pages;
stored as densification leaves them (new rows appended, pruned rows closed up) or as
a point cloud arrives, nearly every read is a miss. Results do not depend on the
storage order (``DESIGN.md``, order independence: equal depths are ordered by
key, a split's samples drawn by key), so the order changes no trained value.
"""

from __future__ import annotations

import torch
from torch import Tensor

BITS = 21  # per axis: 63 of an int64's bits
CELLS = (1 << BITS) - 1


def spread_bits(q: Tensor) -> Tensor:
    """Integers of up to ``BITS`` bits (int64) with two zero bits after each bit, so
    that three of them interleave by shifts and ors."""
    q = (q | (q << 32)) & 0x1F00000000FFFF
    q = (q | (q << 16)) & 0x1F0000FF0000FF
    q = (q | (q << 8)) & 0x100F00F00F00F00F
    q = (q | (q << 4)) & 0x10C30C30C30C30C3
    return (q | (q << 2)) & 0x1249249249249249


def morton_codes(means: Tensor) -> Tensor:
    """Each row of ``means`` [N, 3]'s cell on the Morton curve of a 2^21 grid over the
    finite rows' bounding box (int64; a non-finite coordinate counts as the box's low
    side)."""
    means = means.detach().double()
    finite = means.isfinite().all(dim=1)
    if not finite.any():
        return torch.zeros(len(means), dtype=torch.int64, device=means.device)
    low = means[finite].min(dim=0).values
    span = (means[finite].max(dim=0).values - low).clamp_min(1e-300)
    cells = ((means - low) / span * CELLS).nan_to_num(0.0, 0.0, 0.0).clamp(0, CELLS).long()
    return (spread_bits(cells[:, 0]) | spread_bits(cells[:, 1]) << 1
            | spread_bits(cells[:, 2]) << 2)


def spatial_order(means: Tensor) -> Tensor:
    """The permutation that stores rows of ``means`` [N, 3] in Morton order (stable:
    rows of one cell keep their order)."""
    return torch.sort(morton_codes(means), stable=True).indices

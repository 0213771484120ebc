"""Tile binning: which splats touch which 16x16 tile, front to back per tile."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from splatscale.render.conventions import TILE_SIZE


@dataclass
class TileBins:
    """Intersections of one camera's splats with the tiles of a band of rows.

    The band covers tile rows ``[tile_row0, tile_row0 + tile_rows)`` of the
    image's fixed tile grid, so each tile sees exactly the splats, in exactly
    the order, that a full render gives it. ``splat_ids[offsets[t]:offsets[t+1]]``
    are the splats of band tile t (row-major), nearest first.
    """

    splat_ids: Tensor   # [I] int64
    offsets: Tensor     # [tiles + 1] int64
    tiles_x: int
    tile_row0: int
    tile_rows: int


def tile_boxes(means2d: Tensor, radii: Tensor) -> tuple[Tensor, Tensor]:
    """Each splat's box in tiles: [lo, hi) per axis, int32 [M, 2] each, unclipped."""
    centre = means2d.detach() / TILE_SIZE
    extent = radii.to(centre.dtype) / TILE_SIZE
    return (torch.floor(centre - extent).to(torch.int32),
            torch.ceil(centre + extent).to(torch.int32))


def bin_tiles(means2d: Tensor, radii: Tensor, depths: Tensor, keys: Tensor, width: int,
              rows: tuple[int, int]) -> TileBins:
    """Bin splats into the tiles overlapping pixel rows ``[rows[0], rows[1])``.

    Each tile's splats are nearest first; equal depths (a clone has its parent's)
    are ordered by ``keys``, which travel with the Gaussians, so the order does not
    depend on where they are stored.
    """
    y0, y1 = rows
    tiles_x = -(-width // TILE_SIZE)
    tile_row0, tile_row1 = y0 // TILE_SIZE, -(-y1 // TILE_SIZE)
    n_tiles = tiles_x * (tile_row1 - tile_row0)
    with torch.no_grad():
        lo, hi = tile_boxes(means2d, radii)
        x_lo, x_hi = lo[:, 0].clamp(0, tiles_x), hi[:, 0].clamp(0, tiles_x)
        y_lo = lo[:, 1].clamp(tile_row0, tile_row1)
        y_hi = hi[:, 1].clamp(tile_row0, tile_row1)
        span_x = x_hi - x_lo
        counts = span_x * (y_hi - y_lo)
        counts[(radii <= 0).any(dim=-1)] = 0

        # Emit intersections nearest splat first; a stable sort by tile keeps that order.
        # Positive floats order like their bit patterns, and integer sorts are faster.
        depth_bits = depths.detach().view(torch.int32 if depths.dtype == torch.float32
                                          else torch.int64)
        by_key = torch.argsort(keys, stable=True)
        order = by_key.index_select(0, torch.argsort(depth_bits.index_select(0, by_key),
                                                     stable=True))
        counts = counts.index_select(0, order)
        splat = torch.repeat_interleave(order, counts)
        first = torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
        k = (torch.arange(splat.shape[0], device=splat.device) - first).to(torch.int32)
        span = span_x.index_select(0, splat)
        tile_x = x_lo.index_select(0, splat) + k % span
        tile_y = y_lo.index_select(0, splat) + k // span
        tile = (tile_y - tile_row0) * tiles_x + tile_x
        tile, perm = torch.sort(tile, stable=True)
        splat_ids = splat.index_select(0, perm)
        offsets = torch.zeros(n_tiles + 1, dtype=torch.int64, device=tile.device)
        offsets[1:] = torch.cumsum(torch.bincount(tile, minlength=n_tiles), 0)
    return TileBins(splat_ids, offsets, tiles_x, tile_row0, tile_row1 - tile_row0)

"""Tile binning: which splats touch which 16x16 tile, front to back per tile (the cpu
backend's; the cuda backend bins with gsplat's kernels)."""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import torch
from torch import Tensor

from splatscale.render.conventions import ALPHA_MIN, TILE_SIZE
from splatscale.render.cpu_kernels import rect_reached


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
              rows: tuple[int, int], conics: Tensor | None = None,
              opacities: Tensor | None = None) -> TileBins:
    """Bin splats into the tiles overlapping pixel rows ``[rows[0], rows[1])``.

    Each tile's splats are nearest first; equal depths (a clone has its parent's)
    are ordered by ``keys``, which travel with the Gaussians, so the order does not
    depend on where they are stored. A splat goes to the tiles its box meets; with
    ``conics`` and ``opacities``, only to those where its alpha can reach 1/255
    (a rotated ellipse misses some tiles of its box, and in them changes nothing).
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
        x_hi[(radii <= 0).any(dim=-1)] = 0  # an empty box: no tile
        # Nearest first, equal depths by key. Positive floats order like their bit
        # patterns, and integer sorts are faster.
        depth_bits = depths.detach().view(torch.int32 if depths.dtype == torch.float32
                                          else torch.int64)
        by_key = torch.argsort(keys, stable=True)
        order = by_key.index_select(0, torch.argsort(depth_bits.index_select(0, by_key),
                                                     stable=True))
        boxes = torch.stack([x_lo, x_hi, y_lo, y_hi], dim=1).index_select(0, order)
        shapes = torch.zeros(len(order), 7, dtype=torch.float64)  # no ellipse: every tile
        if conics is not None:
            shapes = torch.cat([means2d.detach(), radii, conics.detach(),
                                sigma_max(opacities.detach())[:, None]], 1).to(
                torch.float64).index_select(0, order)
        splat_ids, offsets = _fill_tiles(order.numpy(), boxes.numpy(), shapes.numpy(),
                                         conics is not None, tiles_x, tile_row0, n_tiles)
    return TileBins(torch.from_numpy(splat_ids), torch.from_numpy(offsets), tiles_x, tile_row0,
                    tile_row1 - tile_row0)


def sigma_max(opacities: Tensor) -> Tensor:
    """The largest sigma at which a splat's alpha still reaches 1/255: ln(255 opacity)."""
    return torch.log(opacities.to(torch.float64).clamp_min(ALPHA_MIN) / ALPHA_MIN)


@numba.njit(cache=True)
def _reaches(shape, tile_x, tile_y, ellipse):  # pragma: no cover - compiled
    """Whether a splat (means2d, radii, conic, sigma_max) can change a pixel of the tile."""
    if not ellipse:
        return True
    return rect_reached(shape[0], shape[1], shape[2], shape[3], shape[4], shape[5], shape[6],
                        shape[7], tile_x * TILE_SIZE, tile_y * TILE_SIZE, TILE_SIZE, TILE_SIZE)


@numba.njit(cache=True)
def _fill_tiles(order, boxes, shapes, ellipse, tiles_x, tile_row0,
                n_tiles):  # pragma: no cover - compiled
    """Each tile's splats in ``order``: the splat ids tile after tile, and where each
    tile's start (a counting sort). ``boxes[i]`` is splat order[i]'s box in tiles,
    (x_lo, x_hi, y_lo, y_hi), ``shapes[i]`` its ellipse for ``_reaches``."""
    offsets = np.zeros(n_tiles + 1, np.int64)
    for i in range(order.shape[0]):
        for ty in range(boxes[i, 2], boxes[i, 3]):
            for tx in range(boxes[i, 0], boxes[i, 1]):
                if _reaches(shapes[i], tx, ty, ellipse):
                    offsets[(ty - tile_row0) * tiles_x + tx + 1] += 1
    offsets = np.cumsum(offsets)
    cursor = offsets[:-1].copy()
    splat_ids = np.empty(offsets[-1], np.int64)
    for i in range(order.shape[0]):
        for ty in range(boxes[i, 2], boxes[i, 3]):
            for tx in range(boxes[i, 0], boxes[i, 1]):
                if _reaches(shapes[i], tx, ty, ellipse):
                    tile = (ty - tile_row0) * tiles_x + tx
                    splat_ids[cursor[tile]] = order[i]
                    cursor[tile] += 1
    return splat_ids, offsets

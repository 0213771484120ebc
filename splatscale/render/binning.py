"""Tile binning: which splats touch which 16x16 tile, front to back per tile (the cpu
backend's; the cuda backend bins with gsplat's kernels)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np
import torch
from torch import Tensor

from splatscale.render.conventions import ALPHA_MIN, TILE_SIZE
from splatscale.render.cpu_kernels import boundary_at, reach_ellipse, strip_span
from splatscale.render.projection_kernels import CHUNK


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
        boxes = torch.stack([x_lo, x_hi, y_lo, y_hi], dim=1).index_select(0, order).numpy()
        # Each splat's tiles, row by row of its box: a span of columns per row.
        row_starts = np.zeros(len(order) + 1, np.int64)
        np.cumsum(boxes[:, 3] - boxes[:, 2], out=row_starts[1:])
        spans = np.empty((row_starts[-1], 2), np.int32)
        if conics is None:
            _box_spans(boxes, row_starts, spans)
        else:
            _ellipse_spans(order.numpy(), boxes, means2d.detach().contiguous().numpy(),
                           conics.detach().contiguous().numpy(),
                           sigma_max(opacities.detach()).numpy(), row_starts, spans)
        splat_ids, offsets = _fill_tiles(order.numpy(), boxes, row_starts, spans, tiles_x,
                                         tile_row0, n_tiles, numba.get_num_threads())
    return TileBins(torch.from_numpy(splat_ids), torch.from_numpy(offsets), tiles_x, tile_row0,
                    tile_row1 - tile_row0)


def sigma_max(opacities: Tensor) -> Tensor:
    """The largest sigma at which a splat's alpha still reaches 1/255: ln(255 opacity)."""
    return torch.log(opacities.to(torch.float64).clamp_min(ALPHA_MIN) / ALPHA_MIN)


@numba.njit(cache=True)
def _box_spans(boxes, row_starts, spans):  # pragma: no cover - compiled
    """Every tile of each box."""
    for i in range(boxes.shape[0]):
        for j in range(row_starts[i], row_starts[i + 1]):
            spans[j, 0], spans[j, 1] = boxes[i, 0], boxes[i, 1]


@numba.njit(cache=True)
def _ellipse_spans_of(lo, hi, order, boxes, means2d, conics, sigma_max, row_starts,
                      spans):  # pragma: no cover - compiled
    """Splats [lo, hi): in each tile row of the box, the tiles with a pixel centre in
    the splat's ``reach_ellipse`` (a span, as a row cuts the ellipse in one piece)."""
    for i in range(lo, hi):
        g = order[i]
        mx, my = np.float64(means2d[g, 0]), np.float64(means2d[g, 1])
        a, b, c = np.float64(conics[g, 0]), np.float64(conics[g, 1]), np.float64(conics[g, 2])
        limit, det, ex, ey = reach_ellipse(a, b, c, sigma_max[g])
        x_lo, x_hi = boxes[i, 0], boxes[i, 1]
        v = boxes[i, 2] * TILE_SIZE - my  # the top of a row of tiles, relative to the mean
        at_top = boundary_at(a, b, limit, det, ey, v)
        for j in range(row_starts[i], row_starts[i + 1]):
            at_bottom = boundary_at(a, b, limit, det, ey, v + TILE_SIZE)
            left, right = strip_span(b, c, det, ex, ey, v, v + TILE_SIZE, at_top, at_bottom)
            v, at_top = v + TILE_SIZE, at_bottom
            if left > right:
                spans[j, 0], spans[j, 1] = 0, 0
                continue
            # Tile tx's pixel centres: tx TILE_SIZE + 0.5 to (tx + 1) TILE_SIZE - 0.5.
            first = (mx + left - (TILE_SIZE - 0.5)) / TILE_SIZE
            last = (mx + right - 0.5) / TILE_SIZE
            spans[j, 0] = max(x_lo, int(math.ceil(min(first, x_hi))))
            spans[j, 1] = max(spans[j, 0], min(x_hi, int(math.floor(max(last, x_lo - 1))) + 1))


@numba.njit(parallel=True, cache=True)
def _ellipse_spans(order, boxes, means2d, conics, sigma_max, row_starts,
                   spans):  # pragma: no cover - compiled
    count = order.shape[0]
    for chunk in numba.prange((count + CHUNK - 1) // CHUNK):
        _ellipse_spans_of(chunk * CHUNK, min(count, (chunk + 1) * CHUNK), order, boxes, means2d,
                          conics, sigma_max, row_starts, spans)


@numba.njit(cache=True)
def _count_tiles(lo, hi, boxes, row_starts, spans, tiles_x, tile_row0,
                 counts):  # pragma: no cover - compiled
    """counts[t] += the intersections of splats order[lo:hi] with tile t."""
    for i in range(lo, hi):
        for j in range(row_starts[i], row_starts[i + 1]):
            row = (boxes[i, 2] + j - row_starts[i] - tile_row0) * tiles_x
            for tx in range(spans[j, 0], spans[j, 1]):
                counts[row + tx] += 1


@numba.njit(cache=True)
def _place_splats(lo, hi, order, boxes, row_starts, spans, tiles_x, tile_row0, cursor,
                  splat_ids):  # pragma: no cover - compiled
    """Splats order[lo:hi] into their tiles, each tile's from ``cursor`` on."""
    for i in range(lo, hi):
        for j in range(row_starts[i], row_starts[i + 1]):
            row = (boxes[i, 2] + j - row_starts[i] - tile_row0) * tiles_x
            for tx in range(spans[j, 0], spans[j, 1]):
                splat_ids[cursor[row + tx]] = order[i]
                cursor[row + tx] += 1


@numba.njit(parallel=True, cache=True)
def _fill_tiles(order, boxes, row_starts, spans, tiles_x, tile_row0, n_tiles,
                parts):  # pragma: no cover - compiled
    """Each tile's splats in ``order``: the splat ids tile after tile, and where each
    tile's start (a counting sort). Splat order[i] covers, in tile row boxes[i, 2] + r,
    the columns [spans[row_starts[i] + r, 0], spans[row_starts[i] + r, 1]).

    ``parts`` consecutive runs of splats (of about equal rows) are counted and placed
    in parallel, each tile taking the runs in order: the result is the sequential
    sort's whatever their number."""
    count = order.shape[0]
    bounds = np.searchsorted(row_starts, np.arange(parts + 1) * (row_starts[-1] / parts))
    bounds[0], bounds[parts] = 0, count
    counts = np.zeros((parts, n_tiles), np.int64)
    for part in numba.prange(parts):
        _count_tiles(bounds[part], bounds[part + 1], boxes, row_starts, spans, tiles_x,
                     tile_row0, counts[part])
    offsets = np.zeros(n_tiles + 1, np.int64)
    offsets[1:] = np.cumsum(counts.sum(axis=0))
    cursors = np.empty((parts, n_tiles), np.int64)
    cursors[0] = offsets[:-1]
    for part in range(1, parts):
        cursors[part] = cursors[part - 1] + counts[part - 1]
    splat_ids = np.empty(offsets[-1], np.int64)
    for part in numba.prange(parts):
        _place_splats(bounds[part], bounds[part + 1], order, boxes, row_starts, spans, tiles_x,
                      tile_row0, cursors[part], splat_ids)
    return splat_ids, offsets

"""Tile binning: which splats touch which 16x16 tile, front to back per tile (the cpu
backend's; the cuda backend bins with gsplat's kernels)."""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import numba
import numpy as np
import torch
from torch import Tensor

from splatscale.render.buffer_pool import BINNING_SCRATCH
from splatscale.render.conventions import ALPHA_MIN, TILE_SIZE
from splatscale.render.compositing_kernels import BLOCK_H, BLOCK_W, BLOCKS_X
from splatscale.render.projection_kernels import CHUNK
from splatscale.render.radix_sort import stable_sort

BLOCK_ROWS = TILE_SIZE // BLOCK_H  # rows of blocks in a row of tiles
SHORT_RUN = 32  # equal depths up to this many are ordered by insertion
SPLAT_WIDTH = 8  # a splat's row (``_sorted_rows``): half a cache line in float32
ROW_VALUES = 8  # a tile row's values in ``_ellipse_spans_of`` (``_fill_rows``)
NO_TILE = 1 << 62  # a tile span's bound beyond every tile

Lend = Callable[[int, int, torch.dtype], np.ndarray]  # ``_scratch``'s


@dataclass
class TileBins:
    """Intersections of one camera's splats with the tiles of a band of rows.

    The band covers tile rows ``[tile_row0, tile_row0 + tile_rows)`` of the
    image's fixed tile grid, so each tile sees exactly the splats, in exactly
    the order, that a full render gives it. ``splat_ids[offsets[t]:offsets[t+1]]``
    are the splats of band tile t (row-major), nearest first; ``blocks[k]`` has bit i
    set where splat_ids[k] may reach block i of its tile (``compositing_kernels``' 8x4 blocks).
    """

    splat_ids: Tensor   # [I] int64
    blocks: Tensor      # [I] uint8: one bit per block, BLOCKS (8) of them
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
    (a rotated ellipse misses some tiles of its box, and in them changes nothing),
    and only to the blocks of a tile it can reach (else to all of them). ``conics``
    and ``opacities`` are of means2d's dtype.
    """
    y0, y1 = rows
    tiles_x = -(-width // TILE_SIZE)
    tile_row0, tile_row1 = y0 // TILE_SIZE, -(-y1 // TILE_SIZE)
    n_tiles = tiles_x * (tile_row1 - tile_row0)
    with torch.no_grad(), _scratch() as lend:
        # Nearest first, equal depths by key. Ties are rare: they are ordered after the
        # sort, not by a sort of every key first (which took twice the depth sort).
        sorted_bits, order = _sorted_depths(depths.detach())
        _order_ties_by_key(sorted_bits, keys.contiguous().numpy(), order)
        # Each splat's inputs in one row, in depth order: the rows are gathered at once
        # (one read a splat, many in flight) and then read in sequence.
        splats = _sorted_rows(order, means2d, radii, conics, opacities, lend)
        boxes = lend(len(order), 4, torch.int32)
        _sorted_boxes(splats, tiles_x, tile_row0, tile_row1, boxes)
        # Each splat's tiles, row by row of its box: a span of columns per row, and in each
        # of the row's rows of blocks the span of block columns (image-wide, inclusive).
        row_starts = lend(len(order) + 1, 1, torch.int64).reshape(-1)
        row_starts[0] = 0
        np.cumsum(boxes[:, 3] - boxes[:, 2], out=row_starts[1:])
        spans = lend(row_starts[-1], 2, torch.int32)
        block_spans = lend(row_starts[-1], BLOCK_ROWS * 2, torch.int32).reshape(-1, BLOCK_ROWS, 2)
        if conics is None or opacities is None:
            _box_spans(boxes, row_starts, spans, block_spans)
        else:
            _ellipse_spans(splats, boxes, row_starts, spans, block_spans)
        splat_ids, blocks, offsets = _fill_tiles(order, boxes, row_starts, spans,
                                                 block_spans, tiles_x, tile_row0, n_tiles,
                                                 numba.get_num_threads())
    return TileBins(torch.from_numpy(splat_ids), torch.from_numpy(blocks),
                    torch.from_numpy(offsets), tiles_x, tile_row0, tile_row1 - tile_row0)


@contextmanager
def _scratch() -> Iterator[Lend]:
    """``lend(rows, width, dtype)``: an uninitialised [rows, width] array from
    ``BINNING_SCRATCH``; every array lent is given back on leaving. A step's binning
    arrays (hundreds of megabytes at millions of splats) are then faulted in once, not
    every step (``buffer_pool``)."""
    lent: list[Tensor] = []

    def lend(rows: int, width: int, dtype: torch.dtype) -> np.ndarray:
        lent.append(BINNING_SCRATCH.lend(int(rows), width, dtype))
        return lent[-1].numpy()

    try:
        yield lend
    finally:
        for buffer in lent:
            BINNING_SCRATCH.give_back(buffer)


def _sorted_depths(depths: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """The depths' bit patterns sorted, and the stable order that sorts them. Positive
    floats order like their bit patterns, and integers sort faster; float32's by
    radix (``radix_sort``: several times torch's at the size of a small image)."""
    if depths.dtype == torch.float32:
        return stable_sort(depths.contiguous().view(torch.int32).numpy())
    values, indices = torch.sort(depths.view(torch.int64), stable=True)
    return values.numpy(), indices.numpy()


def _sorted_rows(order: np.ndarray, means2d: Tensor, radii: Tensor, conics: Tensor | None,
                 opacities: Tensor | None, lend: Lend) -> np.ndarray:
    """[len(order), SPLAT_WIDTH] of means2d's dtype: splat order[i]'s x, y, radius x,
    radius y and, where given, conic (a, b, c) and opacity (else unset); the arrays
    ``lend`` (``_scratch``)."""
    means = means2d.detach().contiguous().numpy()
    if conics is None or opacities is None:
        conics, opacities = means2d.new_empty((0, 3)), means2d.new_empty(0)
    if not conics.dtype == opacities.dtype == means2d.dtype:
        raise ValueError("bin_tiles takes means2d, conics and opacities of one dtype")
    rows = lend(len(means), SPLAT_WIDTH, means2d.dtype)
    _pack_rows(means, radii.contiguous().numpy(), conics.detach().contiguous().numpy(),
               opacities.detach().contiguous().numpy(), rows)
    gathered = lend(len(means), SPLAT_WIDTH, means2d.dtype)
    _gather_rows(order, rows, gathered)
    return gathered


@numba.njit(parallel=True, cache=True)
def _pack_rows(means2d, radii, conics, opacities, rows):  # pragma: no cover - compiled
    """rows[g]: ``_sorted_rows``' row of splat g; no conic or opacity where ``conics``
    is empty."""
    with_shape = conics.shape[0] > 0
    for chunk in numba.prange((rows.shape[0] + CHUNK - 1) // CHUNK):
        for g in range(chunk * CHUNK, min(rows.shape[0], (chunk + 1) * CHUNK)):
            rows[g, 0], rows[g, 1] = means2d[g, 0], means2d[g, 1]
            rows[g, 2], rows[g, 3] = radii[g, 0], radii[g, 1]
            if with_shape:
                rows[g, 4], rows[g, 5], rows[g, 6] = conics[g, 0], conics[g, 1], conics[g, 2]
                rows[g, 7] = opacities[g]


@numba.njit(parallel=True, cache=True)
def _gather_rows(order, rows, gathered):  # pragma: no cover - compiled
    """gathered[i] = rows[order[i]]: a loop of loads alone, so the memory serves many at
    once (amid arithmetic it served them one after another)."""
    count = order.shape[0]
    for chunk in numba.prange((count + CHUNK - 1) // CHUNK):
        for i in range(chunk * CHUNK, min(count, (chunk + 1) * CHUNK)):
            g = order[i]
            for k in range(SPLAT_WIDTH):
                gathered[i, k] = rows[g, k]


@numba.njit(cache=True)
def _sorted_boxes_of(lo, hi, splats, tiles_x, tile_row0, tile_row1,
                     boxes):  # pragma: no cover - compiled
    tile = splats.dtype.type(TILE_SIZE)
    for i in range(lo, hi):
        x, y = splats[i, 0] / tile, splats[i, 1] / tile
        rx, ry = splats[i, 2] / tile, splats[i, 3] / tile
        # np.floor clamps in floats; math.floor's int64 made this loop three times slower.
        x_hi = min(max(np.ceil(x + rx), 0), tiles_x)
        boxes[i, 0] = min(max(np.floor(x - rx), 0), tiles_x)
        boxes[i, 1] = x_hi if splats[i, 2] > 0 and splats[i, 3] > 0 else 0  # empty: no tile
        boxes[i, 2] = min(max(np.floor(y - ry), tile_row0), tile_row1)
        boxes[i, 3] = min(max(np.ceil(y + ry), tile_row0), tile_row1)


@numba.njit(parallel=True, cache=True)
def _sorted_boxes(splats, tiles_x, tile_row0, tile_row1, boxes):  # pragma: no cover - compiled
    """boxes[i]: ``tile_boxes`` of splat row i (``_sorted_rows``) clipped to the band's tiles,
    as (x_lo, x_hi, y_lo, y_hi); x_hi = 0 where a radius is 0."""
    count = splats.shape[0]
    for chunk in numba.prange((count + CHUNK - 1) // CHUNK):
        _sorted_boxes_of(chunk * CHUNK, min(count, (chunk + 1) * CHUNK), splats, tiles_x,
                         tile_row0, tile_row1, boxes)


@numba.njit(parallel=True, cache=True)
def _order_ties_by_key(sorted_bits, keys, order):  # pragma: no cover - compiled
    """Order each run of equal depths in ``order`` (sorted stably by depth; the
    depths in that order are ``sorted_bits``) by key, stably: ``order`` becomes the
    sort by (depth, key, storage position). Each run is ordered by the chunk it
    starts in; runs do not overlap, so the chunks run in parallel."""
    count = order.shape[0]
    for chunk in numba.prange((count + CHUNK - 1) // CHUNK):
        start, chunk_end = chunk * CHUNK, min(count, (chunk + 1) * CHUNK)
        while 0 < start < chunk_end and sorted_bits[start] == sorted_bits[start - 1]:
            start += 1  # inside a run begun in an earlier chunk
        while start < chunk_end:
            end = start + 1
            while end < count and sorted_bits[end] == sorted_bits[start]:
                end += 1
            if 1 < end - start <= SHORT_RUN:
                _insert_by_key(order, start, end, keys)
            elif end - start > SHORT_RUN:
                run = _by_key(order[start:end], keys)
                for j in range(end - start):  # a loop: a slice assignment compiles seconds longer
                    order[start + j] = run[j]
            start = end


@numba.njit(inline="always")
def _insert_by_key(order, lo, hi, keys):  # pragma: no cover - compiled
    """order[lo:hi] sorted stably by key in place: an insertion sort, for short runs
    (no buffer allocated for each)."""
    for j in range(lo + 1, hi):
        g = order[j]
        m = j
        while m > lo and keys[order[m - 1]] > keys[g]:
            order[m] = order[m - 1]
            m -= 1
        order[m] = g


@numba.njit(cache=True)
def _by_key(run, keys):  # pragma: no cover - compiled
    """``run`` (splat ids) sorted stably by their ``keys``: a bottom-up merge sort,
    written out (numba's own stable argsort took seconds more to compile)."""
    count = run.shape[0]
    source, target = run.copy(), np.empty_like(run)
    width = 1
    while width < count:
        for lo in range(0, count, 2 * width):
            mid, hi = min(lo + width, count), min(lo + 2 * width, count)
            i, j = lo, mid
            for out in range(lo, hi):
                if i < mid and (j >= hi or keys[source[i]] <= keys[source[j]]):
                    target[out] = source[i]
                    i += 1
                else:
                    target[out] = source[j]
                    j += 1
        source, target = target, source
        width *= 2
    return source


@numba.njit(inline="always")
def reach_ellipse(a, b, c, sigma_max):
    """The ellipse {u : 0.5 (a u_x^2 + c u_y^2) + b u_x u_y <= limit} (u = pixel centre
    - mean) outside which a splat of conic (a, b, c) stays below alpha 1/255: ``limit``
    is ``sigma_max`` = ln(255 opacity) with a margin far above float32 rounding.

    Returns (limit, det = ac - b^2, half-width, half-height); det <= 0 (a conic
    rounded to singular) bounds nothing. In float64.
    """
    det = a * c - b * b
    if not det > 0.0:
        return sigma_max, det, np.inf, np.inf
    inv_det = 1.0 / det
    reach = max(sigma_max, 0.0)
    ex, ey = math.sqrt(2.0 * reach * c * inv_det), math.sqrt(2.0 * reach * a * inv_det)
    # float32 rounds sigma relative to its terms, at most these inside the ellipse.
    limit = max(sigma_max + 0.01 + 1e-5 * (a * ex * ex + 2.0 * abs(b) * ex * ey + c * ey * ey),
                0.0)
    return limit, det, math.sqrt(2.0 * limit * c * inv_det), math.sqrt(2.0 * limit * a * inv_det)


@numba.njit(inline="always")
def boundary_at(a, b, limit, det, ey, v):
    """(left, right): u_x on the boundary of the ellipse (``reach_ellipse``) at u_y = v,
    v clamped into the ellipse's height."""
    v = min(max(v, -ey), ey)
    root = math.sqrt(max(2.0 * a * limit - det * v * v, 0.0))
    inv_a = 1.0 / a
    return (-b * v - root) * inv_a, (-b * v + root) * inv_a


@numba.njit(inline="always")
def strip_span(b, c, det, ex, ey, v0, v1, at_v0, at_v1):
    """The x-extent (lo, hi), relative to the mean, of the ellipse (``reach_ellipse``)
    within the strip v0 <= u_y <= v1, given ``boundary_at`` v0 and v1; (inf, -inf)
    when they do not meet.

    The boundary's left half is convex in u_y and its right half concave, so each
    extreme over the strip is the ellipse's own (at u_y = +-b ex / c) when the strip
    holds it, else at an end of the strip.
    """
    if not det > 0.0:
        return -np.inf, np.inf
    if v0 > ey or v1 < -ey:
        return np.inf, -np.inf
    turn = b * ex / c
    lo = -ex if v0 <= turn <= v1 else min(at_v0[0], at_v1[0])
    hi = ex if v0 <= -turn <= v1 else max(at_v0[1], at_v1[1])
    return lo, hi


@numba.njit(cache=True)
def _box_spans(boxes, row_starts, spans, block_spans):  # pragma: no cover - compiled
    """Every tile of each box, every block of its tiles."""
    for i in range(boxes.shape[0]):
        for j in range(row_starts[i], row_starts[i + 1]):
            spans[j, 0], spans[j, 1] = boxes[i, 0], boxes[i, 1]
            block_spans[j, :, 0] = boxes[i, 0] * BLOCKS_X
            block_spans[j, :, 1] = boxes[i, 1] * BLOCKS_X - 1


@numba.njit(cache=True, error_model="numpy")
def _ellipse_spans_of(lo, hi, splats, boxes, row_starts, spans,
                      block_spans):  # pragma: no cover - compiled
    """Splats [lo, hi): in each row of blocks of the box, the block columns with a pixel
    centre in the splat's ``reach_ellipse`` (a span, as a row cuts the ellipse in one
    piece), and in each tile row the tiles that hold them. Each splat's conic is
    written into each of its tile rows (``_fill_rows``), the tile rows' spans found on
    the vector units (``_lane_spans``), then written out.

    numpy's error model: a branch to raise ZeroDivisionError would keep ``_lane_spans``
    scalar, and nothing divides by zero (a conic has a > 0; c is divided only where the
    determinant is positive)."""
    base = row_starts[lo]
    rows = np.empty((ROW_VALUES, row_starts[hi] - base))
    # Each row of blocks' first and last block column, then the tile row's first and
    # last tile (NO_TILE and -NO_TILE where there is none).
    row_spans = np.empty((2 * BLOCK_ROWS + 2, rows.shape[1]), np.int64)
    for i in range(lo, hi):
        _fill_rows(rows, row_starts[i] - base, splats, boxes, row_starts, i)
    _lane_spans(np.uint64(rows.shape[1]), rows, row_spans)
    for i in range(lo, hi):
        for j in range(row_starts[i], row_starts[i + 1]):
            t = j - base
            for r in range(BLOCK_ROWS):
                block_spans[j, r, 0] = row_spans[2 * r, t]
                block_spans[j, r, 1] = row_spans[2 * r + 1, t]
            first_tile = min(boxes[i, 1], row_spans[2 * BLOCK_ROWS, t])
            last_tile = max(boxes[i, 0] - 1, row_spans[2 * BLOCK_ROWS + 1, t])
            spans[j, 0], spans[j, 1] = first_tile, max(first_tile, last_tile + 1)


@numba.njit(inline="always")
def _fill_rows(rows, first, splats, boxes, row_starts, i):  # pragma: no cover - compiled
    """rows[:, first + k] for each tile row k of splat i's box: its conic and
    ``reach_ellipse``'s sigma, box columns and mean, and the top of the tile row's first
    row of blocks relative to the mean (walked down a row of blocks at a time)."""
    mx, my = np.float64(splats[i, 0]), np.float64(splats[i, 1])
    a, b, c = np.float64(splats[i, 4]), np.float64(splats[i, 5]), np.float64(splats[i, 6])
    opacity = np.float64(splats[i, 7])
    # The largest sigma at which the splat's alpha reaches 1/255: ln(255 opacity).
    sigma_max = math.log(max(opacity, ALPHA_MIN) / ALPHA_MIN)
    column_lo, column_hi = boxes[i, 0] * BLOCKS_X, boxes[i, 1] * BLOCKS_X
    v = boxes[i, 2] * TILE_SIZE - my
    for k in range(first, first + row_starts[i + 1] - row_starts[i]):
        rows[0, k], rows[1, k], rows[2, k], rows[3, k] = a, b, c, sigma_max
        rows[4, k], rows[5, k], rows[6, k], rows[7, k] = column_lo, column_hi, mx, v
        for _ in range(BLOCK_ROWS):
            v += BLOCK_H


@numba.njit(inline="always")
def _lane_spans(count, rows, row_spans):  # pragma: no cover - compiled
    """row_spans[:, k] for the tile rows k below ``count`` (``_fill_rows``). The
    arithmetic is in the loop itself, indexed unsigned
    (``projection_kernels._lane_gradients`` says why); the four rows of blocks of a
    tile row are written out, each BLOCK_H below the one above."""
    for k in range(np.uint64(0), count):
        a, b, c, sigma_max = rows[0, k], rows[1, k], rows[2, k], rows[3, k]
        # A tile row's own: on the vector units its square roots cost less than
        # storing its four values in every tile row would.
        limit, det, ex, ey = reach_ellipse(a, b, c, sigma_max)
        ellipse, columns = (a, b, c, limit, det, ex, ey), (rows[4, k], rows[5, k], rows[6, k])
        v = rows[7, k]
        first0, last0 = _block_row_span(ellipse, columns, v)
        first1, last1 = _block_row_span(ellipse, columns, v + BLOCK_H)
        first2, last2 = _block_row_span(ellipse, columns, v + 2 * BLOCK_H)
        first3, last3 = _block_row_span(ellipse, columns, v + 3 * BLOCK_H)
        row_spans[0, k], row_spans[1, k], row_spans[2, k], row_spans[3, k] = (
            first0, last0, first1, last1)
        row_spans[4, k], row_spans[5, k], row_spans[6, k], row_spans[7, k] = (
            first2, last2, first3, last3)
        tiles0, tiles1 = _tiles_of(first0, last0), _tiles_of(first1, last1)
        tiles2, tiles3 = _tiles_of(first2, last2), _tiles_of(first3, last3)
        row_spans[8, k] = min(tiles0[0], tiles1[0], tiles2[0], tiles3[0])
        row_spans[9, k] = max(tiles0[1], tiles1[1], tiles2[1], tiles3[1])


@numba.njit(inline="always")
def _tiles_of(first, last):  # pragma: no cover - compiled
    """The tiles of block columns first and last; (NO_TILE, -NO_TILE) where the row of
    blocks meets nothing (first > last)."""
    return ((first // BLOCKS_X, last // BLOCKS_X) if first <= last
            else (np.int64(NO_TILE), np.int64(-NO_TILE)))


@numba.njit(inline="always")
def _block_row_span(ellipse, columns, v):  # pragma: no cover - compiled
    """(first, last) block columns of the row of blocks whose top edge is ``v``
    (relative to the mean). ``ellipse``: (a, b, c, limit, det, ex, ey); ``columns``:
    the box's first and end block columns and the mean's x."""
    a, b, c, limit, det, ex, ey = ellipse
    column_lo, column_hi, mx = columns
    # The strip of its pixel centres' rows, not of its edges: a thin, tilted ellipse
    # reaches wider across the half pixel above the first centre and below the last,
    # where the kernels evaluate nothing.
    top, bottom = v + 0.5, v + (BLOCK_H - 0.5)
    left, right = strip_span(b, c, det, ex, ey, top, bottom,
                             boundary_at(a, b, limit, det, ey, top),
                             boundary_at(a, b, limit, det, ey, bottom))
    # Block column n's pixel centres: n BLOCK_W + 0.5 to (n + 1) BLOCK_W - 0.5.
    first_at = (mx + left - (BLOCK_W - 0.5)) / BLOCK_W
    last_at = (mx + right - 0.5) / BLOCK_W
    first = int(math.ceil(min(max(first_at, column_lo), column_hi)))
    last = int(math.floor(max(min(last_at, column_hi - 1), column_lo - 1)))
    return first, last


@numba.njit(parallel=True, cache=True)
def _ellipse_spans(splats, boxes, row_starts, spans, block_spans):  # pragma: no cover - compiled
    count = splats.shape[0]
    for chunk in numba.prange((count + CHUNK - 1) // CHUNK):
        _ellipse_spans_of(chunk * CHUNK, min(count, (chunk + 1) * CHUNK), splats, boxes,
                          row_starts, spans, block_spans)


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
def _place_splats(lo, hi, order, boxes, row_starts, spans, block_spans, tiles_x, tile_row0,
                  cursor, splat_ids, blocks):  # pragma: no cover - compiled
    """Splats order[lo:hi] into their tiles, each tile's from ``cursor`` on, with the
    blocks of the tile each reaches."""
    for i in range(lo, hi):
        for j in range(row_starts[i], row_starts[i + 1]):
            row = (boxes[i, 2] + j - row_starts[i] - tile_row0) * tiles_x
            # Read once a row of tiles: the compiler reloads what it cannot tell apart
            # from the arrays written.
            row_spans = (block_spans[j, 0, 0], block_spans[j, 0, 1], block_spans[j, 1, 0],
                         block_spans[j, 1, 1], block_spans[j, 2, 0], block_spans[j, 2, 1],
                         block_spans[j, 3, 0], block_spans[j, 3, 1])
            for tx in range(spans[j, 0], spans[j, 1]):
                at = cursor[row + tx]
                splat_ids[at] = order[i]
                blocks[at] = _tile_mask(tx, row_spans)
                cursor[row + tx] = at + 1


@numba.njit(inline="always")
def _tile_mask(tx, s):  # pragma: no cover - compiled
    """The blocks of tile column tx that the rows of blocks with (first, last) block
    columns ``s`` (four pairs) reach: bit r BLOCKS_X + c for block column tx BLOCKS_X +
    c of row r. Written out for a tile of 4 x 2 blocks (tests/test_reach.py holds it to
    the pixels)."""
    n, m = tx * BLOCKS_X, tx * BLOCKS_X + 1
    return ((1 if s[0] <= n <= s[1] else 0) | (2 if s[0] <= m <= s[1] else 0)
            | (4 if s[2] <= n <= s[3] else 0) | (8 if s[2] <= m <= s[3] else 0)
            | (16 if s[4] <= n <= s[5] else 0) | (32 if s[4] <= m <= s[5] else 0)
            | (64 if s[6] <= n <= s[7] else 0) | (128 if s[6] <= m <= s[7] else 0))


@numba.njit(cache=True)
def _first_at_least(ascending, value):  # pragma: no cover - compiled
    """The first index of ``ascending`` whose element is at least ``value`` (its length
    if none is): numpy's searchsorted, side left."""
    lo, hi = 0, ascending.shape[0]
    while lo < hi:
        mid = (lo + hi) // 2
        if ascending[mid] < value:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _fill_tiles(order, boxes, row_starts, spans, block_spans, tiles_x, tile_row0, n_tiles,
                parts):
    """Each tile's splats in ``order``: the splat ids tile after tile, the blocks each
    reaches, and where each tile's start (a counting sort). Splat order[i] covers, in
    tile row boxes[i, 2] + r, the columns [spans[row_starts[i] + r, 0],
    spans[row_starts[i] + r, 1]).

    ``parts`` consecutive runs of splats (of about equal rows) are counted and placed
    in parallel, each tile taking the runs in order: the result is the sequential
    sort's whatever their number."""
    bounds, cursors, offsets = _tile_cursors(boxes, row_starts, spans, tiles_x, tile_row0,
                                             n_tiles, parts)
    # Allocated by numpy, for its huge pages (``_sorted_rows``): a call's page faults at
    # 3M splats fell from 11,500 to under 3,000.
    splat_ids, blocks = np.empty(offsets[-1], np.int64), np.empty(offsets[-1], np.uint8)
    _place_parts(bounds, order, boxes, row_starts, spans, block_spans, tiles_x, tile_row0,
                 cursors, splat_ids, blocks)
    return splat_ids, blocks, offsets


@numba.njit(parallel=True, cache=True)
def _tile_cursors(boxes, row_starts, spans, tiles_x, tile_row0, n_tiles,
                  parts):  # pragma: no cover - compiled
    """``_fill_tiles``' runs of splats (bounds [parts + 1]), where each run places its
    first splat in each tile (cursors [parts, n_tiles]) and each tile's start (offsets)."""
    # Loops, not numpy's searchsorted, cumsum and slice assignments: the same numbers,
    # compiled seconds sooner.
    count = boxes.shape[0]
    bounds = np.empty(parts + 1, np.int64)
    for part in range(parts + 1):
        bounds[part] = _first_at_least(row_starts, part * (row_starts[-1] / parts))
    bounds[0], bounds[parts] = 0, count
    counts = np.zeros((parts, n_tiles), np.int64)
    for part in numba.prange(parts):
        _count_tiles(bounds[part], bounds[part + 1], boxes, row_starts, spans, tiles_x,
                     tile_row0, counts[part])
    offsets = np.empty(n_tiles + 1, np.int64)
    cursors = np.empty((parts, n_tiles), np.int64)
    offsets[0] = 0
    for t in range(n_tiles):
        cursor = offsets[t]
        for part in range(parts):
            cursors[part, t] = cursor
            cursor += counts[part, t]
        offsets[t + 1] = cursor
    return bounds, cursors, offsets


@numba.njit(parallel=True, cache=True)
def _place_parts(bounds, order, boxes, row_starts, spans, block_spans, tiles_x, tile_row0,
                 cursors, splat_ids, blocks):  # pragma: no cover - compiled
    """``_place_splats`` of each of ``_fill_tiles``' runs, in parallel."""
    for part in numba.prange(bounds.shape[0] - 1):
        _place_splats(bounds[part], bounds[part + 1], order, boxes, row_starts, spans,
                      block_spans, tiles_x, tile_row0, cursors[part], splat_ids, blocks)

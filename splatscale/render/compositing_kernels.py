"""Numba compositing kernels of the cpu backend: forward and backward per 16x16 tile.

Each tile is independent (``prange`` over tiles). Inside a tile the loop over
its depth-sorted splats is outside and the pixels are inside, so LLVM
vectorises the pixel loop; every per-pixel decision is a select, not a branch.
A tile's pixels are stored as eight blocks of 8x4 (32 consecutive values, one
vectorised loop each), and a splat is evaluated only on the blocks where its
alpha can reach 1/255 (binning's bit masks, ``TileBins.blocks``): elsewhere it
changes no pixel and no gradient. The kernels composite RGB and, where asked for,
depth, fused into the pixel loop rather than looped over. Depth's output or its
gradient given as None compiles a kernel without it (training reads no depth).
The backward pass writes one gradient row per intersection; rows are summed per
splat afterwards in a fixed order, so results never depend on thread timing.
``backward_with_absgrad`` also writes, per intersection, the sum over pixels of
the absolute per-pixel gradient of the 2D mean (AbsGS's, gsplat's ``absgrad``);
the two kernels are one body compiled twice, so ``backward`` does no work for it.

The kernels are generic over float32 and float64: their constants come from
``_constants``, typed like the data (a float64 literal would silently widen
float32 arithmetic), and float32 uses a polynomial exp because numba from PyPI
has no vectorised ``exp``. Float64, the oracle tests' type, uses the exact one.
"""

from __future__ import annotations

import math
import numba as nb
import numpy as np
from llvmlite import ir
from numba.cpython.unsafe.numbers import trailing_zeros
from numba.extending import intrinsic, overload
from numpy.polynomial import Chebyshev, Polynomial

from splatscale.render.conventions import ALPHA_MAX, ALPHA_MIN, T_MIN
from splatscale.render.conventions import TILE_SIZE as TILE

PIXELS = TILE * TILE
# Beyond this sigma, alpha < 1/255 whatever the opacity (ln 255 = 5.54), so exp's value is moot.
SIGMA_CAP = 10.0

CHANNELS = 4  # red, green, blue, depth
# Gradient row layout per intersection: means2d (2), conic (3), opacity, rgb (3), depth;
# with absgrad, then the absolute per-pixel means2d gradients summed (x, y). The backward
# writes each row over the packed row it read (below), short of its last column.
GRAD_MEAN, GRAD_CONIC, GRAD_OPACITY, GRAD_COLOR, GRAD_DEPTH, GRAD_ABS_MEAN = 0, 2, 5, 6, 9, 10

# The kernels read the splats through ``pack``: one row per intersection, in
# intersection order (tile by tile, nearest first), so a tile reads consecutive
# rows; read through the splat ids, every intersection would be a cache miss.
PACKED_WIDTH = 16  # 64 bytes in float32: one cache line
MEAN_X, MEAN_Y, CONIC_A, CONIC_B, CONIC_C, OPACITY, RED, GREEN, BLUE, DEPTH = range(10)
BLOCKS_REACHED = PACKED_WIDTH - 1  # the last column: no gradient row reaches it


@intrinsic
def _exp2_of_integer(typingctx, n):
    """2^n for a float32 holding a small integer, by writing the exponent bits.

    A plain ``int(n)`` would convert to int64, which AVX2 cannot vectorise.
    """

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        exponent = builder.add(builder.fptosi(args[0], i32), ir.Constant(i32, 127))
        return builder.bitcast(builder.shl(exponent, ir.Constant(i32, 23)), ir.FloatType())

    return nb.types.float32(nb.types.float32), codegen


def _exp_neg(s):
    """exp(-s): polynomial in float32, exact in float64 (see ``_exp_neg_overload``)."""
    return math.exp(-s)


def _constants(dtype):
    """(0, 1, 1/2, ALPHA_MAX, ALPHA_MIN, T_MIN) as scalars of the float ``dtype``."""
    return 0.0, 1.0, 0.5, ALPHA_MAX, ALPHA_MIN, T_MIN


@overload(_constants, inline="always")
def _constants_overload(dtype):
    scalar = np.dtype(str(dtype.dtype)).type
    values = tuple(scalar(v) for v in (0.0, 1.0, 0.5, ALPHA_MAX, ALPHA_MIN, T_MIN))
    return lambda dtype: values


@overload(_exp_neg, inline="always", fastmath=True)
def _exp_neg_overload(s):
    if s != nb.types.float32:
        return lambda s: math.exp(-s)
    # exp(-s) = 2^-n exp(r), n = round(s / ln 2), |r| <= ln2/2; exp(r) by its degree-6
    # Chebyshev interpolant on that interval (error 2e-9, near minimax; Taylor needs
    # degree 7 for it, one more multiply-add per pixel): relative error 1.2e-7 in
    # float32, branch-free. The kernels wait on this chain (a splat's few pixels give
    # the CPU little else to do), so it is kept short: r in one multiply-add with ln 2
    # rounded to float32 (n <= 15 adds 3e-8 at most), and the polynomial in Estrin's
    # form, three multiply-adds deep, not Horner's six.
    f32 = np.float32
    zero, cap, half = f32(0), f32(SIGMA_CAP), f32(0.5)
    log2e, ln2 = f32(1.0 / math.log(2.0)), f32(math.log(2.0))
    reduced = math.log(2.0) / 2
    c0, c1, c2, c3, c4, c5, c6 = (f32(c) for c in Chebyshev.interpolate(
        np.exp, 6, domain=[-reduced, reduced]).convert(kind=Polynomial).coef)

    def fast(s):
        s = min(max(s, zero), cap)
        n = np.floor(s * log2e + half)
        r = n * ln2 - s
        r2 = r * r
        poly = (c0 + r * c1 + r2 * (c2 + r * c3)) + (r2 * r2) * (c4 + r * c5 + r2 * c6)
        return poly * _exp2_of_integer(-n)

    return fast


BLOCK_W, BLOCK_H = 8, 4
BLOCK = BLOCK_W * BLOCK_H
BLOCKS_X = TILE // BLOCK_W
BLOCKS = PIXELS // BLOCK


@nb.njit(inline="always")
def _tile_xy(p):
    """Column and row in its tile of pixel p: 8x4 blocks, row-major inside a block,
    the blocks row-major in the tile."""
    block, q = p // BLOCK, p % BLOCK
    return (block % BLOCKS_X) * BLOCK_W + q % BLOCK_W, (block // BLOCKS_X) * BLOCK_H + q // BLOCK_W


@nb.njit(inline="always")
def _tile_pixel(x, y):
    """The pixel of column x and row y of its tile: ``_tile_xy``'s inverse."""
    return (y // BLOCK_H * BLOCKS_X + x // BLOCK_W) * BLOCK + y % BLOCK_H * BLOCK_W + x % BLOCK_W


@nb.njit(parallel=True, cache=True)
def pack(splat_ids, blocks, offsets, tile_order, means2d, conics, opacities, colors, depths,
         out):  # pragma: no cover - compiled
    """out[k]: the values of splat splat_ids[k] the kernels read (the layout above), and
    ``blocks[k]``, the blocks of its tile it can reach (binning's bit mask)."""
    for i in nb.prange(tile_order.shape[0]):
        t = tile_order[i]
        for k in range(offsets[t], offsets[t + 1]):
            g = splat_ids[k]
            out[k, MEAN_X], out[k, MEAN_Y] = means2d[g, 0], means2d[g, 1]
            out[k, CONIC_A], out[k, CONIC_B] = conics[g, 0], conics[g, 1]
            out[k, CONIC_C], out[k, OPACITY], out[k, DEPTH] = conics[g, 2], opacities[g], depths[g]
            out[k, RED], out[k, GREEN], out[k, BLUE] = colors[g, 0], colors[g, 1], colors[g, 2]
            out[k, BLOCKS_REACHED] = blocks[k]


@nb.njit(inline="always")
def _pixels(lo, hi):
    """range(lo, hi) with an unsigned index: numba then drops the negative-index
    wraparound that would otherwise turn every array access into a gather."""
    return range(np.uint64(lo), np.uint64(hi))


@nb.njit(inline="always")
def _set_pixel_centres(px, py, tile_x, tile_y):
    """Set px and py to x and y of the tile's 256 pixel centres, in block order."""
    half = _constants(px.dtype)[2]
    for p in range(PIXELS):
        x, y = _tile_xy(p)
        px[p] = tile_x * TILE + x + half
        py[p] = tile_y * TILE + y + half


@nb.njit(inline="always", fastmath=True)
def _blend_splat(k, packed, local_k, px, py, T, live, last, acc, lo, hi, with_depth):
    """Blend intersection k's splat into the pixels [lo, hi) of one block (its depth
    too where ``with_depth``, a constant); returns how many pixels it finished and
    whether it changed any."""
    zero, one, half, alpha_max, alpha_min, t_min = _constants(px.dtype)
    mx, my = packed[k, MEAN_X], packed[k, MEAN_Y]
    ca, cb, cc = packed[k, CONIC_A], packed[k, CONIC_B], packed[k, CONIC_C]
    opacity = packed[k, OPACITY]
    c0, c1, c2, c3 = packed[k, RED], packed[k, GREEN], packed[k, BLUE], packed[k, DEPTH]
    # Pixels stopped, plus BLOCK + 1 times the pixels changed: both counts in one sum,
    # one horizontal sum at the loop's end rather than two (exact: at most BLOCK each).
    counts = zero
    changed_weight = px.dtype.type(BLOCK + 1)
    for p in _pixels(lo, hi):
        dx, dy = mx - px[p], my - py[p]
        sigma = half * (ca * dx * dx + cc * dy * dy) + cb * dx * dy
        raw_alpha = opacity * _exp_neg(sigma)
        alpha = raw_alpha if raw_alpha < alpha_max else alpha_max
        visible = one if sigma >= zero else zero
        strong = one if alpha >= alpha_min else zero
        use = live[p] * visible * strong
        T_here = T[p]
        next_T = T_here * (one - alpha)
        stop = use if next_T <= t_min else zero
        contributes = use - stop
        weight = contributes * alpha * T_here
        acc[0, p] += c0 * weight
        acc[1, p] += c1 * weight
        acc[2, p] += c2 * weight
        if with_depth:
            acc[3, p] += c3 * weight
        # Arithmetic blends, not selects of loaded values: LLVM vectorises these,
        # and with contributes in {0, 1} both are exact.
        T[p] = T_here * (one - contributes * alpha)
        last[p] += contributes * (local_k - last[p])
        live[p] -= stop
        counts += stop + changed_weight * contributes
    stopped = int(counts) % (BLOCK + 1)
    return stopped, int(counts) > stopped


@nb.njit(parallel=True, fastmath=True, cache=True)
def forward(packed, background, offsets, tile_order, tiles_x, tile_row0, width, y0, y1, out_rgb,
            out_depth, out_T, out_last, out_blocks):
    """Composite each tile front to back; keep final T and the last splat per pixel.

    ``out_depth`` gets the alpha-weighted depth sum (no background), or is None: no
    depth is composited. ``out_blocks[k]`` and packed row k's BLOCKS_REACHED get the
    blocks where intersection k changed a pixel.
    """
    for i in nb.prange(tile_order.shape[0]):
        _composite_tile(tile_order[i], packed, background, offsets, tiles_x, tile_row0, width,
                        y0, y1, out_rgb, out_depth, out_T, out_last, out_blocks)


# A tile's work is a call from the parallel loops, not inlined into them (numba took
# seconds of the first compile to inline it), with numpy's error model, as the loops'
# own code has: a division by zero gives inf rather than raising, so no branch to raise
# keeps a pixel loop off the vector units.
@nb.njit(fastmath=True, error_model="numpy")
def _composite_tile(t, packed, background, offsets, tiles_x, tile_row0, width, y0, y1,
                    out_rgb, out_depth, out_T, out_last, out_blocks):  # pragma: no cover - compiled
    """``forward`` of tile t."""
    zero, one, _, _, _, _ = _constants(packed.dtype)
    dtype = packed.dtype
    with_depth = out_depth is not None  # a constant: numba compiles None apart
    tile_x, tile_y = t % tiles_x, tile_row0 + t // tiles_x
    px, py = np.empty(PIXELS, dtype), np.empty(PIXELS, dtype)
    _set_pixel_centres(px, py, tile_x, tile_y)
    T = np.ones(PIXELS, dtype)
    live = np.empty(PIXELS, dtype)
    last = np.full(PIXELS, -one, dtype)  # tile-local index of the last contributor
    acc = np.zeros((CHANNELS, PIXELS), dtype)
    start = offsets[t]
    n_live = 0
    block_live = np.empty(BLOCKS, np.int64)  # pixels of each block still compositing
    for block in range(BLOCKS):
        # Block by block, without a branch: each block's count is one vector sum.
        inside_block = 0
        for p in _pixels(block * BLOCK, (block + 1) * BLOCK):
            x, y = _tile_xy(p)
            x, y = tile_x * TILE + x, tile_y * TILE + y
            inside = (x < width) & (y0 <= y) & (y < y1)
            live[p] = one if inside else zero
            inside_block += 1 if inside else 0
        block_live[block] = inside_block
        n_live += inside_block
    for k in range(start, offsets[t + 1]):
        if n_live == 0:
            break
        reached, changed = int(packed[k, BLOCKS_REACHED]), 0
        for block in range(BLOCKS):
            if reached >> block & 1 and block_live[block] > 0:
                stopped, any_changed = _blend_splat(
                    k, packed, dtype.type(k - start), px, py, T, live, last, acc,
                    block * BLOCK, (block + 1) * BLOCK, with_depth)
                block_live[block] -= stopped
                n_live -= stopped
                changed |= (1 << block) if any_changed else 0
        # The backward walks only these: in the others the splat changed no pixel,
        # so it has no gradient there.
        packed[k, BLOCKS_REACHED] = changed
        out_blocks[k] = changed
    for p in range(PIXELS):
        x, y = _tile_xy(p)
        x, y = tile_x * TILE + x, tile_y * TILE + y
        if x < width and y0 <= y and y < y1:
            for ch in range(3):
                out_rgb[y - y0, x, ch] = acc[ch, p] + T[p] * background[ch]
            # Tested as written, not as ``with_depth``: numba drops a branch on an
            # argument that is None before typing, so None is never indexed.
            if out_depth is not None:
                out_depth[y - y0, x] = acc[3, p]
            out_T[y - y0, x] = T[p]
            out_last[y - y0, x] = start + int(last[p])


@nb.njit(inline="always", fastmath=True)
def _backprop_splat(k, packed, local_k, px, py, T, last, v_out, behind, tail, reached, out,
                    absgrad, with_depth):
    """Gradient of intersection k's splat over the blocks set in ``reached`` (a mask of
    BLOCKS bits), written to ``out[k]`` (with ``absgrad``, a constant, its absolute
    per-pixel means2d gradients summed too; without ``with_depth``, a constant, its
    depth's is zero and the depth channel's gradients are not read).

    Un-blends the splat (T recovered by division, as the CUDA kernels do). Per
    pixel, ``v_out`` is d loss / d pixel channels, ``behind`` the channels of
    the splats behind this one dotted with it, ``tail`` T_final times d loss
    through the background weight.
    """
    zero, one, half, alpha_max, alpha_min, _ = _constants(px.dtype)
    mx, my = packed[k, MEAN_X], packed[k, MEAN_Y]
    ca, cb, cc = packed[k, CONIC_A], packed[k, CONIC_B], packed[k, CONIC_C]
    opacity = packed[k, OPACITY]
    c0, c1, c2, c3 = packed[k, RED], packed[k, GREEN], packed[k, BLUE], packed[k, DEPTH]
    # d sigma / d(conic, mean) are products of dx, dy: sum v_sigma times each over the
    # pixels, and form the gradients once per splat after the loop.
    s_x = s_y = s_xx = s_xy = s_yy = v_op = v_c0 = v_c1 = v_c2 = v_c3 = zero
    abs_x = abs_y = zero
    # Each run of consecutive reached blocks is one pixel loop, not a loop per block:
    # every loop ends in a horizontal sum of each of its ten vector accumulators (nine
    # without depth).
    # Each run is found from the mask's trailing zero bits (its first block), then from
    # those of the complement (its length), not by a test of each block: which blocks a
    # splat reaches is as good as random, so such a branch is hard to predict.
    todo = reached
    while todo != 0:
        block = trailing_zeros(todo)
        end = block + trailing_zeros(~(todo >> block))
        todo &= -1 << end
        for p in _pixels(block * BLOCK, end * BLOCK):
            dx, dy = mx - px[p], my - py[p]
            sigma = half * (ca * dx * dx + cc * dy * dy) + cb * dx * dy
            gauss = _exp_neg(sigma)
            raw_alpha = opacity * gauss
            alpha = raw_alpha if raw_alpha < alpha_max else alpha_max
            in_front = one if local_k <= last[p] else zero
            visible = one if sigma >= zero else zero
            strong = one if alpha >= alpha_min else zero
            u = in_front * visible * strong
            ra = one / (one - alpha)
            T_here = T[p] * ra
            T[p] *= u * ra + (one - u)  # exact blend: ra or 1
            weight = u * alpha * T_here
            o0, o1, o2 = v_out[0, p], v_out[1, p], v_out[2, p]
            v_c0 += weight * o0
            v_c1 += weight * o1
            v_c2 += weight * o2
            q = c0 * o0 + c1 * o1 + c2 * o2
            if with_depth:
                o3 = v_out[3, p]
                v_c3 += weight * o3
                q += c3 * o3
            v_a = u * (T_here * q - ra * (behind[p] + tail[p]))
            behind[p] += weight * q
            unclamped = one if raw_alpha < alpha_max else zero
            v_raw = v_a * unclamped
            v_op += gauss * v_raw
            v_sigma = -raw_alpha * v_raw
            x_sigma, y_sigma = dx * v_sigma, dy * v_sigma
            s_x += x_sigma
            s_y += y_sigma
            s_xx += dx * x_sigma
            s_xy += dy * x_sigma
            s_yy += dy * y_sigma
            if absgrad:  # this pixel's own d loss / d mean (gsplat's v_xy_local)
                abs_x += abs(v_sigma * (ca * dx + cb * dy))
                abs_y += abs(v_sigma * (cb * dx + cc * dy))
    out[k, GRAD_MEAN], out[k, GRAD_MEAN + 1] = ca * s_x + cb * s_y, cc * s_y + cb * s_x
    out[k, GRAD_CONIC], out[k, GRAD_CONIC + 1] = half * s_xx, s_xy
    out[k, GRAD_CONIC + 2] = half * s_yy
    out[k, GRAD_OPACITY] = v_op
    out[k, GRAD_COLOR], out[k, GRAD_COLOR + 1] = v_c0, v_c1
    out[k, GRAD_COLOR + 2], out[k, GRAD_COLOR + 3] = v_c2, v_c3
    if absgrad:
        out[k, GRAD_ABS_MEAN], out[k, GRAD_ABS_MEAN + 1] = abs_x, abs_y


@nb.njit(parallel=True, fastmath=True, cache=True)
def backward(packed, background, offsets, tile_order, tiles_x, tile_row0, width, y0, y1, final_T,
             last_index, v_rgb, v_depth, v_alpha, isect_grads):
    """Walk each tile back to front, one gradient row per intersection (every row of
    ``isect_grads`` written, up to GRAD_DEPTH). ``v_depth`` None: the forward
    composited no depth (its gradient is zero). ``isect_grads`` may be ``packed``
    itself: a row is read before it is written, and its BLOCKS_REACHED column kept
    (zeroed behind every pixel's last contributor, where no backward reads it)."""
    for i in nb.prange(tile_order.shape[0]):
        _backprop_tile(tile_order[i], packed, background, offsets, tiles_x, tile_row0, width,
                       y0, y1, final_T, last_index, v_rgb, v_depth, v_alpha, isect_grads, False)


@nb.njit(parallel=True, fastmath=True, cache=True)
def backward_with_absgrad(packed, background, offsets, tile_order, tiles_x, tile_row0, width, y0,
                          y1, final_T, last_index, v_rgb, v_depth, v_alpha, isect_grads):
    """``backward``, up to GRAD_ABS_MEAN + 1: each intersection's absolute per-pixel
    means2d gradients summed too."""
    for i in nb.prange(tile_order.shape[0]):
        _backprop_tile(tile_order[i], packed, background, offsets, tiles_x, tile_row0, width,
                       y0, y1, final_T, last_index, v_rgb, v_depth, v_alpha, isect_grads, True)


# The backward's per-pixel rows: px, py, T, last, tail, behind, then v_out's CHANNELS.
BACKWARD_ROWS = 6 + CHANNELS


@nb.njit(fastmath=True, error_model="numpy")  # (``_composite_tile`` says why)
def _backprop_tile(t, packed, background, offsets, tiles_x, tile_row0, width, y0, y1, final_T,
                   last_index, v_rgb, v_depth, v_alpha, isect_grads,
                   absgrad):  # pragma: no cover - compiled
    """The backward of tile t; ``absgrad`` compiled as a constant (each kernel above has
    only its own branches, and neither pays a run-time test in the pixel loop), as is
    whether ``v_depth`` is None."""
    nb.literally(absgrad)
    one = _constants(packed.dtype)[1]
    dtype = packed.dtype
    with_depth = v_depth is not None
    tile_x, tile_y = t % tiles_x, tile_row0 + t // tiles_x
    # The pixels' values in one array, not one each: LLVM then sees that they never
    # overlap (their rows lie at fixed distances) and vectorises each pixel loop below
    # without first testing at run time, for every run of blocks, whether they do.
    pixel_values = np.zeros((BACKWARD_ROWS, PIXELS), dtype)
    px, py, T, last = pixel_values[0], pixel_values[1], pixel_values[2], pixel_values[3]
    tail, behind, v_out = pixel_values[4], pixel_values[5], pixel_values[6:]
    _set_pixel_centres(px, py, tile_x, tile_y)
    T[:] = one
    last[:] = -one  # tile-local, as in forward
    start = offsets[t]
    k_max = start - 1
    # The image's pixels of the tile, row by row of the image (its arrays read in
    # order, not a branch a pixel), each into its place in the blocks.
    for row in range(max(0, y0 - tile_y * TILE), min(TILE, y1 - tile_y * TILE)):
        y = tile_y * TILE + row - y0
        for column in range(min(TILE, width - tile_x * TILE)):
            p = _tile_pixel(column, row)
            x = tile_x * TILE + column
            T[p] = final_T[y, x]
            last[p] = last_index[y, x] - start
            k_max = max(k_max, last_index[y, x])
            weighted_bg = -v_alpha[y, x]
            for ch in range(3):
                v_out[ch, p] = v_rgb[y, x, ch]
                weighted_bg += background[ch] * v_out[ch, p]
            if v_depth is not None:  # (``_composite_tile`` says why not ``with_depth``)
                v_out[3, p] = v_depth[y, x]
            tail[p] = T[p] * weighted_bg
    isect_grads[k_max + 1:offsets[t + 1]] = 0  # behind every pixel's last contributor
    for k in range(k_max, start - 1, -1):
        # The blocks where the forward's splat changed a pixel (forward narrowed them).
        reached = int(packed[k, BLOCKS_REACHED])
        _backprop_splat(k, packed, dtype.type(k - start), px, py, T, last, v_out, behind,
                        tail, reached, isect_grads, absgrad, with_depth)


@nb.njit(cache=True)
def _sum_rows_of(lo, hi, splat_ids, isect_grads, v_means2d, v_conics, v_opacities, v_colors,
                 v_depths, v_abs):  # pragma: no cover - compiled
    """For s in [lo, hi): each gradient of splat s, zero plus its intersections' rows.
    (Rows read by index, not as views: a view costs an atomic reference count.)"""
    absgrad = v_abs.shape[0] > 0
    for s in range(lo, hi):  # loops, not slice assignments: compiled sooner
        v_means2d[s, 0] = v_means2d[s, 1] = v_opacities[s] = v_depths[s] = 0
        v_conics[s, 0] = v_conics[s, 1] = v_conics[s, 2] = 0
        v_colors[s, 0] = v_colors[s, 1] = v_colors[s, 2] = 0
        if absgrad:
            v_abs[s, 0] = v_abs[s, 1] = 0
    for k in range(splat_ids.shape[0]):
        s = splat_ids[k]
        if lo <= s < hi:
            v_means2d[s, 0] += isect_grads[k, GRAD_MEAN]
            v_means2d[s, 1] += isect_grads[k, GRAD_MEAN + 1]
            v_conics[s, 0] += isect_grads[k, GRAD_CONIC]
            v_conics[s, 1] += isect_grads[k, GRAD_CONIC + 1]
            v_conics[s, 2] += isect_grads[k, GRAD_CONIC + 2]
            v_opacities[s] += isect_grads[k, GRAD_OPACITY]
            v_colors[s, 0] += isect_grads[k, GRAD_COLOR]
            v_colors[s, 1] += isect_grads[k, GRAD_COLOR + 1]
            v_colors[s, 2] += isect_grads[k, GRAD_COLOR + 2]
            v_depths[s] += isect_grads[k, GRAD_DEPTH]
            if absgrad:
                v_abs[s, 0] += isect_grads[k, GRAD_ABS_MEAN]
                v_abs[s, 1] += isect_grads[k, GRAD_ABS_MEAN + 1]


@nb.njit(parallel=True, cache=True)
def sum_per_splat(splat_ids, isect_grads, v_means2d, v_conics, v_opacities, v_colors, v_depths,
                  v_abs, parts):  # pragma: no cover - compiled
    """Each splat's gradients (written whole, zero where it has no intersection): the sum
    of its intersections' gradient rows, in intersection order, into one contiguous
    array per quantity; ``v_abs`` (the absgrad columns) where it has rows, else empty.
    Each of ``parts`` tasks takes a range of splats (and reads every splat id): a
    splat's sum never depends on their number."""
    count = v_opacities.shape[0]
    for part in nb.prange(parts):
        _sum_rows_of(part * count // parts, (part + 1) * count // parts, splat_ids, isect_grads,
                     v_means2d, v_conics, v_opacities, v_colors, v_depths, v_abs)

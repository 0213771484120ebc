"""Numba compositing kernels of the cpu backend: forward and backward per 16x16 tile.

Each tile is independent (``prange`` over tiles). Inside a tile the loop over
its depth-sorted splats is outside and the 256 pixels are inside, so LLVM
vectorises the pixel loop; every per-pixel decision is a select, not a branch.
Each splat is evaluated only on the tile rows its box reaches. The
kernels composite exactly four channels, RGB and depth, fused into the pixel
loop rather than looped over.
The backward pass writes one gradient row per intersection; rows are summed per
splat afterwards in a fixed order, so results never depend on thread timing.

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
from numba.extending import intrinsic, overload

from splatscale.render.conventions import ALPHA_MAX, ALPHA_MIN, T_MIN
from splatscale.render.conventions import TILE_SIZE as TILE

PIXELS = TILE * TILE
# Beyond this sigma, alpha < 1/255 whatever the opacity (ln 255 = 5.54), so exp's value is moot.
SIGMA_CAP = 10.0

CHANNELS = 4  # red, green, blue, depth
# Gradient row layout per intersection: means2d (2), conic (3), opacity, rgb (3), depth.
GRAD_MEAN, GRAD_CONIC, GRAD_OPACITY, GRAD_COLOR, GRAD_DEPTH = 0, 2, 5, 6, 9
GRAD_WIDTH = 10


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
    # exp(-s) = 2^-n exp(r), n = round(s / ln 2), |r| <= ln2/2; exp(r) by its degree-7
    # Taylor polynomial (truncation 5e-9): relative error < 1e-7, branch-free.
    f32 = np.float32
    zero, cap, half = f32(0), f32(SIGMA_CAP), f32(0.5)
    log2e = f32(1.0 / math.log(2.0))
    ln2_hi = f32(0.693145751953125)  # few mantissa bits: n * ln2_hi is exact
    ln2_lo = f32(math.log(2.0) - 0.693145751953125)
    c0, c1, c2, c3, c4, c5, c6, c7 = (f32(1.0 / math.factorial(i)) for i in range(8))

    def fast(s):
        s = min(max(s, zero), cap)
        n = np.floor(s * log2e + half)
        r = (n * ln2_hi - s) + n * ln2_lo
        poly = c0 + r * (c1 + r * (c2 + r * (c3 + r * (c4 + r * (c5 + r * (c6 + r * c7))))))
        return poly * _exp2_of_integer(-n)

    return fast


@nb.njit(inline="always")
def _pixel_span(my, radius_y, tile_y):
    """The pixels [lo, hi) of a tile in the rows the splat's box reaches.

    Beyond its box (3.33 sigma) a splat's alpha is below 1/255, so skipping the
    other rows changes no pixel and no gradient; one row of slack each side
    absorbs rounding. The span is widened to whole pairs of rows (32 pixels, a
    multiple of the vectorised loop's stride) so no scalar remainder loop runs.
    """
    top = my - radius_y - tile_y * TILE
    pair_lo = max(0, int(math.floor(top)) - 1) // 2
    pair_hi = (min(TILE, int(math.ceil(top + 2 * radius_y)) + 1) + 1) // 2
    return pair_lo * 2 * TILE, max(pair_lo, pair_hi) * 2 * TILE


@nb.njit(inline="always")
def _pixels(lo, hi):
    """range(lo, hi) with an unsigned index: numba then drops the negative-index
    wraparound that would otherwise turn every array access into a gather."""
    return range(np.uint64(lo), np.uint64(hi))

@nb.njit(inline="always")
def _pixel_centres(tile_x, tile_y, dtype):
    """x and y of the tile's 256 pixel centres, row-major."""
    half = _constants(dtype)[2]
    px = np.empty(PIXELS, dtype)
    py = np.empty(PIXELS, dtype)
    for p in range(PIXELS):
        px[p] = tile_x * TILE + p % TILE + half
        py[p] = tile_y * TILE + p // TILE + half
    return px, py


@nb.njit(inline="always", fastmath=True)
def _blend_splat(g, means2d, conics, opacities, colors, depths, local_k, px, py, T, live,
                 last, acc, lo, hi):
    """Blend splat g into pixels [lo, hi); returns how many pixels it finished."""
    zero, one, half, alpha_max, alpha_min, t_min = _constants(px.dtype)
    mx, my = means2d[g, 0], means2d[g, 1]
    ca, cb, cc = conics[g, 0], conics[g, 1], conics[g, 2]
    opacity = opacities[g]
    c0, c1, c2, c3 = colors[g, 0], colors[g, 1], colors[g, 2], depths[g]
    stopped = zero
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
        acc[3, p] += c3 * weight
        # Arithmetic blends, not selects of loaded values: LLVM vectorises these,
        # and with contributes in {0, 1} both are exact.
        T[p] = T_here * (one - contributes * alpha)
        last[p] += contributes * (local_k - last[p])
        live[p] -= stop
        stopped += stop
    return int(stopped)


@nb.njit(parallel=True, fastmath=True, cache=True)
def forward(means2d, conics, opacities, colors, depths, background, radii, splat_ids, offsets,
            tile_order, tiles_x, tile_row0, width, y0, y1, out_rgb, out_depth, out_T, out_last):
    """Composite each tile front to back; keep final T and the last splat per pixel.

    ``out_depth`` gets the alpha-weighted depth sum (no background).
    """
    zero, one, _, _, _, _ = _constants(means2d.dtype)
    dtype = means2d.dtype
    for i in nb.prange(tile_order.shape[0]):
        t = tile_order[i]
        tile_x, tile_y = t % tiles_x, tile_row0 + t // tiles_x
        px, py = _pixel_centres(tile_x, tile_y, dtype)
        T = np.ones(PIXELS, dtype)
        live = np.empty(PIXELS, dtype)
        last = np.full(PIXELS, -one, dtype)  # tile-local index of the last contributor
        acc = np.zeros((CHANNELS, PIXELS), dtype)
        start = offsets[t]
        n_live = 0
        for p in range(PIXELS):
            x, y = tile_x * TILE + p % TILE, tile_y * TILE + p // TILE
            inside = x < width and y0 <= y and y < y1
            live[p] = one if inside else zero
            n_live += inside
        for k in range(start, offsets[t + 1]):
            if n_live == 0:
                break
            g = splat_ids[k]
            lo, hi = _pixel_span(means2d[g, 1], radii[g, 1], tile_y)
            n_live -= _blend_splat(g, means2d, conics, opacities, colors, depths,
                                   dtype.type(k - start), px, py, T, live, last, acc, lo, hi)
        for p in range(PIXELS):
            x, y = tile_x * TILE + p % TILE, tile_y * TILE + p // TILE
            if x < width and y0 <= y and y < y1:
                for ch in range(3):
                    out_rgb[y - y0, x, ch] = acc[ch, p] + T[p] * background[ch]
                out_depth[y - y0, x] = acc[3, p]
                out_T[y - y0, x] = T[p]
                out_last[y - y0, x] = start + int(last[p])


@nb.njit(inline="always", fastmath=True)
def _backprop_splat(g, means2d, conics, opacities, colors, depths, local_k, px, py, T, last,
                    v_out, behind, tail, lo, hi, out, row):
    """Gradient of splat g over pixels [lo, hi), written to ``out[row]``.

    Un-blends the splat (T recovered by division, as the CUDA kernels do). Per
    pixel, ``v_out`` is d loss / d pixel channels, ``behind`` the channels of
    the splats behind this one dotted with it, ``tail`` T_final times d loss
    through the background weight.
    """
    zero, one, half, alpha_max, alpha_min, _ = _constants(px.dtype)
    mx, my = means2d[g, 0], means2d[g, 1]
    ca, cb, cc = conics[g, 0], conics[g, 1], conics[g, 2]
    opacity = opacities[g]
    c0, c1, c2, c3 = colors[g, 0], colors[g, 1], colors[g, 2], depths[g]
    # d sigma / d(conic, mean) are products of dx, dy: sum v_sigma times each over the
    # pixels, and form the gradients once per splat after the loop.
    s_x = s_y = s_xx = s_xy = s_yy = v_op = v_c0 = v_c1 = v_c2 = v_c3 = zero
    for p in _pixels(lo, hi):
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
        o0, o1, o2, o3 = v_out[0, p], v_out[1, p], v_out[2, p], v_out[3, p]
        v_c0 += weight * o0
        v_c1 += weight * o1
        v_c2 += weight * o2
        v_c3 += weight * o3
        q = c0 * o0 + c1 * o1 + c2 * o2 + c3 * o3
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
    out[row, GRAD_MEAN], out[row, GRAD_MEAN + 1] = ca * s_x + cb * s_y, cc * s_y + cb * s_x
    out[row, GRAD_CONIC], out[row, GRAD_CONIC + 1] = half * s_xx, s_xy
    out[row, GRAD_CONIC + 2] = half * s_yy
    out[row, GRAD_OPACITY] = v_op
    out[row, GRAD_COLOR], out[row, GRAD_COLOR + 1] = v_c0, v_c1
    out[row, GRAD_COLOR + 2], out[row, GRAD_COLOR + 3] = v_c2, v_c3


@nb.njit(parallel=True, fastmath=True, cache=True)
def backward(means2d, conics, opacities, colors, depths, background, radii, splat_ids, offsets,
             tile_order, tiles_x, tile_row0, width, y0, y1, final_T, last_index, v_rgb, v_depth,
             v_alpha, isect_grads):
    """Walk each tile back to front, one gradient row per intersection."""
    one = _constants(means2d.dtype)[1]
    dtype = means2d.dtype
    for i in nb.prange(tile_order.shape[0]):
        t = tile_order[i]
        tile_x, tile_y = t % tiles_x, tile_row0 + t // tiles_x
        px, py = _pixel_centres(tile_x, tile_y, dtype)
        T = np.ones(PIXELS, dtype)
        last = np.full(PIXELS, -one, dtype)  # tile-local, as in forward
        v_out = np.zeros((CHANNELS, PIXELS), dtype)
        tail = np.zeros(PIXELS, dtype)
        behind = np.zeros(PIXELS, dtype)
        start = offsets[t]
        k_max = start - 1
        for p in range(PIXELS):
            x, y = tile_x * TILE + p % TILE, tile_y * TILE + p // TILE
            if x < width and y0 <= y and y < y1:
                T[p] = final_T[y - y0, x]
                last[p] = last_index[y - y0, x] - start
                k_max = max(k_max, last_index[y - y0, x])
                weighted_bg = -v_alpha[y - y0, x]
                for ch in range(3):
                    v_out[ch, p] = v_rgb[y - y0, x, ch]
                    weighted_bg += background[ch] * v_out[ch, p]
                v_out[3, p] = v_depth[y - y0, x]
                tail[p] = T[p] * weighted_bg
        for k in range(k_max, start - 1, -1):
            g = splat_ids[k]
            lo, hi = _pixel_span(means2d[g, 1], radii[g, 1], tile_y)
            _backprop_splat(g, means2d, conics, opacities, colors, depths, dtype.type(k - start),
                            px, py, T, last, v_out, behind, tail, lo, hi, isect_grads, k)


@nb.njit(cache=True)
def sum_per_splat(splat_ids, isect_grads, out):
    """out[s] += the gradient rows of splat s's intersections, in intersection order."""
    for k in range(splat_ids.shape[0]):
        s = splat_ids[k]
        for j in range(isect_grads.shape[1]):
            out[s, j] += isect_grads[k, j]

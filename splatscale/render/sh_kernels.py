"""Colours of (camera, Gaussian) pairs from spherical harmonics, as numba kernels.

The cpu backend's view-dependent colour, forward and backward, one parallel
pass over the pairs each way with nothing saved but the inputs and where the
clamp held each colour. ``sh.py`` is its reference (and runs on other devices);
the kernels follow it:

    n = (mean - centre) / |mean - centre|;  raw = sum_k basis_k(n) coeff_k
    colour = max(raw + 1/2, 0)

with the 3DGS basis of ``sh.sh_basis`` (degree 0 needs no direction). The
backward adds each pair's gradient to its Gaussian's rows camera by camera,
like the projection kernels, so results do not depend on the thread count.
Like them, they read rows by index, not as views, and run chunks of pairs in
parallel (see ``projection_kernels``).

Like the projection's, the arithmetic runs on the vector units, ``LANES`` pairs at a
time: a pair's offset and coefficients (up to the degree, 0 to 3) are gathered into
one row a value (``_fill_lanes``), each band of the basis and its sums is a loop over
the lanes (counted with unsigned indices: ``projection_kernels._lane_gradients`` says
why), and the results are written out, the backward's added to the Gaussians' rows in
pair order. The bands group the sums as the code before them did, which took one pair
at a time; its operations and precisions (float64, as the float64 constants make
them) are each lane's. Its fast-math sums reassociate otherwise in the lanes: float64
results differ from it by about an ulp, and a float32 result would differ only where
such an ulp crossed a float32 rounding boundary (none did in
``tests/test_sh_kernels.py``, nor in a trained model). The backward takes the
forward's clamps rather than summing the colours again.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange

from splatscale.model.gaussians import SH_C0
from splatscale.render.projection_kernels import CHUNK, LANES, chunk_of, pair_chunks
from splatscale.render.sh import SH_C1, SH_C2, SH_C3

# Sums may be reassociated and multiply-adds fused; nothing assumes finite values.
FASTMATH = {"reassoc", "contract"}


# A lane's inputs (``_fill_lanes``), one row each: the offset from the camera, sh0's three
# values and shN's 45 (row SHN + 3 (k - 1) + channel: coefficient k's).
OFFSET, SH0, SHN, LANE_INPUTS = 0, 3, 6, 51


@numba.njit(inline="always")
def _fill_lanes(lanes, j, means, sh0, shN, used, g, centres, c):  # pragma: no cover - compiled
    """lanes[:SHN + 3 used, j]: Gaussian g's offset from camera c, sh0 and the first
    ``used`` coefficients of shN (those above are neither read nor written)."""
    lanes[OFFSET, j] = means[g, 0] - centres[c, 0]
    lanes[OFFSET + 1, j] = means[g, 1] - centres[c, 1]
    lanes[OFFSET + 2, j] = means[g, 2] - centres[c, 2]
    lanes[SH0, j], lanes[SH0 + 1, j], lanes[SH0 + 2, j] = sh0[g, 0, 0], sh0[g, 0, 1], sh0[g, 0, 2]
    # Band by band: loops of a fixed length, which LLVM unrolls.
    if used >= 3:
        _copy_coefficients(lanes, j, shN, g, 0, 3)
    if used >= 8:
        _copy_coefficients(lanes, j, shN, g, 3, 8)
    if used >= 15:
        _copy_coefficients(lanes, j, shN, g, 8, 15)


@numba.njit(inline="always")
def _copy_coefficients(lanes, j, shN, g, lo, hi):  # pragma: no cover - compiled
    """lanes' rows of shN[g, k] (coefficient k + 1) for k from lo below hi."""
    for k in range(lo, hi):
        lanes[SHN + 3 * k, j] = shN[g, k, 0]
        lanes[SHN + 3 * k + 1, j] = shN[g, k, 1]
        lanes[SHN + 3 * k + 2, j] = shN[g, k, 2]


@numba.njit(inline="always")
def _band_1(lanes, basis, j, c):  # pragma: no cover - compiled
    """sum_k basis_k coeff_k over band 1 in channel c, one sum of its terms as the
    pair-by-pair code grouped it (``_band_2``, ``_band_3``: bands 2 and 3)."""
    return (basis[0, j] * lanes[SHN + c, j] + basis[1, j] * lanes[SHN + 3 + c, j]
            + basis[2, j] * lanes[SHN + 6 + c, j])


@numba.njit(inline="always")
def _band_2(lanes, basis, j, c):  # pragma: no cover - compiled
    return (basis[3, j] * lanes[SHN + 9 + c, j] + basis[4, j] * lanes[SHN + 12 + c, j]
            + basis[5, j] * lanes[SHN + 15 + c, j] + basis[6, j] * lanes[SHN + 18 + c, j]
            + basis[7, j] * lanes[SHN + 21 + c, j])


@numba.njit(inline="always")
def _band_3(lanes, basis, j, c):  # pragma: no cover - compiled
    return (basis[8, j] * lanes[SHN + 24 + c, j] + basis[9, j] * lanes[SHN + 27 + c, j]
            + basis[10, j] * lanes[SHN + 30 + c, j] + basis[11, j] * lanes[SHN + 33 + c, j]
            + basis[12, j] * lanes[SHN + 36 + c, j] + basis[13, j] * lanes[SHN + 39 + c, j]
            + basis[14, j] * lanes[SHN + 42 + c, j])


@numba.njit(inline="always")
def _band_1_basis(x, y, z):  # pragma: no cover - compiled
    """basis_1 to basis_3 at unit (x, y, z) (``_band_2_basis``, ``_band_3_basis``: the
    next bands')."""
    return -SH_C1 * y, SH_C1 * z, -SH_C1 * x


@numba.njit(inline="always")
def _band_2_basis(x, y, z):  # pragma: no cover - compiled
    """basis_4 to basis_8."""
    xx, yy, zz = x * x, y * y, z * z
    return (SH_C2[0] * x * y, SH_C2[1] * y * z, SH_C2[2] * (2 * zz - xx - yy),
            SH_C2[3] * x * z, SH_C2[4] * (xx - yy))


@numba.njit(inline="always")
def _band_3_basis(x, y, z):  # pragma: no cover - compiled
    """basis_9 to basis_15."""
    xx, yy, zz = x * x, y * y, z * z
    return (SH_C3[0] * y * (3 * xx - yy), SH_C3[1] * x * y * z,
            SH_C3[2] * y * (4 * zz - xx - yy), SH_C3[3] * z * (2 * zz - 3 * xx - 3 * yy),
            SH_C3[4] * x * (4 * zz - xx - yy), SH_C3[5] * z * (xx - yy),
            SH_C3[6] * x * (xx - 3 * yy))


@numba.njit(inline="always")
def _unit_direction(lanes, unit, j):  # pragma: no cover - compiled
    """unit[:, j]: lane j's unit direction from the camera and the distance divided by."""
    dx, dy, dz = lanes[OFFSET, j], lanes[OFFSET + 1, j], lanes[OFFSET + 2, j]
    norm = max(math.sqrt(dx * dx + dy * dy + dz * dz), 1e-12)
    x, y, z = dx / norm, dy / norm, dz / norm
    unit[0, j], unit[1, j], unit[2, j], unit[3, j] = x, y, z, norm
    return x, y, z


@numba.njit(inline="always")
def _raw_colors(count, degree, lanes, unit, basis, raw):  # pragma: no cover - compiled
    """raw[:, j]: the sum before the offset and clamp of lanes j below ``count``; for
    ``degree`` >= 1 also unit[:, j] (``_unit_direction``) and basis[k - 1, j] = basis_k
    for k up to the degree. Band by band, each band a loop with no test inside: LLVM
    keeps a loop with the degree's tests inside it scalar, and a loop of its own for
    each degree would compile four times the code."""
    if degree == 0:
        for j in range(np.uint64(0), count):
            raw[0, j] = SH_C0 * lanes[SH0, j]
            raw[1, j] = SH_C0 * lanes[SH0 + 1, j]
            raw[2, j] = SH_C0 * lanes[SH0 + 2, j]
        return
    for j in range(np.uint64(0), count):
        x, y, z = _unit_direction(lanes, unit, j)
        basis[0, j], basis[1, j], basis[2, j] = _band_1_basis(x, y, z)
        raw[0, j] = SH_C0 * lanes[SH0, j] + _band_1(lanes, basis, j, 0)
        raw[1, j] = SH_C0 * lanes[SH0 + 1, j] + _band_1(lanes, basis, j, 1)
        raw[2, j] = SH_C0 * lanes[SH0 + 2, j] + _band_1(lanes, basis, j, 2)
    if degree == 1:
        return
    for j in range(np.uint64(0), count):
        (basis[3, j], basis[4, j], basis[5, j], basis[6, j],
         basis[7, j]) = _band_2_basis(unit[0, j], unit[1, j], unit[2, j])
        raw[0, j] += _band_2(lanes, basis, j, 0)
        raw[1, j] += _band_2(lanes, basis, j, 1)
        raw[2, j] += _band_2(lanes, basis, j, 2)
    if degree == 2:
        return
    for j in range(np.uint64(0), count):
        (basis[8, j], basis[9, j], basis[10, j], basis[11, j], basis[12, j], basis[13, j],
         basis[14, j]) = _band_3_basis(unit[0, j], unit[1, j], unit[2, j])
        raw[0, j] += _band_3(lanes, basis, j, 0)
        raw[1, j] += _band_3(lanes, basis, j, 1)
        raw[2, j] += _band_3(lanes, basis, j, 2)


@numba.njit(inline="always")
def _work_arrays():  # pragma: no cover - compiled
    """A chunk's float64 rows (the arithmetic's precision), as ``_raw_colors`` and
    ``_lane_gradients`` take them: unit 4, basis 15, raw 3, v 3 and grad 3 (a kernel
    uses three or four of them), views of one allocation."""
    work = np.empty((4 + 15 + 3 + 3 + 3, LANES))
    return work[:4], work[4:19], work[19:22], work[22:25], work[25:]


# numpy's error model: a division by zero gives inf rather than raising, so that no branch
# to raise keeps a lane loop off the vector units (the distance is at least 1e-12).
@numba.njit(nogil=True, cache=True, fastmath=FASTMATH, error_model="numpy")
def _colors_of(lo, hi, means, sh0, shN, degree, gaussian_ids, camera_ids, centres, colors,
               clamped):  # pragma: no cover - compiled
    """Pairs [lo, hi)'s colours, and where the clamp at 0 held each (``sh_forward``),
    ``LANES`` at a time."""
    lanes = np.empty((LANE_INPUTS, LANES), means.dtype)
    unit, basis, raw, _, _ = _work_arrays()
    used = (degree + 1) ** 2 - 1
    for first in range(lo, hi, LANES):
        count = min(LANES, hi - first)
        for j in range(count):
            _fill_lanes(lanes, j, means, sh0, shN, used, gaussian_ids[first + j], centres,
                        camera_ids[first + j])
        _raw_colors(np.uint64(count), degree, lanes, unit, basis, raw)
        for j in range(count):
            for channel in range(3):
                colors[first + j, channel] = max(raw[channel, j] + 0.5, 0.0)
                clamped[first + j, channel] = raw[channel, j] + 0.5 < 0.0


@numba.njit(parallel=True, nogil=True, cache=True)
def sh_forward(means, sh0, shN, degree, gaussian_ids, camera_ids, centres, colors,
               clamped):  # pragma: no cover - compiled
    """colors[i]: pair i's colour (Gaussian gaussian_ids[i] seen from centres[camera_ids[i]]);
    clamped[i]: in which channels the clamp at 0 held it (the backward passes no
    gradient there)."""
    pairs = gaussian_ids.shape[0]
    for chunk in prange((pairs + CHUNK - 1) // CHUNK):
        _colors_of(chunk * CHUNK, min(pairs, (chunk + 1) * CHUNK), means, sh0, shN, degree,
                   gaussian_ids, camera_ids, centres, colors, clamped)


@numba.njit(inline="always")
def _weight(lanes, v, j, k):  # pragma: no cover - compiled
    """w_k = coeff_k . (the colour's gradient)."""
    row = SHN + 3 * (k - 1)
    return lanes[row, j] * v[0, j] + lanes[row + 1, j] * v[1, j] + lanes[row + 2, j] * v[2, j]


@numba.njit(inline="always")
def _lane_gradients(count, degree, lanes, unit, basis, v, grad):  # pragma: no cover - compiled
    """For ``degree`` >= 1 and lanes j below ``count``, whose v[:, j] is the colour's
    gradient where no clamp held it: basis[:, j] and grad[:, j], the means' gradient
    through the direction (sum_k w_k d basis_k / d(x, y, z), then through the
    normalisation). Band by band, as ``_raw_colors``."""
    for j in range(np.uint64(0), count):
        x, y, z = _unit_direction(lanes, unit, j)
        basis[0, j], basis[1, j], basis[2, j] = _band_1_basis(x, y, z)
        w1, w2, w3 = _weight(lanes, v, j, 1), _weight(lanes, v, j, 2), _weight(lanes, v, j, 3)
        grad[0, j], grad[1, j], grad[2, j] = -SH_C1 * w3, -SH_C1 * w1, SH_C1 * w2
    if degree >= 2:
        c = SH_C2
        for j in range(np.uint64(0), count):
            x, y, z = unit[0, j], unit[1, j], unit[2, j]
            (basis[3, j], basis[4, j], basis[5, j], basis[6, j],
             basis[7, j]) = _band_2_basis(x, y, z)
            w4, w5, w6 = _weight(lanes, v, j, 4), _weight(lanes, v, j, 5), _weight(lanes, v, j, 6)
            w7, w8 = _weight(lanes, v, j, 7), _weight(lanes, v, j, 8)
            grad[0, j] += c[0] * y * w4 + c[3] * z * w7 - 2 * c[2] * x * w6 + 2 * c[4] * x * w8
            grad[1, j] += c[0] * x * w4 + c[1] * z * w5 - 2 * c[2] * y * w6 - 2 * c[4] * y * w8
            grad[2, j] += c[1] * y * w5 + 4 * c[2] * z * w6 + c[3] * x * w7
    if degree >= 3:
        c = SH_C3
        for j in range(np.uint64(0), count):
            x, y, z = unit[0, j], unit[1, j], unit[2, j]
            (basis[8, j], basis[9, j], basis[10, j], basis[11, j], basis[12, j], basis[13, j],
             basis[14, j]) = _band_3_basis(x, y, z)
            xx, yy, zz = x * x, y * y, z * z
            w9, w10 = _weight(lanes, v, j, 9), _weight(lanes, v, j, 10)
            w11, w12 = _weight(lanes, v, j, 11), _weight(lanes, v, j, 12)
            w13, w14 = _weight(lanes, v, j, 13), _weight(lanes, v, j, 14)
            w15 = _weight(lanes, v, j, 15)
            grad[0, j] += (6 * c[0] * x * y * w9 + c[1] * y * z * w10 - 2 * c[2] * x * y * w11
                           - 6 * c[3] * x * z * w12 + c[4] * (4 * zz - 3 * xx - yy) * w13
                           + 2 * c[5] * x * z * w14 + 3 * c[6] * (xx - yy) * w15)
            grad[1, j] += (3 * c[0] * (xx - yy) * w9 + c[1] * x * z * w10
                           + c[2] * (4 * zz - xx - 3 * yy) * w11 - 6 * c[3] * y * z * w12
                           - 2 * c[4] * x * y * w13 - 2 * c[5] * y * z * w14
                           - 6 * c[6] * x * y * w15)
            grad[2, j] += (c[1] * x * y * w10 + 8 * c[2] * y * z * w11
                           + c[3] * (6 * zz - 3 * xx - 3 * yy) * w12 + 8 * c[4] * x * z * w13
                           + c[5] * (xx - yy) * w14)
    for j in range(np.uint64(0), count):
        # n = d / |d|: d n / d d = (I - n n^T) / |d|
        x, y, z, norm = unit[0, j], unit[1, j], unit[2, j], unit[3, j]
        gx, gy, gz = grad[0, j], grad[1, j], grad[2, j]
        along = gx * x + gy * y + gz * z
        grad[0, j] = (gx - along * x) / norm
        grad[1, j] = (gy - along * y) / norm
        grad[2, j] = (gz - along * z) / norm


@numba.njit(inline="always")
def _add_lane_gradient(j, g, used, basis, v, grad, v_means, v_sh0,
                       v_shN):  # pragma: no cover - compiled
    """Lane j's gradient (``_lane_gradients``) added to Gaussian g's rows."""
    v0, v1, v2 = v[0, j], v[1, j], v[2, j]
    v_sh0[g, 0, 0] += SH_C0 * v0
    v_sh0[g, 0, 1] += SH_C0 * v1
    v_sh0[g, 0, 2] += SH_C0 * v2
    if used >= 3:  # band by band, as ``_fill_lanes``
        _add_basis_times(j, g, 0, 3, basis, v0, v1, v2, v_shN)
    if used >= 8:
        _add_basis_times(j, g, 3, 8, basis, v0, v1, v2, v_shN)
    if used >= 15:
        _add_basis_times(j, g, 8, 15, basis, v0, v1, v2, v_shN)
    if used > 0:
        v_means[g, 0] += grad[0, j]
        v_means[g, 1] += grad[1, j]
        v_means[g, 2] += grad[2, j]


@numba.njit(inline="always")
def _zero_rows(lo, hi, used, v_means, v_sh0, v_shN):  # pragma: no cover - compiled
    """Rows [lo, hi) of the gradients ``sh_backward`` writes set to zero (of v_means and
    v_shN only where ``used``: at degree 0 they are empty)."""
    for g in range(lo, hi):
        for channel in range(3):
            v_sh0[g, 0, channel] = 0.0
        if used > 0:
            for channel in range(3):
                v_means[g, channel] = 0.0
            for k in range(v_shN.shape[1]):
                for channel in range(3):
                    v_shN[g, k, channel] = 0.0


@numba.njit(inline="always")
def _add_basis_times(j, g, lo, hi, basis, v0, v1, v2, v_shN):  # pragma: no cover - compiled
    """v_shN[g, k] += basis_{k + 1} (v0, v1, v2) for k from lo below hi."""
    for k in range(lo, hi):
        v_shN[g, k, 0] += basis[k, j] * v0
        v_shN[g, k, 1] += basis[k, j] * v1
        v_shN[g, k, 2] += basis[k, j] * v2


@numba.njit(nogil=True, cache=True, fastmath=FASTMATH, error_model="numpy")
def _color_gradients_of(lo, hi, c, rows_lo, rows_hi, means, sh0, shN, degree, gaussian_ids,
                        centres, v_colors, clamped, v_means, v_sh0,
                        v_shN):  # pragma: no cover - compiled
    """Pairs [lo, hi), all of camera c, ``LANES`` at a time; of camera 0, the gradients'
    rows [rows_lo, rows_hi) zeroed first (its share of them, not a pass over every
    row)."""
    lanes = np.empty((LANE_INPUTS, LANES), means.dtype)
    unit, basis, _, v, grad = _work_arrays()
    used = (degree + 1) ** 2 - 1
    if c == 0:
        _zero_rows(rows_lo, rows_hi, used, v_means, v_sh0, v_shN)
    for first in range(lo, hi, LANES):
        count = min(LANES, hi - first)
        for j in range(count):
            i = first + j
            _fill_lanes(lanes, j, means, sh0, shN, used, gaussian_ids[i], centres, c)
            for channel in range(3):  # d loss / d raw: none passes where the clamp held
                v[channel, j] = 0.0 if clamped[i, channel] else v_colors[i, channel]
        if degree > 0:
            _lane_gradients(np.uint64(count), degree, lanes, unit, basis, v, grad)
        for j in range(count):
            _add_lane_gradient(j, gaussian_ids[first + j], used, basis, v, grad, v_means, v_sh0,
                               v_shN)


@numba.njit(parallel=True, nogil=True, cache=True)
def sh_backward(means, sh0, shN, degree, gaussian_ids, camera_offsets, centres, v_colors,
                clamped, v_means, v_sh0, v_shN):  # pragma: no cover - compiled
    """v_means, v_sh0 and v_shN (their values unset before): each Gaussian's sum of its
    pairs' gradients, zero where it has none (v_means and v_shN are empty at degree 0).
    Pairs camera by camera, Gaussians ascending within a camera (``visible_pairs``'
    order), so a camera's pairs run in parallel and each sum follows the camera order
    whatever the number of threads; camera 0's chunks zero the rows up to the next
    chunk's first Gaussian (``chunk_of``). ``clamped``: the forward's."""
    for c in range(camera_offsets.shape[0] - 1):
        lo, hi = camera_offsets[c], camera_offsets[c + 1]
        tasks = pair_chunks(lo, hi, c)
        for chunk in prange(tasks):
            first, end, rows_lo, rows_hi = chunk_of(chunk, lo, hi, gaussian_ids,
                                                    v_sh0.shape[0])
            _color_gradients_of(first, end, c, rows_lo, rows_hi, means, sh0, shN, degree,
                                gaussian_ids, centres, v_colors, clamped, v_means, v_sh0, v_shN)

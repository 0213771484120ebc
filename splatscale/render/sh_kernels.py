"""Colours of (camera, Gaussian) pairs from spherical harmonics, as numba kernels.

The cpu backend's view-dependent colour, forward and backward, one parallel
pass over the pairs each way with nothing saved but the inputs. ``sh.py`` is
its reference (and runs on other devices); the kernels follow it:

    n = (mean - centre) / |mean - centre|;  raw = sum_k basis_k(n) coeff_k
    colour = max(raw + 1/2, 0)

with the 3DGS basis of ``sh.sh_basis`` (degree 0 needs no direction). The
backward adds each pair's gradient to its Gaussian's rows camera by camera,
like the projection kernels, so results do not depend on the thread count.
Like them, they read rows by index, not as views, and run chunks of pairs in
parallel (see ``projection_kernels``).
"""

from __future__ import annotations

import math

import numba
from numba import prange

from splatscale.model.gaussians import SH_C0
from splatscale.render.projection_kernels import CHUNK
from splatscale.render.sh import SH_C1, SH_C2, SH_C3

# Sums may be reassociated and multiply-adds fused (the sixteen-term sums then run in
# parallel); nothing assumes finite values.
FASTMATH = {"reassoc", "contract"}


@numba.njit(inline="always")
def _direction(means, g, centres, c):  # pragma: no cover - compiled
    """The unit direction from camera c to Gaussian g and the distance divided by."""
    dx, dy, dz = (means[g, 0] - centres[c, 0], means[g, 1] - centres[c, 1],
                  means[g, 2] - centres[c, 2])
    norm = max(math.sqrt(dx * dx + dy * dy + dz * dz), 1e-12)
    return dx / norm, dy / norm, dz / norm, norm


@numba.njit(inline="always")
def _basis(degree, x, y, z):  # pragma: no cover - compiled
    """The 16 basis values at unit (x, y, z); those above ``degree`` are 0."""
    b1 = b2 = b3 = b4 = b5 = b6 = b7 = b8 = b9 = b10 = b11 = b12 = b13 = b14 = b15 = 0.0
    if degree >= 1:
        b1, b2, b3 = -SH_C1 * y, SH_C1 * z, -SH_C1 * x
    if degree >= 2:
        xx, yy, zz = x * x, y * y, z * z
        b4, b5, b6 = SH_C2[0] * x * y, SH_C2[1] * y * z, SH_C2[2] * (2 * zz - xx - yy)
        b7, b8 = SH_C2[3] * x * z, SH_C2[4] * (xx - yy)
    if degree >= 3:
        b9, b10 = SH_C3[0] * y * (3 * xx - yy), SH_C3[1] * x * y * z
        b11, b12 = SH_C3[2] * y * (4 * zz - xx - yy), SH_C3[3] * z * (2 * zz - 3 * xx - 3 * yy)
        b13, b14 = SH_C3[4] * x * (4 * zz - xx - yy), SH_C3[5] * z * (xx - yy)
        b15 = SH_C3[6] * x * (xx - 3 * yy)
    return (SH_C0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15)


@numba.njit(inline="always")
def _basis_gradient(degree, x, y, z, w):  # pragma: no cover - compiled
    """sum_k w[k] d basis_k / d(x, y, z) at unit (x, y, z)."""
    gx = gy = gz = 0.0
    if degree >= 1:
        gx, gy, gz = -SH_C1 * w[3], -SH_C1 * w[1], SH_C1 * w[2]
    if degree >= 2:
        c = SH_C2
        gx += c[0] * y * w[4] + c[3] * z * w[7] - 2 * c[2] * x * w[6] + 2 * c[4] * x * w[8]
        gy += c[0] * x * w[4] + c[1] * z * w[5] - 2 * c[2] * y * w[6] - 2 * c[4] * y * w[8]
        gz += c[1] * y * w[5] + 4 * c[2] * z * w[6] + c[3] * x * w[7]
    if degree >= 3:
        c, xx, yy, zz = SH_C3, x * x, y * y, z * z
        gx += (6 * c[0] * x * y * w[9] + c[1] * y * z * w[10] - 2 * c[2] * x * y * w[11]
               - 6 * c[3] * x * z * w[12] + c[4] * (4 * zz - 3 * xx - yy) * w[13]
               + 2 * c[5] * x * z * w[14] + 3 * c[6] * (xx - yy) * w[15])
        gy += (3 * c[0] * (xx - yy) * w[9] + c[1] * x * z * w[10]
               + c[2] * (4 * zz - xx - 3 * yy) * w[11] - 6 * c[3] * y * z * w[12]
               - 2 * c[4] * x * y * w[13] - 2 * c[5] * y * z * w[14] - 6 * c[6] * x * y * w[15])
        gz += (c[1] * x * y * w[10] + 8 * c[2] * y * z * w[11]
               + c[3] * (6 * zz - 3 * xx - 3 * yy) * w[12] + 8 * c[4] * x * z * w[13]
               + c[5] * (xx - yy) * w[14])
    return gx, gy, gz


@numba.njit(inline="always")
def _raw(degree, basis, sh0, shN, g, channel):  # pragma: no cover - compiled
    """sum_k basis_k coeff_k of one channel, band by band up to ``degree``: the
    coefficients above it are not read (training raises the degree only every
    thousand images). Terms are written out: a loop would index the tuple at run
    time, through memory."""
    raw = basis[0] * sh0[g, 0, channel]
    if degree >= 1:
        raw += (basis[1] * shN[g, 0, channel] + basis[2] * shN[g, 1, channel]
                + basis[3] * shN[g, 2, channel])
    if degree >= 2:
        raw += (basis[4] * shN[g, 3, channel] + basis[5] * shN[g, 4, channel]
                + basis[6] * shN[g, 5, channel] + basis[7] * shN[g, 6, channel]
                + basis[8] * shN[g, 7, channel])
    if degree >= 3:
        raw += (basis[9] * shN[g, 8, channel] + basis[10] * shN[g, 9, channel]
                + basis[11] * shN[g, 10, channel] + basis[12] * shN[g, 11, channel]
                + basis[13] * shN[g, 12, channel] + basis[14] * shN[g, 13, channel]
                + basis[15] * shN[g, 14, channel])
    return raw


@numba.njit(inline="always")
def _add_basis_times(degree, basis, v_shN, g, channel, v):  # pragma: no cover - compiled
    """v_shN[g, :, channel] += basis[1:] v up to ``degree`` (the rest stays 0),
    written out like ``_raw``."""
    if degree >= 1:
        v_shN[g, 0, channel] += basis[1] * v
        v_shN[g, 1, channel] += basis[2] * v
        v_shN[g, 2, channel] += basis[3] * v
    if degree >= 2:
        v_shN[g, 3, channel] += basis[4] * v
        v_shN[g, 4, channel] += basis[5] * v
        v_shN[g, 5, channel] += basis[6] * v
        v_shN[g, 6, channel] += basis[7] * v
        v_shN[g, 7, channel] += basis[8] * v
    if degree >= 3:
        v_shN[g, 8, channel] += basis[9] * v
        v_shN[g, 9, channel] += basis[10] * v
        v_shN[g, 10, channel] += basis[11] * v
        v_shN[g, 11, channel] += basis[12] * v
        v_shN[g, 12, channel] += basis[13] * v
        v_shN[g, 13, channel] += basis[14] * v
        v_shN[g, 14, channel] += basis[15] * v


@numba.njit(nogil=True, cache=True, fastmath=FASTMATH)
def _colors_of(lo, hi, means, sh0, shN, degree, gaussian_ids, camera_ids, centres,
               colors):  # pragma: no cover - compiled
    for i in range(lo, hi):
        g = gaussian_ids[i]
        x, y, z, _ = _direction(means, g, centres, camera_ids[i])
        basis = _basis(degree, x, y, z)
        colors[i, 0] = max(_raw(degree, basis, sh0, shN, g, 0) + 0.5, 0.0)
        colors[i, 1] = max(_raw(degree, basis, sh0, shN, g, 1) + 0.5, 0.0)
        colors[i, 2] = max(_raw(degree, basis, sh0, shN, g, 2) + 0.5, 0.0)


@numba.njit(parallel=True, nogil=True, cache=True)
def sh_forward(means, sh0, shN, degree, gaussian_ids, camera_ids, centres,
               colors):  # pragma: no cover - compiled
    """colors[i]: pair i's colour (Gaussian gaussian_ids[i] seen from centres[camera_ids[i]])."""
    pairs = gaussian_ids.shape[0]
    for chunk in prange((pairs + CHUNK - 1) // CHUNK):
        _colors_of(chunk * CHUNK, min(pairs, (chunk + 1) * CHUNK), means, sh0, shN, degree,
                   gaussian_ids, camera_ids, centres, colors)


@numba.njit(inline="always")
def _weights(degree, shN, g, v0, v1, v2):  # pragma: no cover - compiled
    """w[k] = coeff_k . (v0, v1, v2) for k = 1..15 up to ``degree``, 0 above (w[0]
    unused), a tuple: no allocation."""
    def w(k):
        return shN[g, k - 1, 0] * v0 + shN[g, k - 1, 1] * v1 + shN[g, k - 1, 2] * v2
    w1 = w2 = w3 = w4 = w5 = w6 = w7 = w8 = w9 = w10 = w11 = w12 = w13 = w14 = w15 = 0.0
    if degree >= 1:
        w1, w2, w3 = w(1), w(2), w(3)
    if degree >= 2:
        w4, w5, w6, w7, w8 = w(4), w(5), w(6), w(7), w(8)
    if degree >= 3:
        w9, w10, w11, w12, w13, w14, w15 = w(9), w(10), w(11), w(12), w(13), w(14), w(15)
    return (0.0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15)


@numba.njit(inline="always")
def _pair_color_gradient(i, g, c, means, sh0, shN, degree, centres, v_colors, v_means, v_sh0,
                         v_shN):  # pragma: no cover - compiled
    """Adds pair i's gradient (Gaussian g, camera c) to Gaussian g's rows."""
    x, y, z, norm = _direction(means, g, centres, c)
    basis = _basis(degree, x, y, z)
    # d loss / d raw per channel; none passes where the colour was clamped at 0
    v0, v1, v2 = v_colors[i, 0], v_colors[i, 1], v_colors[i, 2]
    if _raw(degree, basis, sh0, shN, g, 0) + 0.5 < 0.0:
        v0 = 0.0
    if _raw(degree, basis, sh0, shN, g, 1) + 0.5 < 0.0:
        v1 = 0.0
    if _raw(degree, basis, sh0, shN, g, 2) + 0.5 < 0.0:
        v2 = 0.0
    v_sh0[g, 0, 0] += basis[0] * v0
    v_sh0[g, 0, 1] += basis[0] * v1
    v_sh0[g, 0, 2] += basis[0] * v2
    _add_basis_times(degree, basis, v_shN, g, 0, v0)
    _add_basis_times(degree, basis, v_shN, g, 1, v1)
    _add_basis_times(degree, basis, v_shN, g, 2, v2)
    if degree == 0:
        return
    gx, gy, gz = _basis_gradient(degree, x, y, z, _weights(degree, shN, g, v0, v1, v2))
    # n = d / |d|: d n / d d = (I - n n^T) / |d|
    along = gx * x + gy * y + gz * z
    v_means[g, 0] += (gx - along * x) / norm
    v_means[g, 1] += (gy - along * y) / norm
    v_means[g, 2] += (gz - along * z) / norm


@numba.njit(nogil=True, cache=True, fastmath=FASTMATH)
def _color_gradients_of(lo, hi, c, means, sh0, shN, degree, gaussian_ids, centres, v_colors,
                        v_means, v_sh0, v_shN):  # pragma: no cover - compiled
    """Pairs [lo, hi), all of camera c."""
    for i in range(lo, hi):
        _pair_color_gradient(i, gaussian_ids[i], c, means, sh0, shN, degree, centres, v_colors,
                             v_means, v_sh0, v_shN)


@numba.njit(parallel=True, nogil=True, cache=True)
def sh_backward(means, sh0, shN, degree, gaussian_ids, camera_offsets, centres, v_colors,
                v_means, v_sh0, v_shN):  # pragma: no cover - compiled
    """Adds each pair's gradient to its Gaussian's rows of v_means, v_sh0, v_shN, camera
    by camera (a Gaussian has at most one pair per camera)."""
    for c in range(camera_offsets.shape[0] - 1):
        lo, hi = camera_offsets[c], camera_offsets[c + 1]
        for chunk in prange((hi - lo + CHUNK - 1) // CHUNK):
            _color_gradients_of(lo + chunk * CHUNK, min(hi, lo + (chunk + 1) * CHUNK), c, means,
                                sh0, shN, degree, gaussian_ids, centres, v_colors, v_means,
                                v_sh0, v_shN)

"""EWA projection of (camera, Gaussian) pairs as numba kernels, forward and backward.

The cpu backend's differentiable projection: one parallel pass over the pairs
each way, no torch graph, nothing saved but the inputs. The torch version in
``projection.py`` is its reference (and runs on other devices); the kernels
follow it operation for operation:

    p = W mean + t;  tx = z clamp(x / z, -lim_neg, lim_pos) (and ty)
    J W = [(fx / z) W_0 - (fx tx / z^2) W_2;  (fy / z) W_1 - (fy ty / z^2) W_2]
    M = R(q / |q|) diag(exp(log_scale));  b_r = (J W)_r M
    cov2d = (b_0.b_0 + eps2d, b_0.b_1, b_1.b_1 + eps2d);  conic = cov2d^-1
    means2d = (fx x / z + cx, fy y / z + cy);  depth = z

The backward writes one gradient row per pair (means 3, quats 4, log-scales 3);
the caller sums them per Gaussian in pair order, so results do not depend on
the number of threads.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange

from splatscale.render.conventions import (ALPHA_MIN, EPS2D, FAR_PLANE, FRUSTUM_CLAMP,
                                           NEAR_PLANE, RADIUS_SIGMAS)

GRAD_WIDTH = 10  # d/d means (3), quats (4), log-scales (3)


@numba.njit(inline="always")
def _rotation(q):  # pragma: no cover - compiled
    """Normalised quaternion (w, x, y, z), its norm, and R as 9 values, row-major."""
    norm = max(math.sqrt(q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + q[3] * q[3]), 1e-12)
    w, x, y, z = q[0] / norm, q[1] / norm, q[2] / norm, q[3] / norm
    rot = np.empty(9, q.dtype)
    rot[0], rot[1], rot[2] = 1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)
    rot[3], rot[4], rot[5] = 2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)
    rot[6], rot[7], rot[8] = 2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)
    return w, x, y, z, norm, rot


@numba.njit(inline="always")
def _camera_point(mean, view):  # pragma: no cover - compiled
    x = view[0, 0] * mean[0] + view[0, 1] * mean[1] + view[0, 2] * mean[2] + view[0, 3]
    y = view[1, 0] * mean[0] + view[1, 1] * mean[1] + view[1, 2] * mean[2] + view[1, 3]
    z = view[2, 0] * mean[0] + view[2, 1] * mean[1] + view[2, 2] * mean[2] + view[2, 3]
    return x, y, z


@numba.njit(inline="always")
def _clamped(offset, z, focal, centre, size):  # pragma: no cover - compiled
    """(t, whether the clamp held it): t = z clamp(offset / z, -lim_neg, lim_pos)."""
    margin = (FRUSTUM_CLAMP - 1.0) * 0.5 * size / focal
    high, low = (size - centre) / focal + margin, centre / focal + margin
    ratio = offset / z
    if ratio > high:
        return z * high, True
    if ratio < -low:
        return z * -low, True
    return z * ratio, False


@numba.njit(inline="always")
def _jw_rows(view, x, y, z, K, width, height):  # pragma: no cover - compiled
    fx, fy, cx, cy = K[0, 0], K[1, 1], K[0, 2], K[1, 2]
    tx, held_x = _clamped(x, z, fx, cx, width)
    ty, held_y = _clamped(y, z, fy, cy, height)
    jw = np.empty((2, 3), view.dtype)
    for i in range(3):
        jw[0, i] = (fx / z) * view[0, i] - (fx * tx / (z * z)) * view[2, i]
        jw[1, i] = (fy / z) * view[1, i] - (fy * ty / (z * z)) * view[2, i]
    return jw, tx, ty, held_x, held_y


@numba.njit(inline="always")
def _cov2d(jw, rot, log_scale):  # pragma: no cover - compiled
    """b = (J W) M row by row, the scales, and cov2d = (a, bb, cc) with eps2d."""
    scale = np.empty(3, jw.dtype)
    b = np.zeros((2, 3), jw.dtype)
    for k in range(3):
        scale[k] = math.exp(log_scale[k])
        for r in range(2):
            b[r, k] = (jw[r, 0] * rot[k] + jw[r, 1] * rot[3 + k]
                       + jw[r, 2] * rot[6 + k]) * scale[k]
    a = b[0, 0] * b[0, 0] + b[0, 1] * b[0, 1] + b[0, 2] * b[0, 2] + EPS2D
    bb = b[0, 0] * b[1, 0] + b[0, 1] * b[1, 1] + b[0, 2] * b[1, 2]
    cc = b[1, 0] * b[1, 0] + b[1, 1] * b[1, 1] + b[1, 2] * b[1, 2] + EPS2D
    return b, scale, a, bb, cc


@numba.njit(parallel=True, nogil=True, cache=True)
def project_forward(means, quats, log_scales, gaussian_ids, camera_ids, viewmats, Ks, sizes,
                    means2d, conics, depths):  # pragma: no cover - compiled
    for i in prange(gaussian_ids.shape[0]):
        g, c = gaussian_ids[i], camera_ids[i]
        view, K = viewmats[c], Ks[c]
        x, y, z = _camera_point(means[g], view)
        jw, _, _, _, _ = _jw_rows(view, x, y, z, K, sizes[c, 0], sizes[c, 1])
        _, _, _, _, _, rot = _rotation(quats[g])
        _, _, a, bb, cc = _cov2d(jw, rot, log_scales[g])
        det = a * cc - bb * bb
        conics[i, 0], conics[i, 1], conics[i, 2] = cc / det, -bb / det, a / det
        means2d[i, 0] = K[0, 0] * x / z + K[0, 2]
        means2d[i, 1] = K[1, 1] * y / z + K[1, 2]
        depths[i] = z


@numba.njit(parallel=True, nogil=True, cache=True)
def project_backward(means, quats, log_scales, gaussian_ids, camera_ids, viewmats, Ks, sizes,
                     v_means2d, v_conics, v_depths, rows):  # pragma: no cover - compiled
    """rows[i]: the pair's gradient of means, quats and log-scales (GRAD_WIDTH)."""
    for i in prange(gaussian_ids.shape[0]):
        g, c = gaussian_ids[i], camera_ids[i]
        view, K = viewmats[c], Ks[c]
        fx, fy = K[0, 0], K[1, 1]
        x, y, z = _camera_point(means[g], view)
        jw, tx, ty, held_x, held_y = _jw_rows(view, x, y, z, K, sizes[c, 0], sizes[c, 1])
        qw, qx, qy, qz, norm, rot = _rotation(quats[g])
        b, scale, a, bb, cc = _cov2d(jw, rot, log_scales[g])
        inv = 1.0 / (a * cc - bb * bb)
        inv2 = inv * inv
        g0, g1, g2 = v_conics[i, 0], v_conics[i, 1], v_conics[i, 2]
        # conic = (cc, -bb, a) / det, det = a cc - bb^2
        v_a = -g0 * cc * cc * inv2 + g1 * bb * cc * inv2 + g2 * (inv - a * cc * inv2)
        v_bb = 2 * g0 * bb * cc * inv2 - g1 * (inv + 2 * bb * bb * inv2) + 2 * g2 * a * bb * inv2
        v_cc = g0 * (inv - a * cc * inv2) + g1 * a * bb * inv2 - g2 * a * a * inv2
        v_b = np.empty((2, 3), means.dtype)
        for k in range(3):
            v_b[0, k] = 2 * v_a * b[0, k] + v_bb * b[1, k]
            v_b[1, k] = 2 * v_cc * b[1, k] + v_bb * b[0, k]
        # b[r, k] = (jw[r] . R[:, k]) s_k
        v_jw = np.zeros((2, 3), means.dtype)
        v_rot = np.zeros(9, means.dtype)
        for k in range(3):
            rows[i, 7 + k] = v_b[0, k] * b[0, k] + v_b[1, k] * b[1, k]  # d/d log s_k
            for r in range(2):
                for m in range(3):
                    v_jw[r, m] += v_b[r, k] * rot[3 * m + k] * scale[k]
                    v_rot[3 * m + k] += v_b[r, k] * jw[r, m] * scale[k]
        # jw[0] = (fx / z) W_0 - (fx tx / z^2) W_2;  jw[1] likewise with fy, ty, W_1
        v_x = v_means2d[i, 0] * fx / z
        v_y = v_means2d[i, 1] * fy / z
        v_z = (v_depths[i] - v_means2d[i, 0] * fx * x / (z * z)
               - v_means2d[i, 1] * fy * y / (z * z))
        v_tx, v_ty = 0.0, 0.0
        z2, z3 = z * z, z * z * z
        for m in range(3):
            v_z += v_jw[0, m] * (-fx / z2 * view[0, m] + 2 * fx * tx / z3 * view[2, m])
            v_z += v_jw[1, m] * (-fy / z2 * view[1, m] + 2 * fy * ty / z3 * view[2, m])
            v_tx += v_jw[0, m] * (-fx / (z * z)) * view[2, m]
            v_ty += v_jw[1, m] * (-fy / (z * z)) * view[2, m]
        # t = z clamp(offset / z): the offset's when free, z's (t / z) when held
        if held_x:
            v_z += v_tx * tx / z
        else:
            v_x += v_tx
        if held_y:
            v_z += v_ty * ty / z
        else:
            v_y += v_ty
        for j in range(3):
            rows[i, j] = view[0, j] * v_x + view[1, j] * v_y + view[2, j] * v_z
        # R of the normalised quaternion (w, x, y, z), then the normalisation
        r = v_rot
        v_w = 2 * (-qz * r[1] + qy * r[2] + qz * r[3] - qx * r[5] - qy * r[6] + qx * r[7])
        v_qx = 2 * (qy * r[1] + qz * r[2] + qy * r[3] - 2 * qx * r[4] - qw * r[5] + qz * r[6]
                    + qw * r[7] - 2 * qx * r[8])
        v_qy = 2 * (-2 * qy * r[0] + qx * r[1] + qw * r[2] + qx * r[3] + qz * r[5] - qw * r[6]
                    + qz * r[7] - 2 * qy * r[8])
        v_qz = 2 * (-2 * qz * r[0] - qw * r[1] + qx * r[2] + qw * r[3] - 2 * qz * r[4]
                    + qy * r[5] + qx * r[6] + qy * r[7])
        along = qw * v_w + qx * v_qx + qy * v_qy + qz * v_qz
        rows[i, 3] = (v_w - qw * along) / norm
        rows[i, 4] = (v_qx - qx * along) / norm
        rows[i, 5] = (v_qy - qy * along) / norm
        rows[i, 6] = (v_qz - qz * along) / norm


@numba.njit(parallel=True, nogil=True, cache=True)
def visibility(means, quats, log_scales, opacity_logits, viewmats, Ks, sizes,
               radii, visible):  # pragma: no cover - compiled
    """``projection._radii_and_visibility`` of every (camera, Gaussian) pair: the box's
    radii [C, N, 2] (0 where invisible) and the test [C, N]."""
    for g in prange(means.shape[0]):
        _, _, _, _, _, rot = _rotation(quats[g])
        opacity = 1.0 / (1.0 + math.exp(-opacity_logits[g]))
        sigmas = min(RADIUS_SIGMAS, math.sqrt(2 * math.log(max(opacity, ALPHA_MIN) / ALPHA_MIN)))
        for c in range(viewmats.shape[0]):
            view, K = viewmats[c], Ks[c]
            width, height = sizes[c, 0], sizes[c, 1]
            x, y, z = _camera_point(means[g], view)
            radii[c, g, 0], radii[c, g, 1], visible[c, g] = 0, 0, False
            if not (NEAR_PLANE < z < FAR_PLANE) or opacity < ALPHA_MIN:
                continue
            jw, _, _, _, _ = _jw_rows(view, x, y, z, K, width, height)
            _, _, a, bb, cc = _cov2d(jw, rot, log_scales[g])
            rx, ry = math.ceil(sigmas * math.sqrt(a)), math.ceil(sigmas * math.sqrt(cc))
            mx = K[0, 0] * x / z + K[0, 2]
            my = K[1, 1] * y / z + K[1, 2]
            if (a * cc - bb * bb > 0 and (rx > 0 or ry > 0) and mx + rx > 0
                    and mx - rx < width and my + ry > 0 and my - ry < height):
                radii[c, g, 0], radii[c, g, 1], visible[c, g] = rx, ry, True

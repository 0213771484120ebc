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
    anti-aliased: compensation = sqrt(max(0, det(cov2d - eps2d I) / det cov2d))

A fisheye camera (``fisheye[c]``) has the equidistant projection instead, as
gsplat 1.5.3's CUDA kernel computes it (``fisheye_proj``, no frustum clamp). Where no
camera is a fisheye, ``fisheye`` is None: numba then prunes the fisheye code before
it compiles, and a run of pinhole cameras never compiles it.

    theta = atan2(|(x, y)| + eps, z + eps);  means2d = f theta (x, y) / (|(x, y)| + eps) + c
    J its Jacobian, from x^2 + eps, y^2 and z (gsplat's ``fisheye_proj``)

and its backward follows that kernel's ``fisheye_proj_vjp``: the means' gradient
through J and J's derivative as the kernel writes them. Its torch reference
differentiates the forward instead; the two differ by about eps relative. Where
gsplat's torch functions and its CUDA kernels differ, the kernels here follow the
CUDA kernels, which the cuda backend runs: that, and the anti-aliased backward's
division by compensation + 1e-6 (``add_blur_vjp``), are the only differences.

The backward adds each pair's gradient (means 3, quats 4, log-scales 3) to its
Gaussian's row camera by camera, so results do not depend on the number of
threads.

Two rules keep a pair's cost at its arithmetic. Temporaries are scalars and
tuples, and rows are read by index (``means[g, 0]``), never as views
(``means[g]``): a numba array, a view too, costs an atomic reference count, and
two threads counting on one array's shared count serialise on its cache line.
For the same reason the parallel loops run over chunks of pairs (``CHUNK``),
each one call of a plain loop: numba counts references to the arrays passed to
a call that it does not inline, and cannot inline these bodies into a parallel
loop (its array analysis fails on their tuples).

The pairs of pinhole cameras run on the vector units, forward and backward, exactly:
``LANES`` pairs at a time, their inputs gathered first into one array a value, then
the arithmetic over the lanes (``_lane_projections``, ``_lane_gradients``), each lane
doing the very operations of the scalar code, in its precisions, so the results are
the scalar code's to the bit; then the results written out, the backward's summed
into the Gaussians' rows in pair order. The scales' exponentials are taken in the lane
loops (``_lane_scales``: in float32, ``exact_exp``'s, the C library's bits without a
call). A fisheye camera's pairs run one at a time.
The visibility test runs on the vector units the same way, ``LANES`` Gaussians at a
time: the pinhole bound of each, then the box of those some camera may see, the
opacity's exponential and logarithm taken lane by lane between the loops.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange

from splatscale.render.conventions import (ALPHA_MIN, EPS2D, FAR_PLANE, FISHEYE_EPS,
                                           FRUSTUM_CLAMP, NEAR_PLANE, RADIUS_SIGMAS)
from splatscale.render.exact_exp import exp

CHUNK = 256  # pairs (or Gaussians) per parallel task
LANES = 64  # pairs whose arithmetic runs at once (``_lane_projections``, ``_lane_gradients``)
LANE_INPUTS = 17  # a lane's values (``_fill_lane``)
GEOMETRY_INPUTS = 10  # the first of them: a Gaussian's (``_fill_geometry``)
PROJECTED = 7  # a lane's projection: means2d 2, conic 3, depth, compensation
SLACK_PIXELS = 1.0  # the exact box is rounded up to whole pixels, and floats round


@numba.njit(inline="always")
def _rotation(quats, g):  # pragma: no cover - compiled
    """Normalised quaternion (w, x, y, z) of Gaussian g, its norm, and R as 9 values,
    row-major."""
    return _rotation_of(quats[g, 0], quats[g, 1], quats[g, 2], quats[g, 3])


@numba.njit(inline="always")
def _rotation_of(w, x, y, z):  # pragma: no cover - compiled
    """``_rotation`` of the quaternion (w, x, y, z)."""
    norm = max(math.sqrt(w * w + x * x + y * y + z * z), 1e-12)
    w, x, y, z = w / norm, x / norm, y / norm, z / norm
    rot = (1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
           2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
           2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y))
    return w, x, y, z, norm, rot


@numba.njit(inline="always")
def camera_point(means, g, viewmats, c):  # pragma: no cover - compiled
    return _camera_point_of(means[g, 0], means[g, 1], means[g, 2], viewmats, c)


@numba.njit(inline="always")
def _camera_point_of(m0, m1, m2, viewmats, c):  # pragma: no cover - compiled
    x = viewmats[c, 0, 0] * m0 + viewmats[c, 0, 1] * m1 + viewmats[c, 0, 2] * m2 + viewmats[c, 0, 3]
    y = viewmats[c, 1, 0] * m0 + viewmats[c, 1, 1] * m1 + viewmats[c, 1, 2] * m2 + viewmats[c, 1, 3]
    z = viewmats[c, 2, 0] * m0 + viewmats[c, 2, 1] * m1 + viewmats[c, 2, 2] * m2 + viewmats[c, 2, 3]
    return x, y, z


@numba.njit(inline="always")
def _frustum_limits(focal, centre, size):  # pragma: no cover - compiled
    """(lim_pos, lim_neg) along one axis: 1.3 times the frustum (gsplat's)."""
    margin = (FRUSTUM_CLAMP - 1.0) * 0.5 * size / focal
    return (size - centre) / focal + margin, centre / focal + margin


@numba.njit(inline="always")
def frustum_limits(Ks, sizes):  # pragma: no cover - compiled
    """[C, 4] float64: each camera's ``_frustum_limits`` in x, then in y. Once per camera,
    not per pair: they are eight of a pair's divisions, which the kernels wait on."""
    limits = np.empty((Ks.shape[0], 4))
    for c in range(Ks.shape[0]):
        limits[c, 0], limits[c, 1] = _frustum_limits(Ks[c, 0, 0], Ks[c, 0, 2], sizes[c, 0])
        limits[c, 2], limits[c, 3] = _frustum_limits(Ks[c, 1, 1], Ks[c, 1, 2], sizes[c, 1])
    return limits


@numba.njit(inline="always")
def _clamped(offset, z, high, low):  # pragma: no cover - compiled
    """(t, whether the clamp held it): t = z clamp(offset / z, -low, high)."""
    ratio = offset / z
    if ratio > high:
        return z * high, True
    if ratio < -low:
        return z * -low, True
    return z * ratio, False


@numba.njit(inline="always")
def _jw_rows(viewmats, Ks, limits, c, x, y, z):  # pragma: no cover - compiled
    """J W's rows, t (x and y, clamped) and whether each clamp held; ``limits``:
    ``frustum_limits``."""
    fx, fy = Ks[c, 0, 0], Ks[c, 1, 1]
    tx, held_x = _clamped(x, z, limits[c, 0], limits[c, 1])
    ty, held_y = _clamped(y, z, limits[c, 2], limits[c, 3])
    u0, w0, u1, w1 = fx / z, fx * tx / (z * z), fy / z, fy * ty / (z * z)
    jw = (u0 * viewmats[c, 0, 0] - w0 * viewmats[c, 2, 0],
          u0 * viewmats[c, 0, 1] - w0 * viewmats[c, 2, 1],
          u0 * viewmats[c, 0, 2] - w0 * viewmats[c, 2, 2],
          u1 * viewmats[c, 1, 0] - w1 * viewmats[c, 2, 0],
          u1 * viewmats[c, 1, 1] - w1 * viewmats[c, 2, 1],
          u1 * viewmats[c, 1, 2] - w1 * viewmats[c, 2, 2])
    return jw, tx, ty, held_x, held_y


@numba.njit(inline="always")
def _scales(log_scales, g):  # pragma: no cover - compiled
    return exp(log_scales[g, 0]), exp(log_scales[g, 1]), exp(log_scales[g, 2])


@numba.njit(inline="always")
def _cov2d(jw, rot, scale):  # pragma: no cover - compiled
    """b = (J W) M row by row (b[3 r + k]), cov2d = (a, bb, cc) with eps2d, and the
    determinant before eps2d (an anti-aliased splat's compensation needs it)."""
    b = ((jw[0] * rot[0] + jw[1] * rot[3] + jw[2] * rot[6]) * scale[0],
         (jw[0] * rot[1] + jw[1] * rot[4] + jw[2] * rot[7]) * scale[1],
         (jw[0] * rot[2] + jw[1] * rot[5] + jw[2] * rot[8]) * scale[2],
         (jw[3] * rot[0] + jw[4] * rot[3] + jw[5] * rot[6]) * scale[0],
         (jw[3] * rot[1] + jw[4] * rot[4] + jw[5] * rot[7]) * scale[1],
         (jw[3] * rot[2] + jw[4] * rot[5] + jw[5] * rot[8]) * scale[2])
    a0 = b[0] * b[0] + b[1] * b[1] + b[2] * b[2]
    bb = b[0] * b[3] + b[1] * b[4] + b[2] * b[5]
    cc0 = b[3] * b[3] + b[4] * b[4] + b[5] * b[5]
    return b, a0 + EPS2D, bb, cc0 + EPS2D, a0 * cc0 - bb * bb


@numba.njit(inline="always")
def _compensation(undilated_det, det):  # pragma: no cover - compiled
    """An anti-aliased splat's opacity factor (gsplat's ``add_blur``)."""
    return math.sqrt(max(0.0, undilated_det / det))


@numba.njit(inline="always")
def _fisheye_jacobian(Ks, c, x, y, z):  # pragma: no cover - compiled
    """means2d and J (row-major, 6 values) of the equidistant projection of (x, y, z),
    as gsplat's ``fisheye_proj``."""
    fx, fy = Ks[c, 0, 0], Ks[c, 1, 1]
    xy_len = math.sqrt(x * x + y * y) + FISHEYE_EPS
    theta = math.atan2(xy_len, z + FISHEYE_EPS)
    mx = x * fx * theta / xy_len + Ks[c, 0, 2]
    my = y * fy * theta / xy_len + Ks[c, 1, 2]
    x2, y2, xy = x * x + FISHEYE_EPS, y * y, x * y
    x2y2 = x2 + y2
    x2y2z2_inv = 1.0 / (x2y2 + z * z)
    b = math.atan2(xy_len, z) / xy_len / x2y2
    a = z * x2y2z2_inv / x2y2
    jacobian = (fx * (x2 * a + y2 * b), fx * xy * (a - b), -fx * x * x2y2z2_inv,
                fy * xy * (a - b), fy * (y2 * a + x2 * b), -fy * y * x2y2z2_inv)
    return mx, my, jacobian


@numba.njit(inline="always")
def _fisheye_jw_rows(viewmats, Ks, c, x, y, z):  # pragma: no cover - compiled
    """means2d, J W (row-major, 6 values) and J of a fisheye camera."""
    mx, my, j = _fisheye_jacobian(Ks, c, x, y, z)
    jw = (j[0] * viewmats[c, 0, 0] + j[1] * viewmats[c, 1, 0] + j[2] * viewmats[c, 2, 0],
          j[0] * viewmats[c, 0, 1] + j[1] * viewmats[c, 1, 1] + j[2] * viewmats[c, 2, 1],
          j[0] * viewmats[c, 0, 2] + j[1] * viewmats[c, 1, 2] + j[2] * viewmats[c, 2, 2],
          j[3] * viewmats[c, 0, 0] + j[4] * viewmats[c, 1, 0] + j[5] * viewmats[c, 2, 0],
          j[3] * viewmats[c, 0, 1] + j[4] * viewmats[c, 1, 1] + j[5] * viewmats[c, 2, 1],
          j[3] * viewmats[c, 0, 2] + j[4] * viewmats[c, 1, 2] + j[5] * viewmats[c, 2, 2])
    return mx, my, jw, j


@numba.njit(inline="always")
def _write_pair(i, jw, rot, scale, antialiased, conics,
                compensations):  # pragma: no cover - compiled
    """Pair i's conic and (``antialiased``) compensation, from its J W."""
    conics[i, 0], conics[i, 1], conics[i, 2], compensation = _conic(jw, rot, scale,
                                                                    antialiased)
    if antialiased:
        compensations[i] = compensation


@numba.njit(inline="always")
def _conic(jw, rot, scale, antialiased):  # pragma: no cover - compiled
    """A pair's conic (3 values) and, where ``antialiased`` (else 0), compensation,
    from its J W."""
    _, a, bb, cc, undilated_det = _cov2d(jw, rot, scale)
    det = a * cc - bb * bb
    return cc / det, -bb / det, a / det, _compensation(undilated_det, det) if antialiased else 0.0


@numba.njit(nogil=True, cache=True, error_model="numpy")  # (``_backward_pairs`` says why)
def _forward_pairs(lo, hi, means, quats, log_scales, gaussian_ids, camera_ids, viewmats, Ks,
                   limits, fisheye, antialiased, means2d, conics, depths,
                   compensations):  # pragma: no cover - compiled
    """Pairs [lo, hi): means2d, conic, depth and (``antialiased``) compensation; a
    pinhole camera's in lanes (``_lane_projections``), a fisheye camera's one by one."""
    lanes = np.empty((LANE_INPUTS, LANES), means.dtype)
    projected = np.empty((PROJECTED, LANES))
    start = lo
    while start < hi:
        c = camera_ids[start]
        end = start + 1
        while end < hi and camera_ids[end] == c:  # the pairs are camera-major
            end += 1
        if fisheye is not None and fisheye[c]:
            for i in range(start, end):
                _fisheye_pair(i, gaussian_ids[i], c, means, quats, log_scales, viewmats, Ks,
                              antialiased, means2d, conics, depths, compensations)
        else:
            for first in range(start, end, LANES):
                count = min(LANES, end - first)
                for j in range(count):
                    _fill_geometry(lanes, j, means, quats, log_scales, gaussian_ids[first + j])
                _lane_projections(np.uint64(count), lanes, viewmats, Ks, limits, c,
                                  antialiased, projected)
                _write_lanes(first, count, projected, antialiased, means2d, conics, depths,
                             compensations)
        start = end


@numba.njit(inline="always")
def _write_lanes(first, count, projected, antialiased, means2d, conics, depths,
                 compensations):  # pragma: no cover - compiled
    """Pairs first + j, j below ``count``: their ``_lane_projections``."""
    for j in range(count):
        i = first + j
        means2d[i, 0], means2d[i, 1] = projected[0, j], projected[1, j]
        conics[i, 0], conics[i, 1], conics[i, 2] = projected[2, j], projected[3, j], projected[4, j]
        depths[i] = projected[5, j]
        if antialiased:
            compensations[i] = projected[6, j]


@numba.njit(inline="always")
def _fisheye_pair(i, g, c, means, quats, log_scales, viewmats, Ks, antialiased, means2d,
                  conics, depths, compensations):  # pragma: no cover - compiled
    """Pair i (Gaussian g, fisheye camera c): means2d, conic, depth and compensation."""
    x, y, z = camera_point(means, g, viewmats, c)
    _, _, _, _, _, rot = _rotation(quats, g)
    means2d[i, 0], means2d[i, 1], jw, _ = _fisheye_jw_rows(viewmats, Ks, c, x, y, z)
    _write_pair(i, jw, rot, _scales(log_scales, g), antialiased, conics, compensations)
    depths[i] = z


@numba.njit(inline="always")
def _lane_projections(count, lanes, viewmats, Ks, limits, c, antialiased,
                      projected):  # pragma: no cover - compiled
    """projected[:, j]: means2d, conic, depth and (``antialiased``) compensation of lane
    j's Gaussian (``_fill_geometry``) through pinhole camera c, for j below ``count``
    (``_lane_gradients`` says why the loop is so)."""
    for j in range(np.uint64(0), count):
        x, y, z = _camera_point_of(lanes[0, j], lanes[1, j], lanes[2, j], viewmats, c)
        _, _, _, _, _, rot = _rotation_of(lanes[3, j], lanes[4, j], lanes[5, j], lanes[6, j])
        jw, _, _, _, _ = _jw_rows(viewmats, Ks, limits, c, x, y, z)
        projected[0, j] = Ks[c, 0, 0] * x / z + Ks[c, 0, 2]
        projected[1, j] = Ks[c, 1, 1] * y / z + Ks[c, 1, 2]
        projected[2, j], projected[3, j], projected[4, j], projected[6, j] = _conic(
            jw, rot, _lane_scales(lanes, j), antialiased)
        projected[5, j] = z


@numba.njit(parallel=True, nogil=True, cache=True)
def project_forward(means, quats, log_scales, gaussian_ids, camera_ids, viewmats, Ks, sizes,
                    fisheye, antialiased, means2d, conics, depths,
                    compensations):  # pragma: no cover - compiled
    """``fisheye`` [C] bool: the cameras with the equidistant projection, or None (no
    camera is one); ``compensations`` is written only where ``antialiased`` (else it
    may be empty)."""
    pairs, limits = gaussian_ids.shape[0], frustum_limits(Ks, sizes)
    for chunk in prange((pairs + CHUNK - 1) // CHUNK):
        _forward_pairs(chunk * CHUNK, min(pairs, (chunk + 1) * CHUNK), means, quats, log_scales,
                       gaussian_ids, camera_ids, viewmats, Ks, limits, fisheye, antialiased,
                       means2d, conics, depths, compensations)


@numba.njit(inline="always")
def _cov2d_gradient(jw, rot, scale, antialiased, v_conic,
                    v_compensation):  # pragma: no cover - compiled
    """From a pair's gradients of its conic (3 values) and compensation (read only where
    ``antialiased``): b, d loss / d b, the gradient of the rows of J W (two 3-tuples)
    and of R (r, 9 values)."""
    b, a, bb, cc, undilated_det = _cov2d(jw, rot, scale)
    inv = 1.0 / (a * cc - bb * bb)
    inv2 = inv * inv
    g0, g1, g2 = v_conic
    # conic = (cc, -bb, a) / det, det = a cc - bb^2
    v_a = -g0 * cc * cc * inv2 + g1 * bb * cc * inv2 + g2 * (inv - a * cc * inv2)
    v_bb = 2 * g0 * bb * cc * inv2 - g1 * (inv + 2 * bb * bb * inv2) + 2 * g2 * a * bb * inv2
    v_cc = g0 * (inv - a * cc * inv2) + g1 * a * bb * inv2 - g2 * a * a * inv2
    if antialiased:
        # d compensation / d cov2d = (1 - comp^2) conic - eps2d I / det, over 2 comp;
        # gsplat's CUDA kernel (add_blur_vjp), which the cuda backend runs, divides by
        # comp + 1e-6 rather than comp (finite for a flat splat), and so do we.
        comp = _compensation(undilated_det, a * cc - bb * bb)
        v_half = v_compensation * 0.5 / (comp + 1e-6)
        shrink = 1.0 - comp * comp
        v_a += v_half * (shrink * cc * inv - EPS2D * inv)
        v_bb -= v_half * shrink * 2.0 * bb * inv
        v_cc += v_half * (shrink * a * inv - EPS2D * inv)
    v_b = (2 * v_a * b[0] + v_bb * b[3], 2 * v_a * b[1] + v_bb * b[4],
           2 * v_a * b[2] + v_bb * b[5], 2 * v_cc * b[3] + v_bb * b[0],
           2 * v_cc * b[4] + v_bb * b[1], 2 * v_cc * b[5] + v_bb * b[2])
    # b[3 r + k] = (jw[r] . R[:, k]) s_k
    e = (v_b[0] * scale[0], v_b[1] * scale[1], v_b[2] * scale[2],
         v_b[3] * scale[0], v_b[4] * scale[1], v_b[5] * scale[2])
    v_jw0 = (e[0] * rot[0] + e[1] * rot[1] + e[2] * rot[2],
             e[0] * rot[3] + e[1] * rot[4] + e[2] * rot[5],
             e[0] * rot[6] + e[1] * rot[7] + e[2] * rot[8])
    v_jw1 = (e[3] * rot[0] + e[4] * rot[1] + e[5] * rot[2],
             e[3] * rot[3] + e[4] * rot[4] + e[5] * rot[5],
             e[3] * rot[6] + e[4] * rot[7] + e[5] * rot[8])
    r = (e[0] * jw[0] + e[3] * jw[3], e[1] * jw[0] + e[4] * jw[3], e[2] * jw[0] + e[5] * jw[3],
         e[0] * jw[1] + e[3] * jw[4], e[1] * jw[1] + e[4] * jw[4], e[2] * jw[1] + e[5] * jw[4],
         e[0] * jw[2] + e[3] * jw[5], e[1] * jw[2] + e[4] * jw[5], e[2] * jw[2] + e[5] * jw[5])
    return b, v_b, v_jw0, v_jw1, r


@numba.njit(inline="always")
def _parameter_gradient(viewmats, c, v_x, v_y, v_z, qw, qx, qy, qz, norm, r, b,
                        v_b):  # pragma: no cover - compiled
    """d loss / d (mean 3, quat 4, log-scale 3) from the camera-space centre's gradient,
    R's (r) and b's."""
    # R of the normalised quaternion (w, x, y, z), then the normalisation
    v_w = 2 * (-qz * r[1] + qy * r[2] + qz * r[3] - qx * r[5] - qy * r[6] + qx * r[7])
    v_qx = 2 * (qy * r[1] + qz * r[2] + qy * r[3] - 2 * qx * r[4] - qw * r[5] + qz * r[6]
                + qw * r[7] - 2 * qx * r[8])
    v_qy = 2 * (-2 * qy * r[0] + qx * r[1] + qw * r[2] + qx * r[3] + qz * r[5] - qw * r[6]
                + qz * r[7] - 2 * qy * r[8])
    v_qz = 2 * (-2 * qz * r[0] - qw * r[1] + qx * r[2] + qw * r[3] - 2 * qz * r[4]
                + qy * r[5] + qx * r[6] + qy * r[7])
    along = qw * v_w + qx * v_qx + qy * v_qy + qz * v_qz
    return (viewmats[c, 0, 0] * v_x + viewmats[c, 1, 0] * v_y + viewmats[c, 2, 0] * v_z,
            viewmats[c, 0, 1] * v_x + viewmats[c, 1, 1] * v_y + viewmats[c, 2, 1] * v_z,
            viewmats[c, 0, 2] * v_x + viewmats[c, 1, 2] * v_y + viewmats[c, 2, 2] * v_z,
            (v_w - qw * along) / norm, (v_qx - qx * along) / norm,
            (v_qy - qy * along) / norm, (v_qz - qz * along) / norm,
            v_b[0] * b[0] + v_b[3] * b[3], v_b[1] * b[1] + v_b[4] * b[4],
            v_b[2] * b[2] + v_b[5] * b[5])


@numba.njit(inline="always")
def _jw_column(v_z, v_tx, v_ty, v_jw0_m, v_jw1_m, viewmats, c, m, fx, fy, tx, ty, z, z2,
               z3):  # pragma: no cover - compiled
    """(v_z, v_tx, v_ty) plus column m of J W's rows' gradient through z and t."""
    w0m, w1m, w2m = viewmats[c, 0, m], viewmats[c, 1, m], viewmats[c, 2, m]
    v_z += v_jw0_m * (-fx / z2 * w0m + 2 * fx * tx / z3 * w2m)
    v_z += v_jw1_m * (-fy / z2 * w1m + 2 * fy * ty / z3 * w2m)
    v_tx += v_jw0_m * (-fx / (z * z)) * w2m
    v_ty += v_jw1_m * (-fy / (z * z)) * w2m
    return v_z, v_tx, v_ty


@numba.njit(inline="always")
def _fisheye_pair_gradient(means, quats, log_scales, g, viewmats, Ks, c, antialiased,
                           v_means2d, v_conics, v_depths, v_compensations,
                           i):  # pragma: no cover - compiled
    """``_lane_gradients``' gradient, of a fisheye camera's pair i (Gaussian g), one pair
    at a time: the camera-space centre's gradient as gsplat's CUDA kernel computes it
    (``fisheye_proj_vjp``): through J for means2d, and through J's derivative, as that
    kernel writes it, for the covariance."""
    fx, fy = Ks[c, 0, 0], Ks[c, 1, 1]
    x, y, z = camera_point(means, g, viewmats, c)
    _, _, jw, j = _fisheye_jw_rows(viewmats, Ks, c, x, y, z)
    qw, qx, qy, qz, norm, rot = _rotation(quats, g)
    b, v_b, v_jw0, v_jw1, r = _cov2d_gradient(
        jw, rot, _scales(log_scales, g), antialiased, (v_conics[i, 0], v_conics[i, 1],
                                                       v_conics[i, 2]),
        v_compensations[i] if antialiased else 0.0)
    # J W's rows' gradient to J's: v_J[r][k] = sum_m v_jw_r[m] W[k][m]
    v_j = (v_jw0[0] * viewmats[c, 0, 0] + v_jw0[1] * viewmats[c, 0, 1]
           + v_jw0[2] * viewmats[c, 0, 2],
           v_jw0[0] * viewmats[c, 1, 0] + v_jw0[1] * viewmats[c, 1, 1]
           + v_jw0[2] * viewmats[c, 1, 2],
           v_jw0[0] * viewmats[c, 2, 0] + v_jw0[1] * viewmats[c, 2, 1]
           + v_jw0[2] * viewmats[c, 2, 2],
           v_jw1[0] * viewmats[c, 0, 0] + v_jw1[1] * viewmats[c, 0, 1]
           + v_jw1[2] * viewmats[c, 0, 2],
           v_jw1[0] * viewmats[c, 1, 0] + v_jw1[1] * viewmats[c, 1, 1]
           + v_jw1[2] * viewmats[c, 1, 2],
           v_jw1[0] * viewmats[c, 2, 0] + v_jw1[1] * viewmats[c, 2, 1]
           + v_jw1[2] * viewmats[c, 2, 2])
    v_mx, v_my = v_means2d[i, 0], v_means2d[i, 1]
    v_x = j[0] * v_mx + j[3] * v_my
    v_y = j[1] * v_mx + j[4] * v_my
    v_z = j[2] * v_mx + j[5] * v_my + v_depths[i]
    # d J / d (x, y, z), gsplat's closed forms
    x2, y2, xy = x * x + FISHEYE_EPS, y * y, x * y
    x2y2 = x2 + y2
    len_xy = math.sqrt(x * x + y * y) + FISHEYE_EPS
    x2y2z2 = x2y2 + z * z
    x2y2z2_inv = 1.0 / x2y2z2
    theta = math.atan2(len_xy, z)
    l4 = x2y2z2 * x2y2z2
    e_ = -l4 * x2y2 * theta + x2y2z2 * x2y2 * len_xy * z
    f_ = 3 * l4 * theta - 3 * x2y2z2 * len_xy * z - 2 * x2y2 * len_xy * z
    a_ = x * (3 * e_ + x2 * f_)
    b_ = y * (e_ + x2 * f_)
    c_ = x * (e_ + y2 * f_)
    d_ = y * (3 * e_ + y2 * f_)
    s1, s2 = x2 - y2 - z * z, y2 - x2 - z * z
    inv1 = x2y2z2_inv * x2y2z2_inv
    inv2 = inv1 / (x2y2 * x2y2 * len_xy)
    v_x += (fx * a_ * inv2 * v_j[0] + fx * b_ * inv2 * v_j[1] + fx * s1 * inv1 * v_j[2]
            + fy * b_ * inv2 * v_j[3] + fy * c_ * inv2 * v_j[4] + 2 * fy * xy * inv1 * v_j[5])
    v_y += (fx * b_ * inv2 * v_j[0] + fx * c_ * inv2 * v_j[1] + 2 * fx * xy * inv1 * v_j[2]
            + fy * c_ * inv2 * v_j[3] + fy * d_ * inv2 * v_j[4] + fy * s2 * inv1 * v_j[5])
    v_z += (fx * s1 * inv1 * v_j[0] + 2 * fx * xy * inv1 * v_j[1] + 2 * fx * x * z * inv1 * v_j[2]
            + 2 * fy * xy * inv1 * v_j[3] + fy * s2 * inv1 * v_j[4]
            + 2 * fy * y * z * inv1 * v_j[5])
    return _parameter_gradient(viewmats, c, v_x, v_y, v_z, qw, qx, qy, qz, norm, r, b, v_b)


@numba.njit(inline="always")
def pair_chunks(lo, hi, c):  # pragma: no cover - compiled
    """How many chunks of ``CHUNK`` pairs camera c's pairs [lo, hi) make: at least one
    for camera 0, whose chunks zero every row (``chunk_of``)."""
    return max((hi - lo + CHUNK - 1) // CHUNK, 1 if c == 0 else 0)


@numba.njit(inline="always")
def chunk_of(chunk, lo, hi, gaussian_ids, count):  # pragma: no cover - compiled
    """Chunk ``chunk`` of a camera's pairs [lo, hi): its pairs [first, end), and, of
    camera 0 (lo 0), the rows of a gradient of ``count`` Gaussians it writes, from its
    first pair's Gaussian (0 for the first chunk) to the next chunk's (``count`` for
    the last). Pre: camera 0's Gaussians ascending; its chunks then share out every
    row. Rows camera 0 does not see fall to the chunk before them: where it sees one
    corner of a model in space's order, one chunk zeroes the rest alone."""
    first, end = lo + chunk * CHUNK, min(hi, lo + (chunk + 1) * CHUNK)
    rows_lo = 0 if first == 0 else gaussian_ids[first]
    rows_hi = count if end == hi else gaussian_ids[end]
    return first, end, rows_lo, rows_hi


@numba.njit(inline="always")
def _zero_rows(lo, hi, v_means, v_quats, v_log_scales):  # pragma: no cover - compiled
    """Rows [lo, hi) of the gradients ``project_backward`` writes set to zero."""
    for g in range(lo, hi):
        for k in range(3):
            v_means[g, k] = 0.0
            v_log_scales[g, k] = 0.0
        for k in range(4):
            v_quats[g, k] = 0.0


@numba.njit(inline="always")
def _add_gradient(g, grad, v_means, v_quats, v_log_scales):  # pragma: no cover - compiled
    v_means[g, 0] += grad[0]
    v_means[g, 1] += grad[1]
    v_means[g, 2] += grad[2]
    v_quats[g, 0] += grad[3]
    v_quats[g, 1] += grad[4]
    v_quats[g, 2] += grad[5]
    v_quats[g, 3] += grad[6]
    v_log_scales[g, 0] += grad[7]
    v_log_scales[g, 1] += grad[8]
    v_log_scales[g, 2] += grad[9]


# numpy's error model: a division by zero gives inf rather than raising, so that no branch
# to raise keeps the lane loop off the vector units. A visible pair divides by nothing
# zero (z is beyond the near plane, the determinant positive, the norm at least 1e-12).
@numba.njit(nogil=True, cache=True, error_model="numpy")
def _backward_pairs(lo, hi, c, rows_lo, rows_hi, means, quats, log_scales, gaussian_ids,
                    viewmats, Ks, limits, fisheye, antialiased, v_means2d, v_conics, v_depths,
                    v_compensations, v_means, v_quats,
                    v_log_scales):  # pragma: no cover - compiled
    """Pairs [lo, hi), all of camera c: each one's gradient added to its Gaussian's rows;
    of camera 0, the rows [rows_lo, rows_hi) zeroed first (its share of them, not a
    pass over every row)."""
    if c == 0:
        _zero_rows(rows_lo, rows_hi, v_means, v_quats, v_log_scales)
    if fisheye is not None and fisheye[c]:
        for i in range(lo, hi):
            g = gaussian_ids[i]
            _add_gradient(g, _fisheye_pair_gradient(
                means, quats, log_scales, g, viewmats, Ks, c, antialiased, v_means2d, v_conics,
                v_depths, v_compensations, i), v_means, v_quats, v_log_scales)
        return
    lanes = np.empty((LANE_INPUTS, LANES), means.dtype)
    grads = np.empty((10, LANES))
    for start in range(lo, hi, LANES):
        count = min(LANES, hi - start)
        for j in range(count):
            _fill_lane(lanes, j, means, quats, log_scales, gaussian_ids[start + j], antialiased,
                       v_means2d, v_conics, v_depths, v_compensations, start + j)
        _lane_gradients(np.uint64(count), lanes, viewmats, Ks, limits, c, antialiased, grads)
        for j in range(count):
            _add_gradient(gaussian_ids[start + j], (
                grads[0, j], grads[1, j], grads[2, j], grads[3, j], grads[4, j], grads[5, j],
                grads[6, j], grads[7, j], grads[8, j], grads[9, j]), v_means, v_quats, v_log_scales)


@numba.njit(inline="always")
def _fill_geometry(lanes, j, means, quats, log_scales, g):  # pragma: no cover - compiled
    """lanes[:GEOMETRY_INPUTS, j]: Gaussian g's mean, quaternion and log-scales (their
    exponentials are ``_lane_scales``', taken in the lane loops)."""
    lanes[0, j], lanes[1, j], lanes[2, j] = means[g, 0], means[g, 1], means[g, 2]
    lanes[3, j], lanes[4, j], lanes[5, j] = quats[g, 0], quats[g, 1], quats[g, 2]
    lanes[6, j] = quats[g, 3]
    lanes[7, j], lanes[8, j], lanes[9, j] = log_scales[g, 0], log_scales[g, 1], log_scales[g, 2]


@numba.njit(inline="always")
def _lane_scales(lanes, j):  # pragma: no cover - compiled
    """Lane j's scales (``_scales``), from the log-scales ``_fill_geometry`` put there: in
    float32 on the vector units (``exact_exp``); in float64 (the tests' type) a call
    of ``math.exp`` a lane."""
    return exp(lanes[7, j]), exp(lanes[8, j]), exp(lanes[9, j])


@numba.njit(inline="always")
def _fill_lane(lanes, j, means, quats, log_scales, g, antialiased, v_means2d, v_conics, v_depths,
               v_compensations, i):  # pragma: no cover - compiled
    """lanes[:, j]: what ``_lane_gradients`` reads of pair i (Gaussian g): its Gaussian's
    ``_fill_geometry`` and its gradients of means2d, conic, depth and compensation."""
    _fill_geometry(lanes, j, means, quats, log_scales, g)
    lanes[10, j], lanes[11, j] = v_means2d[i, 0], v_means2d[i, 1]
    lanes[12, j], lanes[13, j], lanes[14, j] = v_conics[i, 0], v_conics[i, 1], v_conics[i, 2]
    lanes[15, j] = v_depths[i]
    lanes[16, j] = v_compensations[i] if antialiased else 0.0


@numba.njit(inline="always")
def _lane_gradients(count, lanes, viewmats, Ks, limits, c, antialiased,
                    grads):  # pragma: no cover - compiled
    """grads[:, j]: d loss / d (mean 3, quat 4, log-scale 3) of lane j's pair
    (``_fill_lane``) of pinhole camera c, for j below ``count``. One value a lane in each
    array, read with unsigned indices, and the arithmetic in the loop itself (LLVM kept
    it scalar when the loop called it as a function of its own): the loop runs on the
    vector units, each lane doing the operations a scalar loop would."""
    fx, fy = Ks[c, 0, 0], Ks[c, 1, 1]
    for j in range(np.uint64(0), count):
        x, y, z = _camera_point_of(lanes[0, j], lanes[1, j], lanes[2, j], viewmats, c)
        jw, tx, ty, held_x, held_y = _jw_rows(viewmats, Ks, limits, c, x, y, z)
        qw, qx, qy, qz, norm, rot = _rotation_of(lanes[3, j], lanes[4, j], lanes[5, j],
                                                 lanes[6, j])
        b, v_b, v_jw0, v_jw1, r = _cov2d_gradient(
            jw, rot, _lane_scales(lanes, j), antialiased,
            (lanes[12, j], lanes[13, j], lanes[14, j]), lanes[16, j])
        # jw[0] = (fx / z) W_0 - (fx tx / z^2) W_2;  jw[1] likewise with fy, ty, W_1
        v_mx, v_my = lanes[10, j], lanes[11, j]
        v_x = v_mx * fx / z
        v_y = v_my * fy / z
        v_z = lanes[15, j] - v_mx * fx * x / (z * z) - v_my * fy * y / (z * z)
        v_tx, v_ty = 0.0, 0.0
        z2, z3 = z * z, z * z * z
        # Column by column, each written out: a tuple indexed in a loop is copied to memory.
        v_z, v_tx, v_ty = _jw_column(v_z, v_tx, v_ty, v_jw0[0], v_jw1[0], viewmats, c, 0, fx,
                                     fy, tx, ty, z, z2, z3)
        v_z, v_tx, v_ty = _jw_column(v_z, v_tx, v_ty, v_jw0[1], v_jw1[1], viewmats, c, 1, fx,
                                     fy, tx, ty, z, z2, z3)
        v_z, v_tx, v_ty = _jw_column(v_z, v_tx, v_ty, v_jw0[2], v_jw1[2], viewmats, c, 2, fx,
                                     fy, tx, ty, z, z2, z3)
        # t = z clamp(offset / z): the offset's when free, z's (t / z) when held
        if held_x:
            v_z += v_tx * tx / z
        else:
            v_x += v_tx
        if held_y:
            v_z += v_ty * ty / z
        else:
            v_y += v_ty
        grad = _parameter_gradient(viewmats, c, v_x, v_y, v_z, qw, qx, qy, qz, norm, r, b, v_b)
        grads[0, j], grads[1, j], grads[2, j], grads[3, j], grads[4, j] = grad[:5]
        grads[5, j], grads[6, j], grads[7, j], grads[8, j], grads[9, j] = grad[5:]


@numba.njit(parallel=True, nogil=True, cache=True)
def project_backward(means, quats, log_scales, gaussian_ids, camera_offsets, viewmats, Ks,
                     sizes, fisheye, antialiased, v_means2d, v_conics, v_depths,
                     v_compensations, v_means, v_quats,
                     v_log_scales):  # pragma: no cover - compiled
    """v_means[g], v_quats[g], v_log_scales[g] (their values unset before): the sum of
    the gradients of each pair of Gaussian g, zero where it has none (three arrays, not
    views of one: a gradient must be contiguous, or autograd copies it);
    ``v_compensations`` is read only where ``antialiased``. Pairs camera by camera,
    Gaussians ascending within a camera (``visible_pairs``' order), so a camera's pairs
    run in parallel and each Gaussian's sum follows the camera order whatever the number
    of threads; camera 0's chunks zero the rows up to the next chunk's first Gaussian
    (``chunk_of``)."""
    limits = frustum_limits(Ks, sizes)
    for c in range(camera_offsets.shape[0] - 1):
        lo, hi = camera_offsets[c], camera_offsets[c + 1]
        tasks = pair_chunks(lo, hi, c)
        for chunk in prange(tasks):
            first, end, rows_lo, rows_hi = chunk_of(chunk, lo, hi, gaussian_ids,
                                                    v_means.shape[0])
            _backward_pairs(first, end, c, rows_lo, rows_hi, means, quats, log_scales,
                            gaussian_ids, viewmats, Ks, limits, fisheye, antialiased, v_means2d,
                            v_conics, v_depths, v_compensations, v_means, v_quats, v_log_scales)


@numba.njit(inline="always")
def pinhole_axis_may_see(offset, z, reach, near, largest, focal, centre, size,
                         limits):  # pragma: no cover - compiled
    """Whether the box of a splat whose camera-space centre lies within ``reach`` of
    (``offset``, ``z``) along one axis, nearer than ``near`` (beyond the near plane),
    with no scale above ``largest``, may meet the image along that axis: a bound of
    ``_lane_radii``' test (render/drift.py says why it holds). ``limits``: the axis's
    ``_frustum_limits``."""
    low = high = (offset - reach) / (z - reach)
    for a in (-1.0, 1.0):
        for b in (-1.0, 1.0):
            ratio = (offset + a * reach) / (z + b * reach)
            low, high = min(low, ratio), max(high, ratio)
    return _ratios_may_see(low, high, near, largest, focal, centre, size, limits)


@numba.njit(inline="always")
def _ratios_may_see(low, high, near, largest, focal, centre, size,
                    limits):  # pragma: no cover - compiled
    """``pinhole_axis_may_see`` of a centre whose offset / z lies in [low, high]."""
    limit = max(limits[0], limits[1])
    extent = RADIUS_SIGMAS * math.sqrt((focal / near) ** 2 * (1 + limit ** 2) * largest ** 2
                                       + EPS2D) + SLACK_PIXELS
    return focal * high + centre + extent > 0 and focal * low + centre - extent < size


@numba.njit(inline="always")
def _point_axis_may_see(offset, z, largest, focal, centre, size,
                        limits):  # pragma: no cover - compiled
    """``pinhole_axis_may_see`` of a Gaussian where it is (``reach`` 0, ``near`` z), in
    one division, not five: the same answer (the same division, in float64 as there)."""
    ratio = np.float64(offset) / np.float64(z)
    return _ratios_may_see(ratio, ratio, z, largest, focal, centre, size, limits)


# ``shape``'s rows: a described Gaussian's opacity and sigmas, then per camera its
# covariance's diagonal, determinant, anti-aliased opacity, extent, means2d, radii and test.
OPACITY, SIGMAS, A, CC, DET, SEEN, EXTENT, MX, MY, RX, RY, IN_IMAGE = range(12)
SHAPE = 12


@numba.njit(nogil=True, cache=True, error_model="numpy")  # (``_backward_pairs`` says why)
def _visibility_of(lo, hi, means, quats, log_scales, opacity_logits, viewmats, Ks, sizes,
                   limits, fisheye, antialiased, radii, visible):  # pragma: no cover - compiled
    """Gaussians [lo, hi)'s columns of ``visibility``, ``LANES`` at a time: each one's
    bound in every camera (``_bounds``), then the box of those some camera may see,
    their shape and opacity described once (``_describe``), their boxes on the vector
    units (``_boxes``; a fisheye camera's projection one by one). An anti-aliased
    splat is drawn with opacity times its compensation: its box and the opacity cull
    take that. A fisheye camera's pairs have the near plane, box and image test of a
    pinhole's (as gsplat's kernel), around the equidistant projection."""
    points = np.empty((3, LANES), means.dtype)
    largest = np.empty(LANES)
    sees = np.empty((viewmats.shape[0], LANES), np.bool_)
    lanes = np.empty((GEOMETRY_INPUTS, LANES), means.dtype)
    shape = np.empty((SHAPE, LANES))
    described = np.empty(LANES, np.int64)
    for first in range(lo, hi, LANES):
        count = min(LANES, hi - first)
        _bounds(first, count, means, log_scales, viewmats, Ks, sizes, limits, fisheye, points,
                largest, sees, radii, visible)
        n = _describe(first, count, sees, means, quats, log_scales, opacity_logits, lanes,
                      shape, described)
        for c in range(viewmats.shape[0]):
            if fisheye is not None and fisheye[c]:
                for k in range(n):  # the equidistant projection's arctangent: a call
                    _fisheye_shape(k, lanes, shape, viewmats, Ks, c, antialiased)
            else:
                _lane_shapes(np.uint64(n), lanes, shape, viewmats, Ks, limits, c, antialiased)
            _boxes(first, n, c, sees, described, shape, sizes, antialiased, radii, visible)


@numba.njit(inline="always")
def _bounds(first, count, means, log_scales, viewmats, Ks, sizes, limits, fisheye, points,
            largest, sees, radii, visible):  # pragma: no cover - compiled
    """Gaussians first + j, j below ``count``: ``_lane_bounds`` in every camera, after
    their means and largest scales are gathered (the exponential a call: one at a time);
    their radii and tests cleared."""
    for j in range(count):
        g = first + j
        points[0, j], points[1, j], points[2, j] = means[g, 0], means[g, 1], means[g, 2]
        largest[j] = math.exp(max(np.float64(log_scales[g, 0]), np.float64(log_scales[g, 1]),
                                  np.float64(log_scales[g, 2])))
    for c in range(viewmats.shape[0]):
        for j in range(count):
            radii[c, first + j, 0], radii[c, first + j, 1] = 0, 0
            visible[c, first + j] = False
        _lane_bounds(np.uint64(count), points, largest, viewmats, Ks, sizes, limits, c,
                     fisheye is not None and fisheye[c], sees)


@numba.njit(inline="always")
def _boxes(first, n, c, sees, described, shape, sizes, antialiased, radii,
           visible):  # pragma: no cover - compiled
    """The radii and test in camera c of the ``n`` described lanes it may see, from their
    shapes in it (``_shape_in_camera``)."""
    if antialiased:
        for k in range(n):  # a logarithm each: a call, one lane at a time
            shape[EXTENT, k] = _antialiased_extent(shape[SEEN, k], shape[DET, k],
                                                   shape[SIGMAS, k])
    _lane_radii(np.uint64(n), shape, sizes, c, antialiased)
    for k in range(n):
        g = first + described[k]
        if sees[c, described[k]] and shape[IN_IMAGE, k] != 0:
            radii[c, g, 0], radii[c, g, 1] = int(shape[RX, k]), int(shape[RY, k])
            visible[c, g] = True


@numba.njit(inline="always")
def _lane_bounds(count, points, largest, viewmats, Ks, sizes, limits, c, fisheye,
                 sees):  # pragma: no cover - compiled
    """sees[c, j]: whether lane j's Gaussian, beyond the near plane and before the far
    one, may be seen by camera c: by the pinhole bound of ``pinhole_axis_may_see`` (a
    fisheye camera: any). On the vector units (``_lane_gradients`` says how)."""
    fx, cx, width = Ks[c, 0, 0], Ks[c, 0, 2], sizes[c, 0]
    fy, cy, height = Ks[c, 1, 1], Ks[c, 1, 2], sizes[c, 1]
    x_limits, y_limits = (limits[c, 0], limits[c, 1]), (limits[c, 2], limits[c, 3])
    for j in range(np.uint64(0), count):
        x, y, z = _camera_point_of(points[0, j], points[1, j], points[2, j], viewmats, c)
        in_depth = (NEAR_PLANE < z) & (z < FAR_PLANE)
        bound = (_point_axis_may_see(x, z, largest[j], fx, cx, width, x_limits)
                 & _point_axis_may_see(y, z, largest[j], fy, cy, height, y_limits))
        sees[c, j] = in_depth & (bound | fisheye)


@numba.njit(inline="always")
def _describe(first, count, sees, means, quats, log_scales, opacity_logits, lanes, shape,
              described):  # pragma: no cover - compiled
    """Of lanes j below ``count``, those some camera may see (``sees``), packed: their
    Gaussian's geometry (``_fill_geometry``), opacity and sigmas (exponentials and
    logarithms: calls, one lane at a time) in lane k, and j in ``described[k]``; returns
    how many."""
    n = 0
    for j in range(count):
        seen = False
        for c in range(sees.shape[0]):
            seen |= sees[c, j]
        if not seen:
            continue
        g = first + j
        _fill_geometry(lanes, n, means, quats, log_scales, g)
        opacity = 1.0 / (1.0 + exp(-opacity_logits[g]))
        shape[OPACITY, n] = opacity
        shape[SIGMAS, n] = min(RADIUS_SIGMAS,
                               math.sqrt(2 * math.log(max(opacity, ALPHA_MIN) / ALPHA_MIN)))
        described[n] = j
        n += 1
    return n


@numba.njit(inline="always")
def _shape_in_camera(k, shape, jw, rot, scale, mx, my, antialiased):  # pragma: no cover - compiled
    """shape[:, k] of described lane k in a camera, from its J W and means2d: its
    covariance's a, cc and determinant, its opacity times its compensation
    (``antialiased``; else its opacity), its unclamped extent (sigmas) and its means2d."""
    _, a, bb, cc, undilated_det = _cov2d(jw, rot, scale)
    det = a * cc - bb * bb
    shape[A, k], shape[CC, k], shape[DET, k] = a, cc, det
    opacity = shape[OPACITY, k]
    shape[SEEN, k] = opacity * _compensation(undilated_det, det) if antialiased else opacity
    shape[EXTENT, k] = shape[SIGMAS, k]
    shape[MX, k], shape[MY, k] = mx, my


@numba.njit(inline="always")
def _lane_shapes(count, lanes, shape, viewmats, Ks, limits, c,
                 antialiased):  # pragma: no cover - compiled
    """``_shape_in_camera`` of described lanes below ``count`` in pinhole camera c, on the
    vector units."""
    for k in range(np.uint64(0), count):
        x, y, z = _camera_point_of(lanes[0, k], lanes[1, k], lanes[2, k], viewmats, c)
        _, _, _, _, _, rot = _rotation_of(lanes[3, k], lanes[4, k], lanes[5, k], lanes[6, k])
        jw, _, _, _, _ = _jw_rows(viewmats, Ks, limits, c, x, y, z)
        _shape_in_camera(k, shape, jw, rot, _lane_scales(lanes, k),
                         Ks[c, 0, 0] * x / z + Ks[c, 0, 2], Ks[c, 1, 1] * y / z + Ks[c, 1, 2],
                         antialiased)


@numba.njit(inline="always")
def _fisheye_shape(k, lanes, shape, viewmats, Ks, c, antialiased):  # pragma: no cover - compiled
    """``_shape_in_camera`` of described lane k in fisheye camera c."""
    x, y, z = _camera_point_of(lanes[0, k], lanes[1, k], lanes[2, k], viewmats, c)
    _, _, _, _, _, rot = _rotation_of(lanes[3, k], lanes[4, k], lanes[5, k], lanes[6, k])
    mx, my, jw, _ = _fisheye_jw_rows(viewmats, Ks, c, x, y, z)
    _shape_in_camera(k, shape, jw, rot, _lane_scales(lanes, k), mx, my,
                     antialiased)


@numba.njit(inline="always")
def _antialiased_extent(seen, det, sigmas):  # pragma: no cover - compiled
    """An anti-aliased splat's extent in sigmas, from its opacity times compensation
    (``seen``): a splat that faint is drawn no farther than its alpha reaches 1/255.
    Its sigmas where its covariance is not positive definite, or it is culled."""
    if det > 0 and not seen < ALPHA_MIN:
        return min(RADIUS_SIGMAS, math.sqrt(2 * math.log(seen / ALPHA_MIN)))
    return sigmas


@numba.njit(inline="always")
def _lane_radii(count, shape, sizes, c, antialiased):  # pragma: no cover - compiled
    """The box's radii (its extent times the covariance's deviations, rounded up) and the
    test of each described lane below ``count`` in camera c, on the vector units: drawn
    where the covariance is positive definite, the box meets the image, and the splat
    is not culled (its opacity, or with ``antialiased`` its opacity times compensation,
    below ALPHA_MIN)."""
    width, height = sizes[c, 0], sizes[c, 1]
    for k in range(np.uint64(0), count):
        a, cc, det, extent = shape[A, k], shape[CC, k], shape[DET, k], shape[EXTENT, k]
        culled = (shape[OPACITY, k] < ALPHA_MIN) | (
            antialiased & (det > 0) & (shape[SEEN, k] < ALPHA_MIN))
        rx, ry = math.ceil(extent * math.sqrt(a)), math.ceil(extent * math.sqrt(cc))
        mx, my = shape[MX, k], shape[MY, k]
        drawn = ((not culled) & (det > 0) & ((rx > 0) | (ry > 0)) & (mx + rx > 0)
                 & (mx - rx < width) & (my + ry > 0) & (my - ry < height))
        shape[RX, k], shape[RY, k], shape[IN_IMAGE, k] = rx, ry, 1.0 if drawn else 0.0


@numba.njit(parallel=True, nogil=True, cache=True)
def visibility(means, quats, log_scales, opacity_logits, viewmats, Ks, sizes, fisheye,
               antialiased, radii, visible):  # pragma: no cover - compiled
    """``projection._radii_and_visibility`` of every (camera, Gaussian) pair: the box's
    radii [C, N, 2] (0 where invisible) and the test [C, N]; ``fisheye`` [C] bool, or
    None."""
    count, limits = means.shape[0], frustum_limits(Ks, sizes)
    for chunk in prange((count + CHUNK - 1) // CHUNK):
        _visibility_of(chunk * CHUNK, min(count, (chunk + 1) * CHUNK), means, quats, log_scales,
                       opacity_logits, viewmats, Ks, sizes, limits, fisheye, antialiased, radii,
                       visible)


@numba.njit(nogil=True, cache=True)
def visible_pairs(visible):  # pragma: no cover - compiled
    """The (camera, Gaussian) pairs where ``visible`` [C, N] holds, camera-major and
    Gaussians ascending (``torch.nonzero``'s order): camera ids and Gaussian ids [P].
    One thread: a count, then every position written and advanced where it holds
    (no branch)."""
    cameras, count = visible.shape
    total = 0
    for c in range(cameras):
        for g in range(count):
            total += 1 if visible[c, g] else 0
    # One spare place: a pair that does not hold is written past the last that does.
    camera_ids, gaussian_ids = np.empty(total + 1, np.int64), np.empty(total + 1, np.int64)
    at = 0
    for c in range(cameras):
        for g in range(count):
            camera_ids[at], gaussian_ids[at] = c, g
            at += 1 if visible[c, g] else 0
    return camera_ids[:total], gaussian_ids[:total]

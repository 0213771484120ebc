"""Which Gaussians may pass ``project``'s visibility test after drifting: the bound.

A Gaussian's stored means and log-scales may lag its true values by at most a
reach per coordinate (``reach_means``, ``reach_scales``; the offload engine's
``DeferredAdam.reach``). ``candidates`` keeps every Gaussian that could pass the
visibility test for some values within that reach, by a bound in float64 (no
rounding may cut one short): the torch code here, on any device, and its numba
kernel (``candidates_cpu``), which decides Gaussian by Gaussian, camera by
camera, stopping at the first camera that may see it.

Why it is a superset: with the camera-space centre anywhere in a cube of
half-side ``r_means * sqrt(3)`` around the lagging one, and every scale at
most ``s = exp(max log-scale + r_scales)``, the EWA covariance's diagonal is
at most ``(f / z)^2 (1 + L^2) s^2 + eps2d`` (``L`` the frustum clamp's limit
on ``x / z``), the box's half-extent at most ``3.33`` sigmas of it, and the
projected centre lies between the cube's corners' projections.

Anti-aliased models: the exact test draws a splat with opacity times its
compensation ``sqrt(det S / det(S + eps2d I))``, S the 2D covariance before the
dilation, and takes that product for its opacity cull and its box's
``min(3.33, sqrt(2 ln(255 opacity)))`` sigmas. S is positive semi-definite, so
``det(S + eps2d I) = det S + eps2d tr S + eps2d^2 >= det S`` and the
compensation is at most 1: the product is at most the opacity, a pair it keeps
the plain test keeps, with a box no larger (the centre and the covariance being
the same). The bound above takes no opacity, 3.33 sigmas being the most any
opacity gives, so it holds for anti-aliased models unchanged.

Fisheye cameras (equidistant, ``u = c + f theta (cos phi, sin phi)``, no
frustum clamp): the same depth test, the same near-plane rule. A centre ``p``
within ``R = r_means * sqrt(3)`` of the lagging one ``p0`` (``|p0| > R``
when the ball clears the near plane) is seen within ``alpha = asin(R / |p0|)``
of its direction, so ``theta <= theta_max = min(theta0 + alpha, pi / 2)``
(``z > 0``). On the hemisphere the equidistant map stretches lengths radially
by 1 and across by ``theta / sin theta``, at most ``L = theta_max /
sin(theta_max)`` there; the arc between the two directions stays in that cap,
so the projected centres differ by at most ``f L alpha`` along each axis. The
Jacobian is that map's differential times the direction's, ``(I - d d^T) /
|p|``: its rows are at most ``f L / |p|`` long, ``|p| >= |p0| - R``, and the
covariance's diagonal at most ``(f L / (|p0| - R))^2 s^2 + eps2d``. gsplat's eps
(1e-7 in ``|(x, y)|``, ``z`` and ``x^2``) moves J by far less than the
``FISHEYE_MARGIN`` the extent is widened by, beyond the near plane.
"""

from __future__ import annotations

import math
from typing import Sequence

import numba
import numpy as np
import torch
from numba import prange
from torch import Tensor

from splatscale.data.cameras import Camera
from splatscale.render.conventions import EPS2D, FAR_PLANE, FRUSTUM_CLAMP, NEAR_PLANE, RADIUS_SIGMAS
from splatscale.render.projection_kernels import (CHUNK, SLACK_PIXELS, camera_point,
                                                  frustum_limits, pinhole_axis_may_see)
from splatscale.render.splats import camera_tensors, fisheye_cameras

FISHEYE_MARGIN = 1.01  # the fisheye extent's, for gsplat's eps in its Jacobian


def candidates_torch(means: Tensor, log_scales: Tensor, reach_means: Tensor,
                     reach_scales: Tensor, cameras: Sequence[Camera]) -> Tensor:
    """Bool [N]: Gaussians that may be visible in some camera of the batch."""
    dtype = torch.float64
    means, reach = means.to(dtype), reach_means.to(dtype) * math.sqrt(3.0)
    largest = torch.exp(log_scales.to(dtype).amax(dim=1) + reach_scales.to(dtype))
    keep = torch.zeros(len(means), dtype=torch.bool, device=means.device)
    for camera in cameras:
        keep |= _may_be_visible(means, reach, largest, camera)
    return keep


def _may_be_visible(means: Tensor, reach: Tensor, largest: Tensor, camera: Camera) -> Tensor:
    viewmat = camera.viewmat.to(means)
    x, y, z = (means @ viewmat[:3, :3].T + viewmat[:3, 3]).unbind(-1)
    near, far = z - reach, z + reach
    in_depth = (far > NEAR_PLANE) & (near < FAR_PLANE)
    straddles = near <= NEAR_PLANE  # a centre this close may project anywhere
    near = near.clamp_min(NEAR_PLANE)
    K = camera.K.to(means)
    fx, fy, cx, cy = float(K[0, 0]), float(K[1, 1]), float(K[0, 2]), float(K[1, 2])
    if camera.model == "fisheye":
        inside = _fisheye_box_meets_image(x, y, z, reach, largest, camera, K)
        return in_depth & (straddles | inside)
    inside = torch.ones_like(straddles)
    for offset, centre, focal, size in ((x, cx, fx, camera.width), (y, cy, fy, camera.height)):
        margin = (FRUSTUM_CLAMP - 1.0) * 0.5 * size / focal
        limit = max((size - centre) / focal, centre / focal) + margin
        ratios = torch.stack([(offset + a * reach) / (z + b * reach)
                              for a in (-1, 1) for b in (-1, 1)])
        ratios = torch.where(straddles, torch.zeros_like(ratios), ratios)
        low = focal * ratios.amin(0) + centre
        high = focal * ratios.amax(0) + centre
        extent = RADIUS_SIGMAS * torch.sqrt((focal / near) ** 2 * (1 + limit ** 2) * largest ** 2
                                            + EPS2D) + SLACK_PIXELS
        inside &= (high + extent > 0) & (low - extent < size)
    return in_depth & (straddles | inside)


def _fisheye_box_meets_image(x: Tensor, y: Tensor, z: Tensor, reach: Tensor, largest: Tensor,
                             camera: Camera, K: Tensor) -> Tensor:
    """Whether the box of a centre within ``reach`` of (x, y, z) may meet the fisheye
    camera's image (the module's docstring says why), where the ball clears the near
    plane (elsewhere the values are not used)."""
    distance = torch.sqrt(x * x + y * y + z * z)
    alpha = torch.asin((reach / distance).clamp(max=1.0))
    off_axis = torch.sqrt(x * x + y * y)
    theta_max = (torch.atan2(off_axis, z) + alpha).clamp(max=math.pi / 2)
    stretch = torch.where(theta_max > 1e-6, theta_max / torch.sin(theta_max),
                          torch.ones_like(theta_max))
    nearest = (distance - reach).clamp_min(NEAR_PLANE)
    ratio = torch.atan2(off_axis, z) / off_axis.clamp_min(1e-300)
    inside = torch.ones_like(z, dtype=torch.bool)
    for offset, axis, size in ((x, 0, camera.width), (y, 1, camera.height)):
        focal, centre = float(K[axis, axis]), float(K[axis, 2])
        projected = focal * ratio * offset + centre
        drift = focal * stretch * alpha
        extent = FISHEYE_MARGIN * RADIUS_SIGMAS * torch.sqrt(
            (focal * stretch / nearest) ** 2 * largest ** 2 + EPS2D) + SLACK_PIXELS
        inside &= (projected + drift + extent > 0) & (projected - drift - extent < size)
    return inside


def candidates_cpu(means: Tensor, log_scales: Tensor, reach_means: Tensor,
                   reach_scales: Tensor, cameras: Sequence[Camera]) -> Tensor:
    """``candidates_torch`` by the numba kernel (CPU tensors)."""
    keep = torch.empty(len(means), dtype=torch.bool)
    viewmats, Ks, sizes = camera_tensors(cameras, torch.empty(0, dtype=torch.float64))
    arrays = [t.detach().contiguous().numpy() for t in (
        means, log_scales, reach_means.to(torch.float64), reach_scales.to(torch.float64),
        viewmats, Ks, sizes, fisheye_cameras(cameras, means.device))]
    _candidates(*arrays, keep.numpy())
    return keep


@numba.njit(parallel=True, nogil=True, cache=True)
def _candidates(means, log_scales, reach_means, reach_scales, viewmats, Ks, sizes, fisheye,
                keep):  # pragma: no cover - compiled
    count, limits = means.shape[0], frustum_limits(Ks, sizes)
    for chunk in prange((count + CHUNK - 1) // CHUNK):
        _candidates_of(chunk * CHUNK, min(count, (chunk + 1) * CHUNK), means, log_scales,
                       reach_means, reach_scales, viewmats, Ks, sizes, limits, fisheye, keep)


@numba.njit(nogil=True, cache=True)
def _candidates_of(lo, hi, means, log_scales, reach_means, reach_scales, viewmats, Ks, sizes,
                   limits, fisheye, keep):  # pragma: no cover - compiled
    """Gaussians [lo, hi) of ``_candidates``: the torch code's bound, in float64 (its
    sums in another order, so a Gaussian exactly on the bound's edge may be decided
    either way: both ways keep every Gaussian the exact test may keep)."""
    for g in range(lo, hi):
        reach = reach_means[g] * math.sqrt(3.0)
        scale = max(np.float64(log_scales[g, 0]), np.float64(log_scales[g, 1]),
                    np.float64(log_scales[g, 2]))
        largest = math.exp(scale + reach_scales[g])
        keep[g] = False
        for c in range(viewmats.shape[0]):
            x, y, z = camera_point(means, g, viewmats, c)  # in float64, as the viewmats
            if not (z + reach > NEAR_PLANE and z - reach < FAR_PLANE):
                continue
            if z - reach <= NEAR_PLANE:  # a centre this close may project anywhere
                keep[g] = True
                break
            near = z - reach
            if fisheye[c]:
                seen = _fisheye_may_see(x, y, z, reach, largest, Ks, c, sizes[c, 0],
                                        sizes[c, 1])
            else:
                seen = (pinhole_axis_may_see(x, z, reach, near, largest, Ks[c, 0, 0],
                                             Ks[c, 0, 2], sizes[c, 0], (limits[c, 0], limits[c, 1]))
                        and pinhole_axis_may_see(y, z, reach, near, largest, Ks[c, 1, 1],
                                                 Ks[c, 1, 2], sizes[c, 1],
                                                 (limits[c, 2], limits[c, 3])))
            if seen:
                keep[g] = True
                break


@numba.njit(inline="always")
def _fisheye_may_see(x, y, z, reach, largest, Ks, c, width,
                     height):  # pragma: no cover - compiled
    """``_fisheye_box_meets_image`` of one Gaussian and camera."""
    distance = math.sqrt(x * x + y * y + z * z)
    alpha = math.asin(min(reach / distance, 1.0))
    off_axis = math.sqrt(x * x + y * y)
    theta_max = min(math.atan2(off_axis, z) + alpha, math.pi / 2)
    stretch = theta_max / math.sin(theta_max) if theta_max > 1e-6 else 1.0
    nearest = max(distance - reach, NEAR_PLANE)
    ratio = math.atan2(off_axis, z) / max(off_axis, 1e-300)
    for offset, axis, size in ((x, 0, width), (y, 1, height)):
        focal, centre = Ks[c, axis, axis], Ks[c, axis, 2]
        projected = focal * ratio * offset + centre
        drift = focal * stretch * alpha
        extent = FISHEYE_MARGIN * RADIUS_SIGMAS * math.sqrt(
            (focal * stretch / nearest) ** 2 * largest ** 2 + EPS2D) + SLACK_PIXELS
        if not (projected + drift + extent > 0 and projected - drift - extent < size):
            return False
    return True

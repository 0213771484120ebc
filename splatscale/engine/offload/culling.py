"""Which Gaussians a batch may see, decided on the device from lagging geometry.

The device keeps each Gaussian's means, log-scales and quaternions as they
were when the row was last written; the row's true values (dense Adam's)
may have moved since, by at most ``reach`` per coordinate of the means and of
the log-scales (``DeferredAdam.reach``). ``candidates`` keeps every Gaussian
that could pass ``project``'s visibility test for some values within that
reach; the exact test then runs on the true values of the candidates alone.

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
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from splatscale.data.cameras import Camera
from splatscale.render.conventions import EPS2D, FAR_PLANE, FRUSTUM_CLAMP, NEAR_PLANE, RADIUS_SIGMAS

SLACK_PIXELS = 1.0  # the exact box is rounded up to whole pixels, and floats round
FISHEYE_MARGIN = 1.01  # the fisheye extent's, for gsplat's eps in its Jacobian


@dataclass
class DeviceGeometry:
    """What the device keeps of every Gaussian: 40 bytes of geometry in float32 and
    the step the row was last written at."""

    means: Tensor        # [N, 3]
    log_scales: Tensor   # [N, 3]
    quats: Tensor        # [N, 4]
    updated_at: Tensor   # [N] int32

    def nbytes_per_gaussian(self) -> int:
        return sum(t[0].nbytes for t in (self.means, self.log_scales, self.quats,
                                         self.updated_at))


def candidates(means: Tensor, log_scales: Tensor, reach_means: Tensor, reach_scales: Tensor,
               cameras: Sequence[Camera]) -> Tensor:
    """Bool [N]: Gaussians that may be visible in some camera of the batch."""
    dtype = torch.float64  # the bounds, not the renderer: no rounding may cut one short
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

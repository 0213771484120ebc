"""The ideal equidistant fisheye camera (r = f theta) that a fisheye photo is resampled to.

COLMAP's fisheye models bend the equidistant projection by a polynomial in theta, the
angle from the optical axis (and, for the thin-prism ones, tangential and prism terms);
FISHEYE and SIMPLE_FISHEYE are the ideal projection itself, which the renderer draws
(``Camera.model == "fisheye"``), so their photos are used as they are.
"""

from __future__ import annotations

import math

import numpy as np

from splatscale.data.scene import Distortion
from splatscale.native import pycolmap

IDEAL_FISHEYE_MODELS = ("SIMPLE_FISHEYE", "FISHEYE")
DISTORTED_FISHEYE_MODELS = ("SIMPLE_RADIAL_FISHEYE", "RADIAL_FISHEYE", "OPENCV_FISHEYE",
                            "THIN_PRISM_FISHEYE", "RAD_TAN_THIN_PRISM_FISHEYE")
# A border pixel's direction is trusted when the model sends it back within this many
# pixels of where it came from (COLMAP inverts its fisheye models by Newton's method,
# which past the polynomial's turning point or past 90 degrees lands elsewhere).
ROUND_TRIP_PX = 1e-3
# Float rounding of an exact size (an ideal photo's border maps onto itself).
SIZE_SLACK_PX = 1e-6


def source_camera(distortion: Distortion) -> pycolmap.Camera:
    """The photo's camera as pycolmap's model of it."""
    return pycolmap.Camera(model=distortion.model, width=distortion.width,
                           height=distortion.height, params=list(distortion.params))


def equidistant_camera(distortion: Distortion) -> tuple[np.ndarray, int, int]:
    """(K, width, height) of the ideal equidistant fisheye a fisheye photo is resampled to.

    It keeps the photo's whole field of view: every direction the photo's border sees
    lands inside it. Its focal lengths are the photo's own (each COLMAP fisheye model's
    fx, fy are the equidistant focal lengths at the centre, where the polynomial is 1),
    so the centre keeps its resolution; its size and principal point are the bounding
    box of the photo's border directions projected by r = f theta. A photo that is
    already equidistant maps onto its own size and principal point; barrel distortion
    beyond the equidistant one makes it larger, the other way smaller; where the
    photo's border is not straight in the ideal camera, the pixels beyond it see
    nothing the photo saw and are left black (as COLMAP's undistorter leaves them).

    Raises ValueError when the parameters are not finite, or when a border pixel's
    direction cannot be represented: more than 90 degrees from the optical axis, or
    where the model does not invert (past its polynomial's turning point), both beyond
    what COLMAP's fisheye models map.
    """
    if not all(math.isfinite(p) for p in distortion.params):
        raise ValueError(f"its {distortion.model} parameters are not all finite "
                         f"({', '.join(f'{p:g}' for p in distortion.params)})")
    source = source_camera(distortion)
    border = _border_positions(distortion.width, distortion.height)
    rays = source.cam_ray_from_img(border)
    with np.errstate(invalid="ignore"):
        back = source.img_from_cam(rays)
        error = np.linalg.norm(back - border, axis=1)
        faithful = np.isfinite(rays).all(axis=1) & (rays[:, 2] > 0) & (error < ROUND_TRIP_PX)
    if not faithful.all():
        u, v = border[np.argmin(faithful)]
        raise ValueError(f"its {distortion.model} field of view cannot be represented: the "
                         f"direction of its border pixel ({u:g}, {v:g}) is beyond 90 degrees "
                         "from the optical axis or where the model does not invert")
    fx, fy = source.focal_length_x, source.focal_length_y
    u, v = equidistant_offsets(rays, fx, fy)
    width = math.ceil(u.max() - u.min() - SIZE_SLACK_PX)
    height = math.ceil(v.max() - v.min() - SIZE_SLACK_PX)
    K = np.array([[fx, 0.0, -u.min()], [0.0, fy, -v.min()], [0.0, 0.0, 1.0]])
    return K, max(width, 1), max(height, 1)


def _border_positions(width: int, height: int) -> np.ndarray:
    """[N, 2] image positions along the photo's outer edge (COLMAP's: pixel corners at
    integers), one per pixel on each side and the four corners."""
    us, vs = np.arange(width + 1, dtype=np.float64), np.arange(height + 1, dtype=np.float64)
    sides = [np.stack([us, np.zeros_like(us)], 1), np.stack([us, np.full_like(us, height)], 1),
             np.stack([np.zeros_like(vs), vs], 1), np.stack([np.full_like(vs, width), vs], 1)]
    return np.concatenate(sides)


def equidistant_offsets(rays: np.ndarray, fx: float, fy: float) -> tuple[np.ndarray, np.ndarray]:
    """Where an ideal equidistant camera puts ``rays`` [N, 3] (any length), relative to its
    principal point: (fx, fy) theta times the direction in the image plane."""
    radial = np.hypot(rays[:, 0], rays[:, 1])
    theta = np.arctan2(radial, rays[:, 2])
    scale = np.divide(theta, radial, out=np.ones_like(theta), where=radial > 0)
    return fx * scale * rays[:, 0], fy * scale * rays[:, 1]


def equidistant_rays(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """[..., 3] unit rays of an ideal equidistant camera's normalised image positions
    (x, y) = ((u - cx) / fx, (v - cy) / fy): theta = |(x, y)| from the optical axis."""
    theta = np.hypot(x, y)
    sin_over_theta = np.sinc(theta / np.pi)  # sin(theta) / theta, 1 at the axis
    return np.stack([x * sin_over_theta, y * sin_over_theta, np.cos(theta)], -1)


def ideal_fisheye_K(model: str, params: tuple[float, ...]) -> np.ndarray:
    """K of a camera that is already ideal equidistant (FISHEYE or SIMPLE_FISHEYE params)."""
    if model == "SIMPLE_FISHEYE":
        f, cx, cy = params
        fx = fy = f
    else:
        fx, fy, cx, cy = params
    return np.array([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]])

"""Resampling of images from any COLMAP camera model to the camera they are used with.

A fisheye model's photo goes to the ideal equidistant fisheye of the same field of view
(``fisheye.equidistant_camera``); any other distorted model's to the pinhole camera
COLMAP's image_undistorter would choose (``pycolmap.undistort_camera``). Each pixel of
the new image samples the photo where the photo's model (``pycolmap.Camera.img_from_cam``)
sends its ray.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.ndimage import map_coordinates

from splatscale.data.fisheye import (DISTORTED_FISHEYE_MODELS, IDEAL_FISHEYE_MODELS,
                                     equidistant_camera, equidistant_rays, ideal_fisheye_K,
                                     source_camera)
from splatscale.data.scene import Distortion
from splatscale.native import pycolmap

PINHOLE_MODELS = ("PINHOLE", "SIMPLE_PINHOLE")
# Beyond the image: map_coordinates' constant (black) at linear order.
OUTSIDE = -2.0


def undistorted_pinhole(distortion: Distortion) -> tuple[np.ndarray, int, int]:
    """(K, width, height) of the pinhole camera the undistorted image uses."""
    pinhole = pycolmap.undistort_camera(pycolmap.UndistortCameraOptions(),
                                        source_camera(distortion))
    return pinhole.calibration_matrix(), pinhole.width, pinhole.height


def resampled_camera(distortion: Distortion) -> tuple[np.ndarray, int, int, str]:
    """(K, width, height, Camera.model) of the camera a distorted photo is resampled to:
    the ideal equidistant fisheye for COLMAP's fisheye models, COLMAP's undistorted
    pinhole for the others. Raises ValueError for a fisheye it cannot represent."""
    if distortion.model in DISTORTED_FISHEYE_MODELS:
        return (*equidistant_camera(distortion), "fisheye")
    return (*undistorted_pinhole(distortion), "pinhole")


def undistort_image(image: np.ndarray, distortion: Distortion, K: np.ndarray, width: int,
                    height: int, model: str = "pinhole") -> np.ndarray:
    """Resample a distorted uint8 image [h, w, 3] into the camera (K, width, height) of
    ``Camera.model`` ``model``. A fisheye pixel whose ray the photo's model does not send
    back to it (beyond 90 degrees, or past its polynomial's turning point) saw nothing
    of the photo: black."""
    source = source_camera(distortion)
    if image.shape[:2] != (source.height, source.width):
        raise ValueError(f"image is {image.shape[1]}x{image.shape[0]}, its camera says "
                         f"{source.width}x{source.height}")
    u, v = np.meshgrid(np.arange(width) + 0.5, np.arange(height) + 0.5)
    x, y = (u - K[0, 2]) / K[0, 0], (v - K[1, 2]) / K[1, 1]
    if model == "fisheye":
        rays = equidistant_rays(x, y).reshape(-1, 3)
    else:
        rays = np.stack([x, y, np.ones_like(u)], -1).reshape(-1, 3)
    # COLMAP puts pixel centres at +0.5, array indices at the centres.
    src = source.img_from_cam(rays) - 0.5
    if model == "fisheye":
        src[~_sent_back(source, rays, src + 0.5)] = OUTSIDE
    coords = [src[:, 1].reshape(height, width), src[:, 0].reshape(height, width)]
    # "constant" blacks out a position a rounding error past an edge pixel's centre
    # (kept for pinholes, whose images stay as they were); "grid-constant" blends it
    # with black by its distance, so an ideal fisheye photo maps onto itself.
    mode = "grid-constant" if model == "fisheye" else "constant"
    channels = [map_coordinates(image[..., c].astype(np.float32), coords, order=1,
                                mode=mode, cval=0.0) for c in range(image.shape[2])]
    return np.clip(np.rint(np.stack(channels, -1)), 0, 255).astype(np.uint8)


def _sent_back(source: pycolmap.Camera, rays: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """[N] whether each unit ray's image position is finite and the model's ray there is
    the ray itself (to 1e-6 radians)."""
    finite = np.isfinite(positions).all(axis=1)
    back = np.zeros_like(rays)
    back[finite] = source.cam_ray_from_img(positions[finite])
    with np.errstate(invalid="ignore"):
        return finite & (np.linalg.norm(back - rays, axis=1) < 1e-6)


def ideal_K(model: str, params: tuple[float, ...]) -> tuple[torch.Tensor, str] | None:
    """(K, Camera.model) of a camera that needs no resampling (PINHOLE, SIMPLE_PINHOLE,
    FISHEYE or SIMPLE_FISHEYE params), or None for a distorted model."""
    if model in IDEAL_FISHEYE_MODELS:
        return torch.from_numpy(ideal_fisheye_K(model, params)), "fisheye"
    if model not in PINHOLE_MODELS:
        return None
    if model == "SIMPLE_PINHOLE":
        f, cx, cy = params
        fx = fy = f
    else:
        fx, fy, cx, cy = params
    K = torch.tensor([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]], dtype=torch.float64)
    return K, "pinhole"

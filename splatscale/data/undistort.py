"""Undistortion of images from any COLMAP camera model to a pinhole camera.

The pinhole camera is the one COLMAP's image_undistorter would choose
(``pycolmap.undistort_camera``); each of its pixels samples the distorted
image where the distortion model (``pycolmap.Camera.img_from_cam``) sends it.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.ndimage import map_coordinates

from splatscale.data.scene import Distortion
from splatscale.native import pycolmap

PINHOLE_MODELS = ("PINHOLE", "SIMPLE_PINHOLE")


def colmap_camera(distortion: Distortion) -> pycolmap.Camera:
    return pycolmap.Camera(model=distortion.model, width=distortion.width,
                           height=distortion.height, params=list(distortion.params))


def undistorted_pinhole(distortion: Distortion) -> tuple[np.ndarray, int, int]:
    """(K, width, height) of the pinhole camera the undistorted image uses."""
    pinhole = pycolmap.undistort_camera(pycolmap.UndistortCameraOptions(),
                                        colmap_camera(distortion))
    return pinhole.calibration_matrix(), pinhole.width, pinhole.height


def undistort_image(image: np.ndarray, distortion: Distortion, K: np.ndarray, width: int,
                    height: int) -> np.ndarray:
    """Resample a distorted uint8 image [h, w, 3] into the pinhole camera (K, width, height)."""
    source = colmap_camera(distortion)
    if image.shape[:2] != (source.height, source.width):
        raise ValueError(f"image is {image.shape[1]}x{image.shape[0]}, its camera says "
                         f"{source.width}x{source.height}")
    u, v = np.meshgrid(np.arange(width) + 0.5, np.arange(height) + 0.5)
    rays = np.stack([(u - K[0, 2]) / K[0, 0], (v - K[1, 2]) / K[1, 1], np.ones_like(u)], -1)
    # COLMAP puts pixel centres at +0.5, array indices at the centres.
    src = source.img_from_cam(rays.reshape(-1, 3)) - 0.5
    coords = [src[:, 1].reshape(height, width), src[:, 0].reshape(height, width)]
    channels = [map_coordinates(image[..., c].astype(np.float32), coords, order=1,
                                mode="constant", cval=0.0) for c in range(image.shape[2])]
    return np.clip(np.rint(np.stack(channels, -1)), 0, 255).astype(np.uint8)


def pinhole_K(model: str, params: tuple[float, ...]) -> torch.Tensor:
    """K of a camera that is already pinhole (PINHOLE or SIMPLE_PINHOLE params)."""
    if model == "SIMPLE_PINHOLE":
        f, cx, cy = params
        fx = fy = f
    else:
        fx, fy, cx, cy = params
    return torch.tensor([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]], dtype=torch.float64)

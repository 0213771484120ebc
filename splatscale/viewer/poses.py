"""Our cameras in the browser's terms and back.

viser's cameras and frustums are camera-to-world poses with OpenCV axes (+z
forward, +y down) and a vertical field of view, the same axes as ``Camera``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import viser.transforms as vtf

from splatscale.data.cameras import Camera


@dataclass(frozen=True)
class Pose:
    """Where a camera is and what it sees: ``wxyz`` and ``position`` the camera-to-world
    rotation and centre, ``fov`` vertical in radians, ``aspect`` width / height."""

    wxyz: np.ndarray
    position: np.ndarray
    fov: float
    aspect: float


def pose_of(camera: Camera) -> Pose:
    rotation = camera.viewmat[:3, :3].double().numpy()
    fy = float(camera.K[1, 1])
    return Pose(wxyz=vtf.SO3.from_matrix(rotation.T).wxyz,
                position=camera.center.double().numpy(),
                fov=2.0 * math.atan(camera.height / (2.0 * fy)),
                aspect=camera.width / camera.height)


def camera_at(pose: Pose, height: int, name: str = "") -> Camera:
    """A pinhole camera with square pixels and a centred principal point, ``height``
    pixels tall, seeing what ``pose`` sees."""
    width = max(1, round(height * pose.aspect))
    focal = height / (2.0 * math.tan(pose.fov / 2.0))
    K = torch.tensor([[focal, 0.0, width / 2.0], [0.0, focal, height / 2.0], [0.0, 0.0, 1.0]],
                     dtype=torch.float64)
    camera_to_world = vtf.SO3(np.asarray(pose.wxyz, dtype=np.float64)).as_matrix()
    rotation = torch.from_numpy(camera_to_world.T.copy())
    translation = -rotation @ torch.as_tensor(np.asarray(pose.position), dtype=torch.float64)
    return Camera.from_pose(rotation, translation, K, width, height, name)


def up_direction(cameras: list[Camera]) -> np.ndarray:
    """The mean of the cameras' up vectors (-y of OpenCV axes), unit length; +z when
    they cancel out."""
    ups = [-camera.viewmat[1, :3].double().numpy() for camera in cameras]
    mean = np.sum(ups, axis=0) if ups else np.zeros(3)
    norm = np.linalg.norm(mean)
    return mean / norm if norm > 1e-9 else np.array([0.0, 0.0, 1.0])


OVERVIEW_FOV = math.radians(60.0)


def overview(pose: Pose, distance: float) -> Pose:
    """``pose`` moved back ``distance`` along its view, seeing at least ``OVERVIEW_FOV``:
    the scene with the cameras around it."""
    forward = vtf.SO3(np.asarray(pose.wxyz, dtype=np.float64)).apply(np.array([0.0, 0.0, 1.0]))
    return Pose(pose.wxyz, pose.position - distance * forward, max(pose.fov, OVERVIEW_FOV),
                pose.aspect)

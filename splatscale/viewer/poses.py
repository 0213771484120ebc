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

"""The camera every other module speaks (gsplat's conventions): pinhole or fisheye."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

# Poses stored in float32 (or printed to a few digits in text files) are
# orthonormal only to about 1e-6; anything beyond 1e-4 is a scaled or sheared matrix.
ROTATION_TOLERANCE = 1e-4

# The projections a camera may have: "pinhole" (x = fx X / Z + cx) and "fisheye",
# ideal equidistant (r = f theta, theta the angle from the optical axis), as gsplat's
# camera_model names them.
CAMERA_MODELS = ("pinhole", "fisheye")


@dataclass(frozen=True)
class Camera:
    """A view of the scene.

    ``viewmat`` is the 4x4 world-to-camera transform with OpenCV axes (+x right,
    +y down, +z forward); ``K`` the 3x3 intrinsics in pixels, pixel centres at
    ``(i + 0.5, j + 0.5)``; ``model`` one of ``CAMERA_MODELS``.
    """

    viewmat: Tensor
    K: Tensor
    width: int
    height: int
    name: str = ""
    model: str = "pinhole"

    def __post_init__(self) -> None:
        if self.model not in CAMERA_MODELS:
            raise ValueError(f"camera {self.name!r}: model must be one of "
                             f"{', '.join(CAMERA_MODELS)}, got {self.model!r}")
        if tuple(self.viewmat.shape) != (4, 4) or tuple(self.K.shape) != (3, 3):
            raise ValueError(
                f"camera {self.name!r}: viewmat must be 4x4 and K 3x3, "
                f"got {tuple(self.viewmat.shape)} and {tuple(self.K.shape)}"
            )
        if self.width <= 0 or self.height <= 0:
            raise ValueError(f"camera {self.name!r}: bad image size {self.width}x{self.height}")

    @property
    def center(self) -> Tensor:
        """Camera centre in world coordinates."""
        rotation, translation = self.viewmat[:3, :3], self.viewmat[:3, 3]
        return -rotation.T @ translation

    def problem(self) -> str | None:
        """What makes this camera unusable, or None: the pose must be finite and rigid
        (a proper rotation), the focal lengths positive, the principal point finite."""
        viewmat, K = self.viewmat.double(), self.K.double()
        if not (torch.isfinite(viewmat).all() and torch.isfinite(K).all()):
            return "the pose or intrinsics hold NaN or infinite values"
        rotation = viewmat[:3, :3]
        orthonormal = torch.allclose(rotation @ rotation.T, torch.eye(3, dtype=torch.float64),
                                     atol=ROTATION_TOLERANCE)
        if not orthonormal or torch.linalg.det(rotation) < 0:
            return "the rotation is not a proper rotation (orthonormal, determinant +1)"
        if not torch.equal(viewmat[3], torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=torch.float64)):
            return "the pose's last row is not 0 0 0 1"
        if K[0, 0] <= 0 or K[1, 1] <= 0:
            return f"focal lengths must be positive, got {K[0, 0].item():g}, {K[1, 1].item():g}"
        return None

    @staticmethod
    def from_pose(rotation: Tensor, translation: Tensor, K: Tensor, width: int, height: int,
                  name: str = "", model: str = "pinhole") -> "Camera":
        """Build from a world-to-camera rotation and translation."""
        viewmat = torch.eye(4, dtype=torch.float64)
        viewmat[:3, :3] = torch.as_tensor(rotation, dtype=torch.float64)
        viewmat[:3, 3] = torch.as_tensor(translation, dtype=torch.float64)
        return Camera(viewmat, torch.as_tensor(K, dtype=torch.float64), int(width), int(height),
                      name, model)

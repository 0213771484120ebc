"""The pinhole camera every other module speaks (gsplat's conventions)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Camera:
    """A pinhole view of the scene.

    ``viewmat`` is the 4x4 world-to-camera transform with OpenCV axes (+x right,
    +y down, +z forward); ``K`` the 3x3 intrinsics in pixels, pixel centres at
    ``(i + 0.5, j + 0.5)``.
    """

    viewmat: Tensor
    K: Tensor
    width: int
    height: int
    name: str = ""

    def __post_init__(self) -> None:
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

    @staticmethod
    def from_pose(rotation: Tensor, translation: Tensor, K: Tensor, width: int, height: int,
                  name: str = "") -> "Camera":
        """Build from a world-to-camera rotation and translation."""
        viewmat = torch.eye(4, dtype=torch.float64)
        viewmat[:3, :3] = torch.as_tensor(rotation, dtype=torch.float64)
        viewmat[:3, 3] = torch.as_tensor(translation, dtype=torch.float64)
        return Camera(viewmat, torch.as_tensor(K, dtype=torch.float64), int(width), int(height), name)

"""What stage 1 of the renderer hands to stage 2, whichever backend made it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from splatscale.data.cameras import Camera


@dataclass
class Splats:
    """Packed projection: one row per visible (camera, Gaussian) pair, camera-major.

    ``camera_offsets[c]:camera_offsets[c + 1]`` are the rows of camera c;
    ``radii`` are the per-axis pixel half-extents of the splat's box.

    ``absgrad``, None unless a caller sets it, is a [M, 2] zero tensor that requires
    grad: ``rasterize`` then gives it as gradient, per splat, the sum over the
    pixels it renders of each pixel's |d loss / d means2d|, x and y apart (AbsGS,
    gsplat's ``absgrad=True``). Its value enters no image.
    """

    camera_ids: Tensor      # [M] int64
    gaussian_ids: Tensor    # [M] int64
    means2d: Tensor         # [M, 2]
    conics: Tensor          # [M, 3] inverse 2D covariance (xx, xy, yy)
    depths: Tensor          # [M]
    radii: Tensor           # [M, 2] int32
    colors: Tensor          # [M, 3]
    opacities: Tensor       # [M]
    keys: Tensor            # [M] int64, the Gaussians' keys: equal depths are ordered by them
    camera_offsets: list[int]
    cameras: list[Camera]
    absgrad: Tensor | None = None  # [M, 2]

    def __len__(self) -> int:
        return self.means2d.shape[0]

    def of_camera(self, index: int) -> "Splats":
        """The rows of one camera (slices keep the autograd graph)."""
        lo, hi = self.camera_offsets[index], self.camera_offsets[index + 1]
        if len(self.cameras) == 1:
            return self  # no slicing, so no slice nodes in the backward graph
        return Splats(self.camera_ids[lo:hi], self.gaussian_ids[lo:hi], self.means2d[lo:hi],
                      self.conics[lo:hi], self.depths[lo:hi], self.radii[lo:hi],
                      self.colors[lo:hi], self.opacities[lo:hi], self.keys[lo:hi], [0, hi - lo],
                      [self.cameras[index]],
                      None if self.absgrad is None else self.absgrad[lo:hi])


def camera_tensors(cameras: Sequence[Camera], like: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The cameras' viewmats [C, 4, 4], Ks [C, 3, 3] and sizes [C, 2] (width, height),
    in the dtype and on the device of ``like``."""
    dtype, device = like.dtype, like.device
    viewmats = torch.stack([c.viewmat for c in cameras]).to(device, dtype)
    Ks = torch.stack([c.K for c in cameras]).to(device, dtype)
    sizes = torch.tensor([[c.width, c.height] for c in cameras], dtype=dtype, device=device)
    return viewmats, Ks, sizes


def fisheye_cameras(cameras: Sequence[Camera], device: torch.device) -> Tensor:
    """[C] bool: which cameras have the equidistant (fisheye) projection, not a pinhole's."""
    return torch.tensor([c.model == "fisheye" for c in cameras], dtype=torch.bool,
                        device=device)


def camera_centres(viewmats: Tensor) -> Tensor:
    """The cameras' centres [C, 3] in world space, from world-to-camera ``viewmats``."""
    return -(viewmats[:, :3, :3].transpose(-1, -2) @ viewmats[:, :3, 3:])[..., 0]


def camera_offsets(camera_ids: Tensor, cameras: int) -> Tensor:
    """[cameras + 1]: where each camera's rows start in camera-major ``camera_ids``
    (a binary search a camera, not a pass over the rows)."""
    return torch.searchsorted(camera_ids.contiguous(), torch.arange(
        cameras + 1, dtype=camera_ids.dtype, device=camera_ids.device))


def fisheye_or_none(cameras: Sequence[Camera], device: torch.device) -> Tensor | None:
    """``fisheye_cameras``, or None where every camera is a pinhole (the projection
    kernels then compile without their fisheye code)."""
    if any(camera.model == "fisheye" for camera in cameras):
        return fisheye_cameras(cameras, device)
    return None

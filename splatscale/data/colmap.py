"""COLMAP models (binary or text), read with pycolmap."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from splatscale.data.cameras import Camera

PINHOLE_MODELS = ("PINHOLE", "SIMPLE_PINHOLE")


class DataError(ValueError):
    """Input data that cannot be used; the message names the file and the problem."""


@dataclass
class ColmapModel:
    cameras: list[Camera]        # sorted by image name
    image_names: list[str]
    points: np.ndarray           # [P, 3] float64
    colors: np.ndarray           # [P, 3] uint8


def find_sparse_dir(root: Path) -> Path:
    """The model folder of a COLMAP scene: ``sparse/0``, ``sparse`` or ``root`` itself."""
    for candidate in (root / "sparse" / "0", root / "sparse", root):
        if any((candidate / f"cameras.{ext}").exists() for ext in ("bin", "txt")):
            return candidate
    raise DataError(f"{root}: no COLMAP model (cameras.bin or cameras.txt) in sparse/0, "
                    "sparse or the folder itself")


def read_colmap(root: str | Path) -> ColmapModel:
    """Cameras (world-to-camera, OpenCV axes) and the coloured SfM points of a scene."""
    import pycolmap

    sparse = find_sparse_dir(Path(root))
    try:
        recon = pycolmap.Reconstruction(str(sparse))
    except Exception as error:  # pycolmap raises bare RuntimeErrors on bad files
        raise DataError(f"{sparse}: unreadable COLMAP model ({error})") from None
    cameras = []
    for image in sorted(recon.images.values(), key=lambda im: im.name):
        intrinsics = recon.cameras[image.camera_id]
        model = intrinsics.model.name
        if model not in PINHOLE_MODELS:
            raise DataError(f"{sparse}: camera {image.camera_id} has model {model}; "
                            f"only {', '.join(PINHOLE_MODELS)} are supported here")
        pose = image.cam_from_world()
        cameras.append(Camera.from_pose(
            torch.from_numpy(pose.rotation.matrix()), torch.from_numpy(pose.translation),
            torch.from_numpy(intrinsics.calibration_matrix()), intrinsics.width,
            intrinsics.height, image.name))
    points = recon.points3D.values()
    xyz = np.array([p.xyz for p in points], dtype=np.float64).reshape(-1, 3)
    rgb = np.array([p.color for p in points], dtype=np.uint8).reshape(-1, 3)
    return ColmapModel(cameras, [c.name for c in cameras], xyz, rgb)

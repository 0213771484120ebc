"""COLMAP models (binary or text; ``sparse/0``, ``sparse`` or the folder itself)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from splatscale.data.cameras import Camera
from splatscale.data.scene import (Distortion, Scene, View, check_cameras,
                                   check_missing_images, check_unique_names, finite_points)
from splatscale.data.undistort import ideal_K, resampled_camera
from splatscale.errors import DataError


def find_sparse_dir(root: Path) -> Path:
    for candidate in (root / "sparse" / "0", root / "sparse", root):
        if any((candidate / f"cameras.{ext}").exists() for ext in ("bin", "txt")):
            return candidate
    raise DataError(f"{root}: no COLMAP model (cameras.bin or cameras.txt) in sparse/0, "
                    "sparse or the folder itself")


def find_image_dir(root: Path, sparse: Path) -> Path:
    for candidate in (root / "images", sparse.parent / "images", sparse.parent.parent / "images"):
        if candidate.is_dir():
            return candidate
    raise DataError(f"{root}: no images folder next to the COLMAP model")


def _view(image, intrinsics, path: Path, sparse: Path) -> View:
    model = intrinsics.model.name
    params = tuple(float(p) for p in intrinsics.params)
    distortion, ideal = None, ideal_K(model, params)
    if ideal is not None:
        (K, kind), width, height = ideal, intrinsics.width, intrinsics.height
    else:
        distortion = Distortion(model, params, intrinsics.width, intrinsics.height)
        try:
            K_np, width, height, kind = resampled_camera(distortion)
        except ValueError as error:
            raise DataError(f"{sparse}: camera {intrinsics.camera_id} of {image.name}: "
                            f"{error}") from None
        K = torch.from_numpy(K_np)
    pose = image.cam_from_world()
    camera = Camera.from_pose(torch.from_numpy(pose.rotation.matrix()),
                              torch.from_numpy(pose.translation), K, width, height, image.name,
                              kind)
    return View(camera, path, distortion)


def read_colmap(root: str | Path, skip_missing_images: bool = False) -> Scene:
    """Views (world-to-camera, OpenCV axes; distorted models to be undistorted) and points.

    Images the model names that are absent are an error, or skipped with
    ``skip_missing_images``.
    """
    from splatscale.native import pycolmap

    root = Path(root)
    sparse = find_sparse_dir(root)
    try:
        recon = pycolmap.Reconstruction(str(sparse))
    except Exception as error:  # pycolmap raises bare RuntimeErrors on bad files
        raise DataError(f"{sparse}: unreadable COLMAP model ({error})") from None
    if recon.num_images() == 0:
        raise DataError(f"{sparse}: the COLMAP model has no images")
    image_dir = find_image_dir(root, sparse)
    images = sorted(recon.images.values(), key=lambda im: im.name)
    present = [(image_dir / im.name).is_file() for im in images]
    missing = [im.name for im, here in zip(images, present) if not here]
    check_missing_images(missing, len(images), sparse, skip_missing_images)
    views = [_view(im, recon.cameras[im.camera_id], image_dir / im.name, sparse)
             for im, here in zip(images, present) if here]
    check_unique_names(views, sparse)
    check_cameras(views, sparse)
    points = [point for _, point in sorted(recon.points3D.items())]  # by id: deterministic
    xyz = np.array([p.xyz for p in points], dtype=np.float64).reshape(-1, 3)
    rgb = np.array([p.color for p in points], dtype=np.uint8).reshape(-1, 3)
    if len(xyz) == 0:
        raise DataError(f"{sparse}: the COLMAP model has no 3D points to start from")
    return Scene(views, *finite_points(xyz, rgb, sparse), root, image_dir=image_dir)

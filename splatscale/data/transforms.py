"""transforms.json scenes: Blender/NeRF-synthetic, instant-ngp and nerfstudio variants."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from splatscale.data.cameras import Camera
from splatscale.data.scene import (Distortion, Scene, View, check_cameras,
                                   check_missing_images, check_unique_names, finite_points)
from splatscale.data.undistort import resampled_camera
from splatscale.errors import DataError

SPLIT_FILES = ("transforms_train.json", "transforms_val.json", "transforms_test.json")
IMAGE_SUFFIXES = ("", ".png", ".jpg", ".jpeg", ".JPG", ".PNG")


def find_transforms(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    if (root / "transforms.json").is_file():
        return [root / "transforms.json"]
    split = [root / name for name in SPLIT_FILES if (root / name).is_file()]
    if split:
        return split
    raise DataError(f"{root}: no transforms.json (nor transforms_train.json)")


def _load_json(path: Path) -> dict:
    try:
        meta = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise DataError(f"{path}: not readable as JSON ({error})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("frames"), list) or not meta["frames"]:
        raise DataError(f"{path}: no 'frames' list")
    return meta


def _image_path(base: Path, file_path: str) -> Path | None:
    """The frame's image (its name may omit the suffix), or None when absent."""
    for suffix in IMAGE_SUFFIXES:
        candidate = base / (file_path + suffix)
        if candidate.is_file():
            return candidate
    return None


def _number(value, key: str, where: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise DataError(f"{where}: {key} is not a number ({value!r})") from None
    if not math.isfinite(number):
        raise DataError(f"{where}: {key} is not finite ({value!r})")
    return number


def _focal_from_angle(size: int, value, key: str, where: str) -> float:
    angle = _number(value, key, where)
    if not 0 < angle < math.pi:
        raise DataError(f"{where}: {key} must be an angle in (0, pi) radians, got {value!r}")
    return 0.5 * size / math.tan(0.5 * angle)


def _intrinsics(meta: dict, frame: dict, image_path: Path, where: str):
    """(fx, fy, cx, cy, width, height, distortion params) with frame values over global."""
    get = lambda key, default=None: frame.get(key, meta.get(key, default))  # noqa: E731
    width, height = get("w"), get("h")
    if width is None or height is None:
        try:
            with Image.open(image_path) as image:
                width, height = image.size
        except OSError as error:
            raise DataError(f"{image_path}: not a readable image ({error})") from None
    width, height = _number(width, "w", where), _number(height, "h", where)
    if width < 1 or height < 1 or width != int(width) or height != int(height):
        raise DataError(f"{where}: image size {width:g}x{height:g} is not a positive size")
    width, height = int(width), int(height)
    if get("fl_x") is not None:
        fx = _number(get("fl_x"), "fl_x", where)
        fy = _number(get("fl_y", fx), "fl_y", where)
    elif get("camera_angle_x") is not None:
        fx = _focal_from_angle(width, get("camera_angle_x"), "camera_angle_x", where)
        angle_y = get("camera_angle_y")
        fy = fx if angle_y is None else _focal_from_angle(height, angle_y, "camera_angle_y", where)
    else:
        raise DataError(f"{where}: no focal length (fl_x or camera_angle_x)")
    cx, cy = _number(get("cx", width / 2), "cx", where), _number(get("cy", height / 2), "cy", where)
    coefficients = {k: _number(get(k, 0.0), k, where) for k in ("k1", "k2", "k3", "k4", "p1", "p2")}
    return fx, fy, cx, cy, width, height, coefficients, get("camera_model", "OPENCV")


def _distortion(fx, fy, cx, cy, width, height, k: dict, camera_model: str) -> Distortion | None:
    if not any(k.values()):
        return None
    if camera_model == "OPENCV_FISHEYE":
        return Distortion("OPENCV_FISHEYE", (fx, fy, cx, cy, k["k1"], k["k2"], k["k3"], k["k4"]),
                          width, height)
    if k["k3"] or k["k4"]:
        return Distortion("FULL_OPENCV", (fx, fy, cx, cy, k["k1"], k["k2"], k["p1"], k["p2"],
                                          k["k3"], k["k4"], 0.0, 0.0), width, height)
    return Distortion("OPENCV", (fx, fy, cx, cy, k["k1"], k["k2"], k["p1"], k["p2"]),
                      width, height)


def _world_to_camera(frame: dict, where: str) -> np.ndarray:
    """The frame's transform_matrix (camera to world, OpenGL axes) as an OpenCV viewmat."""
    try:
        c2w = np.array(frame["transform_matrix"], dtype=np.float64)
    except (TypeError, ValueError):
        c2w = None
    if c2w is None or c2w.shape != (4, 4) or not np.isfinite(c2w).all():
        raise DataError(f"{where}: transform_matrix is not a 4x4 matrix of finite numbers")
    c2w[:3, 1:3] *= -1  # OpenGL camera axes (y up, z back) to OpenCV (y down, z forward)
    try:
        return np.linalg.inv(c2w)
    except np.linalg.LinAlgError:
        raise DataError(f"{where}: transform_matrix is singular") from None


def _view(meta: dict, frame: dict, path: Path, source: Path) -> View:
    where = f"{source}: frame {frame['file_path']}"
    fx, fy, cx, cy, width, height, k, model = _intrinsics(meta, frame, path, where)
    viewmat = torch.from_numpy(_world_to_camera(frame, where))
    distortion = _distortion(fx, fy, cx, cy, width, height, k, model)
    if distortion is None:  # nerfstudio's OPENCV_FISHEYE without k1..k4 is equidistant
        K = torch.tensor([[fx, 0, cx], [0, fy, cy], [0, 0, 1]], dtype=torch.float64)
        kind = "fisheye" if model == "OPENCV_FISHEYE" else "pinhole"
    else:
        try:
            K_np, width, height, kind = resampled_camera(distortion)
        except ValueError as error:
            raise DataError(f"{where}: {error}") from None
        K = torch.from_numpy(K_np)
    camera = Camera(viewmat, K, width, height, str(frame["file_path"]), kind)
    return View(camera, path, distortion, _mask_path(frame, source.parent, where))


def _mask_path(frame: dict, base: Path, where: str) -> Path | None:
    """The frame's ``mask_path`` (nerfstudio's), from the transforms file's folder;
    read only where masks are asked for."""
    if "mask_path" not in frame:
        return None
    if not isinstance(frame["mask_path"], str) or not frame["mask_path"]:
        raise DataError(f"{where}: mask_path is not a file name")
    return base / frame["mask_path"]


def _read_ply_points(path: Path) -> tuple[np.ndarray, np.ndarray]:
    from plyfile import PlyData

    try:
        vertex = PlyData.read(str(path))["vertex"]
        xyz = np.stack([vertex["x"], vertex["y"], vertex["z"]], axis=1).astype(np.float64)
    except (OSError, KeyError, ValueError) as error:
        raise DataError(f"{path}: not a point cloud PLY with x, y, z ({error})") from None
    if len(xyz) == 0:
        raise DataError(f"{path}: the point cloud is empty")
    names = vertex.data.dtype.names
    if all(c in names for c in ("red", "green", "blue")):
        rgb = np.stack([vertex["red"], vertex["green"], vertex["blue"]], axis=1).astype(np.uint8)
    else:
        rgb = np.full((len(xyz), 3), 128, np.uint8)
    return xyz, rgb


def _frame_images(meta: dict, base: Path, source: Path,
                  skip_missing: bool) -> list[tuple[dict, Path]]:
    """(frame, image path) of every frame whose image is present."""
    frames = meta["frames"]
    if not all(isinstance(f, dict) and "transform_matrix" in f for f in frames):
        raise DataError(f"{source}: a frame lacks transform_matrix")
    if not all(isinstance(f.get("file_path"), str) and f["file_path"] for f in frames):
        raise DataError(f"{source}: a frame's file_path is not a file name")
    paths = [_image_path(base, str(frame["file_path"])) for frame in frames]
    missing = [str(f["file_path"]) for f, p in zip(frames, paths) if p is None]
    check_missing_images(missing, len(frames), source, skip_missing)
    return [(frame, path) for frame, path in zip(frames, paths) if path is not None]


def read_transforms(root: str | Path, skip_missing_images: bool = False) -> Scene:
    """Views of every transforms file of the scene (train, val, test), sorted by name.

    The split files of NeRF-synthetic scenes are all read; the train/test split
    is then made by the every-8th rule like any other scene. Frames whose
    images are absent are an error, or skipped with ``skip_missing_images``.
    """
    root = Path(root)
    views, ply = [], None
    for path in find_transforms(root):
        meta = _load_json(path)
        file_views = [_view(meta, frame, image, path) for frame, image
                      in _frame_images(meta, path.parent, path, skip_missing_images)]
        check_unique_names(file_views, path)
        check_cameras(file_views, path)
        views += file_views
        if meta.get("ply_file_path"):
            ply = path.parent / meta["ply_file_path"]
    views.sort(key=lambda v: v.camera.name)
    if ply is not None:
        if not ply.is_file():
            raise DataError(f"{ply}: ply_file_path names a file that is missing")
        points, colors = finite_points(*_read_ply_points(ply), ply)
    else:
        points, colors = np.zeros((0, 3)), np.zeros((0, 3), np.uint8)
    return Scene(views, points, colors, root)

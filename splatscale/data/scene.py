"""A scene as read from disk: its views (camera + image file) and its points."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from splatscale.data.cameras import Camera
from splatscale.errors import DataError
from splatscale.messages import notice


@dataclass(frozen=True)
class Distortion:
    """A camera whose images must be resampled to their view's ``camera`` before use
    (COLMAP's undistorted pinhole, or for its fisheye models an ideal fisheye).

    ``model`` and ``params`` follow COLMAP's camera models (pycolmap names).
    """

    model: str
    params: tuple[float, ...]
    width: int
    height: int


@dataclass
class View:
    """One image of the scene: the camera it is used with (pinhole or ideal fisheye),
    and its file."""

    camera: Camera
    image_path: Path
    distortion: Distortion | None = None
    mask_path: Path | None = None  # the mask the scene names for it (a frame's mask_path)


@dataclass
class Scene:
    views: list[View]                       # sorted by image name
    points: np.ndarray                      # [P, 3] float64, may be empty
    colors: np.ndarray                      # [P, 3] uint8
    source: Path
    background: tuple[float, float, float] = (0.0, 0.0, 0.0)  # the images' own background
    image_dir: Path | None = None  # where images are named from (COLMAP's images folder)

    def split(self, eval_split: bool, every: int = 8) -> tuple[list[int], list[int]]:
        """(train, test) view indices: every ``every``-th view by name is a test view."""
        indices = list(range(len(self.views)))
        if not eval_split:
            return indices, []
        return ([i for i in indices if i % every != 0], [i for i in indices if i % every == 0])

    def camera_extent(self, ids: list[int]) -> float:
        """1.1 x the largest distance of cameras ``ids`` from their centroid (the 3DGS
        extent, which 3DGS takes over the training cameras)."""
        centres = np.stack([self.views[i].camera.center.numpy() for i in ids])
        radius = np.linalg.norm(centres - centres.mean(axis=0), axis=1).max()
        return float(1.1 * max(radius, 1e-6))


def check_cameras(views: list[View], source: Path) -> None:
    """Refuse the scene if any view's camera is unusable, naming it and the problem."""
    bad = [(view.camera.name, problem) for view in views
           if (problem := view.camera.problem()) is not None]
    if bad:
        name, problem = bad[0]
        others = f" (and {len(bad) - 1} more cameras)" if len(bad) > 1 else ""
        raise DataError(f"{source}: camera of {name}: {problem}{others}")


def check_missing_images(missing: list[str], listed: int, source: Path,
                         skip_missing: bool) -> None:
    """Refuse a scene whose file lists images that are absent, naming the first few;
    with ``skip_missing`` say how many are skipped and go on with the rest."""
    if not missing:
        return
    names = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
    what = f"{len(missing)} of the {listed} images it lists are missing ({names})"
    if not skip_missing:
        raise DataError(f"{source}: {what}; --skip-missing-images trains on the others")
    if len(missing) == listed:
        raise DataError(f"{source}: all {what}")
    notice(f"{source}: {what}; skipping them")


def check_unique_names(views: list[View], source: Path) -> None:
    """Refuse a scene listing one image twice: its two poses would be contradictory
    supervision, or one image weighted twice."""
    seen: set[str] = set()
    for view in views:
        if view.camera.name in seen:
            raise DataError(f"{source}: image {view.camera.name} is listed twice; each "
                            "image may have one pose")
        seen.add(view.camera.name)


def finite_points(xyz: np.ndarray, rgb: np.ndarray,
                  source: Path) -> tuple[np.ndarray, np.ndarray]:
    """The points whose coordinates are all finite, saying how many were dropped."""
    finite = np.isfinite(xyz).all(axis=1)
    if finite.all():
        return xyz, rgb
    dropped = int((~finite).sum())
    if not finite.any():
        raise DataError(f"{source}: none of its {dropped} points has finite coordinates")
    notice(f"{source}: dropped {dropped} of {len(xyz)} points with NaN or infinite "
           "coordinates")
    return xyz[finite], rgb[finite]

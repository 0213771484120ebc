"""Scene data: cameras, readers for COLMAP and transforms.json, the demo scene, images."""

from __future__ import annotations

from pathlib import Path

from splatscale.data.cameras import Camera
from splatscale.data.scene import Scene
from splatscale.errors import DataError


def load_scene(path: str | Path, skip_missing_images: bool = False) -> Scene:
    """The scene at ``path``: a transforms.json scene (a folder holding one, or the
    file itself), else a COLMAP folder. Images the scene lists that are absent
    are an error, or skipped with ``skip_missing_images``."""
    from splatscale.data.colmap import find_sparse_dir, read_colmap
    from splatscale.data.transforms import find_transforms, read_transforms

    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    try:
        find_transforms(path)
    except DataError:  # no transforms file: only a COLMAP model is left
        try:
            find_sparse_dir(path)
        except DataError:
            _refuse_unposed(path)
            raise  # names the folder: it is neither format
        return read_colmap(path, skip_missing_images)
    return read_transforms(path, skip_missing_images)


def _refuse_unposed(path: Path) -> None:
    """Photos or videos without camera poses: say how to make a scene of them."""
    from splatscale.data.media import find_sources

    for media in (path, path / "images"):
        try:
            find_sources(media)
        except DataError:
            continue
        scene = path.with_name(path.name + "-scene")
        raise DataError(f"{media}: photos or video without camera poses; make a scene of "
                        f"them first: splatscale prepare {media} -o {scene}")


__all__ = ["Camera", "Scene", "load_scene"]

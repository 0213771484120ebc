"""Scene data: cameras, readers for COLMAP and transforms.json, the demo scene, images."""

from __future__ import annotations

from pathlib import Path

from splatscale.data.cameras import Camera
from splatscale.data.scene import Scene
from splatscale.errors import DataError


def load_scene(path: str | Path) -> Scene:
    """The scene at ``path``: a COLMAP folder or a transforms.json scene."""
    from splatscale.data.colmap import find_sparse_dir, read_colmap
    from splatscale.data.transforms import find_transforms, read_transforms

    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    if path.is_file() and path.suffix == ".json":
        return read_transforms(path)
    try:
        find_transforms(path)
        return read_transforms(path)
    except DataError:
        pass
    find_sparse_dir(path)  # raises naming the folder when it is neither format
    return read_colmap(path)


__all__ = ["Camera", "Scene", "load_scene"]

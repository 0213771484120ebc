"""A folder of renders, written only where no one else's file is replaced.

A render folder is new, empty, or one that renders were written to before: its
``renders.json`` lists every file written there. Nothing else in it is ever
replaced: every file a render would write is checked before the first one is.
Each view's file is named by its image's path in the scene, so names are unique
by construction (``cam0/f0.jpg`` and ``cam1/f0.jpg`` stay apart).
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

import numpy as np

from splatscale.atomic import write_json
from splatscale.data.images import write_png
from splatscale.errors import DataError, SplatscaleError

MANIFEST = "renders.json"


def render_names(image_names: list[str]) -> list[str]:
    """The file of each view's render, relative to the folder: the image's path with a
    ``.png`` suffix (``../`` made ``__/`` so that none leaves the folder). Where two
    would meet (``a.jpg`` and ``a.tif``), both keep their image's whole name."""
    def relative(name: str) -> PurePosixPath:
        parts = [("__" if part == ".." else part) for part in PurePosixPath(name).parts
                 if part not in ("/", ".")]
        return PurePosixPath(*parts)

    paths = [relative(name) for name in image_names]
    stems = [str(path.with_suffix(".png")) for path in paths]
    meeting = {stem for stem in stems if stems.count(stem) > 1}
    return [f"{path}.png" if stem in meeting else stem for path, stem in zip(paths, stems)]


def photo_name(render_name: str) -> str:
    """The file of the photo shown beside the render ``render_name``."""
    return render_name.removesuffix(".png") + ".photo.png"


class RenderFolder:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @property
    def manifest(self) -> Path:
        return self.path / MANIFEST

    def written(self) -> list[str]:
        """The files renders wrote here before (``renders.json``), each checked."""
        if not self.manifest.is_file():
            return []
        try:
            files = json.loads(self.manifest.read_text()).get("files")
        except (OSError, ValueError, AttributeError) as error:
            raise DataError(f"{self.manifest}: not a list of renders ({error})") from None
        if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
            raise DataError(f"{self.manifest}: files must be a list of file names")
        return files

    def check(self, names: list[str]) -> None:
        """Refuse, before anything is written, a folder that is not one of renders, or
        a render that would replace a file renders did not write."""
        if self.path.exists() and not self.path.is_dir():
            raise SplatscaleError(f"{self.path}: exists and is not a folder")
        if not self.path.is_dir():
            return
        ours = set(self.written())
        held = sorted(p.name for p in self.path.iterdir() if not p.name.startswith("."))
        if not ours and held:
            raise SplatscaleError(f"{self.path}: holds {', '.join(held[:3])}, which no render "
                                  "wrote; choose a new or empty folder for the renders")
        foreign = [name for name in names if _occupied(self.path / name) and name not in ours]
        if foreign:
            raise SplatscaleError(f"{self.path}: {foreign[0]} is there and no render wrote "
                                  "it; choose a new or empty folder for the renders")

    def begin(self, names: list[str], about: dict) -> None:
        """List the files about to be written (with those written before), before the
        first is: a stop half way leaves none that the folder does not own. ``about``
        says what they are renders of."""
        write_json(self.manifest, {**about, "files": sorted(set(self.written()) | set(names))})

    def write(self, name: str, pixels: np.ndarray) -> None:
        """One render, [h, w, 3] uint8, as ``name`` (one of those ``begin`` listed)."""
        write_png(pixels, self.path / name)


def _occupied(path: Path) -> bool:
    """Whether anything is at ``path``, a dangling link included."""
    return path.is_symlink() or path.exists()

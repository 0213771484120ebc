"""A folder of renders, written only where no one else's file is replaced.

A render folder is new, empty, or one that renders were written to before: its
``renders.json`` lists every file written there. Nothing else in it is ever
replaced, nor anything through a link: every file a render would write is checked
before the first one is. Each view's render is named by its image's path in the
scene with ``.png`` added (``cam0/f0.jpg.png``), its photo beside it with
``.photo.png``: distinct names give distinct files, by construction.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

import numpy as np

from splatscale.atomic import write_json
from splatscale.data.images import write_png
from splatscale.errors import DataError, SplatscaleError

MANIFEST = "renders.json"
ESCAPES = {"..": "%2E%2E", "/": "%2F"}  # path parts that would lead out of the folder


def render_names(image_names: list[str]) -> list[str]:
    """The file of each view's render, relative to the folder: the image's path with
    ``.png`` added, ``..`` spelled ``%2E%2E`` and a root ``%2F`` (``%`` itself as
    ``%25``), so that none leaves the folder and no two meet."""
    def relative(name: str) -> str:
        parts = [ESCAPES.get(part, part.replace("%", "%25"))
                 for part in PurePosixPath(name).parts if part != "."]
        return "/".join(parts) + ".png"

    return [relative(name) for name in image_names]


def check_distinct(files: list[str]) -> None:
    """Refuse files of which two are one: two spellings of one image's path
    (``a/b.jpg``, ``a//b.jpg``), or an image named like another's photo."""
    seen: set[str] = set()
    for name in files:
        if name in seen:
            raise DataError(f"{name}: two views' renders would be this one file; the "
                            "scene names one image in two ways")
        seen.add(name)


def photo_name(render_name: str) -> str:
    """The file of the photo shown beside the render ``render_name``."""
    return render_name.removesuffix(".png") + ".photo.png"


def _relative_name(name) -> bool:
    """Whether ``name`` (read from a renders.json) names a file inside its folder."""
    parts = PurePosixPath(name).parts if isinstance(name, str) and name else ("/",)
    return parts[0] != "/" and not {"..", "."} & set(parts) and "\0" not in name


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
        if not isinstance(files, list) or not all(map(_relative_name, files)):
            raise DataError(f"{self.manifest}: files must be a list of file names inside "
                            "its folder")
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
        foreign = [name for name in names if _occupied(self.path / name)
                   and (name not in ours or (self.path / name).is_symlink())]
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
        write_png(pixels, self.file(name))

    def file(self, name: str) -> Path:
        """Where ``name`` (one of those ``begin`` listed) is written: never through a
        link."""
        if (self.path / name).is_symlink():
            raise SplatscaleError(f"{self.path / name}: a link, which no render wrote; "
                                  "it is not written through")
        return self.path / name

    def clear(self) -> None:
        """Remove the files renders wrote here (links left by others stay), and the
        list of them."""
        for name in self.written():
            path = self.path / name
            if path.is_file() and not path.is_symlink():
                path.unlink()
        self.manifest.unlink()


def _occupied(path: Path) -> bool:
    """Whether anything is at ``path``, a dangling link included."""
    return path.is_symlink() or path.exists()

"""Photos and videos as `prepare` reads them: a folder of photos, a video, or a folder of videos."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from splatscale.errors import DataError

PHOTO_SUFFIXES = (".jpg", ".jpeg", ".png", ".tif", ".tiff", ".webp", ".bmp", ".heic", ".heif")
VIDEO_SUFFIXES = (".mp4", ".mov", ".m4v", ".avi", ".mkv", ".webm", ".mts", ".mpg", ".mpeg")
MIN_VIEWS = 3  # SfM's least: two views make a pair, a third is registered against them
SHOWN = 4  # names a message lists before "..."


@dataclass(frozen=True)
class Sources:
    """The input's photos or its videos (one kind), sorted by name, and what the folder
    holds that is skipped: other files, neither photo nor video; dot-named photos and
    videos; subfolders holding photos or videos."""

    photos: tuple[Path, ...] = ()
    videos: tuple[Path, ...] = ()
    others: tuple[Path, ...] = ()
    hidden: tuple[Path, ...] = ()
    subfolders: tuple[Path, ...] = ()

    @property
    def files(self) -> tuple[Path, ...]:
        """The photos or videos the scene is made from."""
        return self.photos + self.videos


def find_sources(path: Path) -> Sources:
    """The photos or videos at ``path``: a video file, or the files of a folder (not
    its subfolders, nor its dot-named files). Refuses an input with neither, with both,
    or with too few photos."""
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    if path.is_file():
        if path.suffix.lower() in VIDEO_SUFFIXES:
            return Sources(videos=(path,))
        raise DataError(f"{path}: not a video ({', '.join(VIDEO_SUFFIXES)}) nor a folder of "
                        "images")
    entries = sorted(path.iterdir())
    files = [p for p in entries if p.is_file() and not p.name.startswith(".")]
    photos = tuple(p for p in files if p.suffix.lower() in PHOTO_SUFFIXES)
    videos = tuple(p for p in files if p.suffix.lower() in VIDEO_SUFFIXES)
    others = tuple(p for p in files if not _is_media(p))
    hidden = tuple(p for p in entries if p.is_file() and p.name.startswith(".") and _is_media(p))
    subfolders = tuple(p for p in entries if p.is_dir() and not p.name.startswith(".")
                       and _holds_media(p))
    if photos and videos:
        raise DataError(f"{path}: holds both images and videos; prepare one kind at a time")
    if not photos and not videos:
        raise DataError(f"{path}: no images ({', '.join(PHOTO_SUFFIXES)}) or videos "
                        f"({', '.join(VIDEO_SUFFIXES)}) in the folder"
                        + (f"; {unread(subfolders)}" if subfolders else ""))
    if photos and len(photos) < MIN_VIEWS:
        raise DataError(f"{path}: {len(photos)} image{'s' if len(photos) > 1 else ''}; "
                        f"structure from motion needs at least {MIN_VIEWS} views")
    return Sources(photos, videos, others, hidden, subfolders)


def _is_media(path: Path) -> bool:
    return path.suffix.lower() in PHOTO_SUFFIXES + VIDEO_SUFFIXES


def _holds_media(folder: Path) -> bool:
    """Whether ``folder``'s own files include a photo or a video (one not read)."""
    try:
        return any(p.is_file() and _is_media(p) for p in folder.iterdir())
    except OSError:  # a folder that cannot be listed: not read either way
        return False


def unread(subfolders: tuple[Path, ...]) -> str:
    """The sentence that names ``subfolders`` as not read."""
    return (f"not read: {a_few([f'{folder.name}/' for folder in subfolders])} (prepare "
            "reads a folder's own files, not its subfolders)")


def a_few(names: list[str]) -> str:
    """The first ``SHOWN`` of ``names`` for a one-line message, "..." for the rest."""
    return ", ".join(names[:SHOWN]) + (", ..." if len(names) > SHOWN else "")

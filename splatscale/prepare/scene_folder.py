"""The folder ``prepare`` makes: ``images/``, ``sparse/0/``, ``database.db`` and
``prepare.json``, its record of what it was made from and of what SfM found.

``prepare.json`` is written first, so a folder holding the others without it
was not made by ``prepare`` and is never touched. A folder made from the same
input files (each one's name, size and mtime, as rsync judges change) with the
same settings is continued: its images and the database's features and matches
are reused. Half-written parts are dot-named and cleared before the next run
writes.

Whatever else the folder holds stays: the user's own files in ``images/`` or
``sparse/`` are never removed. Clearing and publishing remove only what prepare
wrote: the images ``prepare.json`` names (it names each before it is put in
``images/``, and still names it until it is removed), the model files pycolmap
writes in ``sparse/0``, the database and the manifest.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from splatscale.atomic import write_json
from splatscale.data.media import VIDEO_SUFFIXES, a_few
from splatscale.errors import DataError, SplatscaleError
from splatscale.messages import notice

MANIFEST = "prepare.json"
DATABASE = "database.db"
DATABASE_ENTRIES = tuple(DATABASE + tail for tail in ("", "-journal", "-wal", "-shm"))  # sqlite's
ENTRIES = ("images", "sparse", *DATABASE_ENTRIES, MANIFEST)
# What pycolmap's Reconstruction.write puts in sparse/0 (tests/test_prepare.py checks it).
MODEL_FILES = ("cameras.bin", "frames.bin", "images.bin", "points3D.bin", "rigs.bin")
STAGING_IMAGES = ".images.partial"
STAGING_MODEL = "sparse/.0.partial"
MAPPING_SCRATCH = ".mapping."  # the prefix of the mapper's scratch folders
# Half-written parts: the staged images and model, the mapper's scratch folders and the
# manifest's temporary (splatscale.atomic's name), left by a run killed outright.
PARTIALS = (STAGING_IMAGES, STAGING_MODEL, MAPPING_SCRATCH + "*", f".{MANIFEST}.*.tmp")
IMAGE_FIELDS = ("cameras", "sequences")
AFRESH = "--overwrite starts afresh"
FRAME = re.compile(r"(.+)_\d{6,}\.jpg")  # frame_name's names


def image_name(file_name: str) -> str:
    """The scene's name for an image made from ``file_name``: each whitespace character
    made "_". COLMAP's list of pairs to match splits its lines at spaces and trims each
    name, so it would match no image named with one."""
    return "".join("_" if char.isspace() else char for char in file_name)


def frame_name(video: Path, index: int) -> str:
    """The name of frame ``index`` of ``video``: ``clip.mp4_000012.jpg``, named by the
    video's whole file name, so that ``clip.mp4`` and ``clip.mkv`` give names apart."""
    return f"{image_name(video.name)}_{index:06d}.jpg"


def check_names(written: list[tuple[Path, str]]) -> None:
    """Refuse two input files whose images would have one name (``written``: each file
    and the name of its image, or of its first frame)."""
    seen: dict[str, Path] = {}
    for source, name in written:
        if name in seen:
            raise DataError(f"{source}: would be written as {name}, as {seen[name]} is; "
                            "rename one of them")
        seen[name] = source


def source_record(files: tuple[Path, ...]) -> dict[str, dict[str, int]]:
    """What a scene is made from: each file's name, size and mtime in nanoseconds."""
    record = {}
    for path in files:
        stat = path.stat()
        record[path.name] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    return record


class SceneFolder:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @property
    def images(self) -> Path:
        return self.path / "images"

    @property
    def staged_images(self) -> Path:
        return self.path / STAGING_IMAGES

    @property
    def sparse(self) -> Path:
        return self.path / "sparse"

    @property
    def model(self) -> Path:
        return self.sparse / "0"

    @property
    def database(self) -> Path:
        return self.path / DATABASE

    @property
    def manifest(self) -> Path:
        return self.path / MANIFEST

    def _entries(self) -> list[str]:
        if not self.path.is_dir():
            return []
        return sorted(p.name for p in self.path.iterdir() if not p.name.startswith("."))

    def read_manifest(self) -> dict:
        """``prepare.json``, every field ``prepare`` reads checked."""
        try:
            manifest = json.loads(self.manifest.read_text())
        except (OSError, ValueError) as error:
            raise SplatscaleError(f"{self.manifest}: unreadable ({error}); {AFRESH}") from None
        problem = manifest_problem(manifest)
        if problem:
            raise SplatscaleError(f"{self.manifest}: {problem}; {AFRESH}")
        return manifest

    def check(self, settings: dict, sources: dict, overwrite: bool) -> dict | None:
        """Refuse a folder holding anything ``prepare`` did not make, and one made with
        other ``settings`` or from other ``sources`` (a ``source_record``; a manifest
        without one, written before they were recorded, is not compared); the manifest
        of the scene being continued, or None when it starts afresh."""
        entries = self._entries()
        foreign = [name for name in entries if name not in ENTRIES]
        if foreign or (entries and MANIFEST not in entries):
            raise SplatscaleError(
                f"{self.path}: holds {', '.join((foreign or entries)[:4])}, which prepare "
                "did not write; choose a new or empty folder")
        if not entries or overwrite:
            return None
        manifest = self.read_manifest()
        changed = _changed_keys(manifest["settings"], settings)
        if changed:
            raise SplatscaleError(
                f"{self.path}: prepared from {manifest['settings'].get('input')} "
                f"with other settings ({', '.join(changed)}); {AFRESH}")
        if "sources" in manifest:
            self._check_sources(settings["input"], manifest["sources"], sources)
        return manifest

    def _check_sources(self, source: str, recorded: dict, current: dict) -> None:
        changes = ([f"{name} (added)" for name in sorted(current.keys() - recorded.keys())]
                   + [f"{name} (removed)" for name in sorted(recorded.keys() - current.keys())]
                   + [f"{name} (changed)" for name in sorted(current.keys() & recorded.keys())
                      if current[name] != recorded[name]])
        if changes:
            raise SplatscaleError(
                f"{source}: {len(changes)} file{'s' if len(changes) > 1 else ''} added, removed "
                f"or changed since {self.path} was made: {a_few(changes)}; --overwrite "
                "makes the scene again from the files there now")

    def clear(self) -> None:
        """Remove what an earlier ``prepare`` wrote: half-written parts, the images
        ``prepare.json`` names, the model files in ``sparse/0``, the database, and last
        ``prepare.json``, which until then tells a run stopped midway what is prepare's.
        A folder left holding anything else stays, and a notice names what it kept."""
        self.tidy()
        for name in image_names(_read_json(self.manifest)):
            _remove_file(self.images / name)
        for name in MODEL_FILES:
            _remove_file(self.model / name)
        for name in DATABASE_ENTRIES:
            _remove_file(self.path / name)
        for folder in (self.images, self.model, self.sparse):
            _remove_if_empty(folder)
        kept = [str(path.relative_to(self.path)) for folder in (self.images, self.sparse)
                for path in _leaves(folder)]
        if kept:
            notice(f"{self.path}: --overwrite kept what prepare did not write: {a_few(kept)}")
        _remove_file(self.manifest)

    def tidy(self) -> None:
        """Ready the folder for writing: half-written parts removed, and a link where
        prepare keeps a folder removed (not what it leads to, which writing and clearing
        there would reach)."""
        for folder in (self.images, self.sparse, self.model):
            if folder.is_symlink():
                folder.unlink()
        for pattern in PARTIALS:
            for path in self.path.glob(pattern):
                _remove(path)

    def write_manifest(self, manifest: dict) -> None:
        write_json(self.manifest, manifest)

    def publish_images(self, manifest: dict, written: dict) -> None:
        """Move the wholly written ``staged_images`` into ``images/``, over files of the
        same names, and record ``written`` (the manifest's image fields) in ``manifest``.
        So that the manifest names each of prepare's images there at every moment, the
        earlier ones these do not replace are removed while it still names them, and it
        names these before they move."""
        staged = {path.name for path in self.staged_images.iterdir()}
        for name in set(image_names(manifest)) - staged:
            _remove_file(self.images / name)
        manifest.update(written)
        self.write_manifest(manifest)
        _move_files(self.staged_images, self.images, sorted(staged))

    def publish_model(self, reconstruction) -> None:
        """Write the model to ``sparse/0``: whole in a staging folder first, then its
        files moved over an earlier model's, whose files it lacks are removed."""
        staged = self.path / STAGING_MODEL
        staged.mkdir(parents=True)
        reconstruction.write(str(staged))
        written = sorted(path.name for path in staged.iterdir())
        for name in set(MODEL_FILES) - set(written):
            _remove_file(self.model / name)
        _move_files(staged, self.model, written)


def _changed_keys(recorded: dict, current: dict) -> list[str]:
    """The settings that differ, those only one of the two has among them."""
    missing = object()
    return sorted(key for key in recorded.keys() | current.keys()
                  if recorded.get(key, missing) != current.get(key, missing))


def _read_json(path: Path):
    """The JSON in ``path``, or None where it cannot be read."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def image_names(manifest) -> list[str]:
    """The images ``manifest`` names, each once, from those of its image fields that are
    lists of lists of names: clearing reads them from any manifest, one the checks
    refuse too."""
    if not isinstance(manifest, dict):
        return []
    names = (name for field in IMAGE_FIELDS if _is_name_lists(manifest.get(field))
             for group in manifest[field] for name in group)
    return list(dict.fromkeys(names))


def _move_files(source: Path, target: Path, names: list[str]) -> None:
    """Move the files ``names`` from the folder ``source`` into ``target`` (made if
    missing), over any of the same names, then remove ``source``, emptied."""
    target.mkdir(exist_ok=True)
    for name in names:
        os.replace(source / name, target / name)
    source.rmdir()


def _remove_file(path: Path) -> None:
    """Remove the file or link ``path`` (not what a link leads to); a folder stays."""
    if path.is_symlink() or path.is_file():
        path.unlink()


def _remove_if_empty(folder: Path) -> None:
    if folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
        folder.rmdir()


def _leaves(folder: Path) -> list[Path]:
    """What ``folder`` holds, down to its files: files, links and empty folders."""
    if not folder.is_dir() or folder.is_symlink():
        return []
    return sorted(path for path in folder.rglob("*")
                  if path.is_symlink() or not path.is_dir() or not any(path.iterdir()))


def _remove(path: Path) -> None:
    """Remove ``path``: a folder with what it holds, a file or a link (not its target)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.is_symlink() or path.exists():
        path.unlink()


def manifest_problem(manifest) -> str | None:
    """What is wrong with the fields ``prepare`` reads from a manifest, or None."""
    if not isinstance(manifest, dict):
        return "not a JSON object"
    if not isinstance(manifest.get("settings"), dict):
        return "'settings' is not an object"
    return (_images_problem(manifest) or _sources_problem(manifest.get("sources", {}))
            or _agreement_problem(manifest))


def _images_problem(manifest: dict) -> str | None:
    """``cameras`` and ``sequences``, written together once the images are: each a
    list of lists of file names, naming the same images, each once."""
    present = [field for field in IMAGE_FIELDS if field in manifest]
    if len(present) == 1:
        (missing,) = set(IMAGE_FIELDS) - set(present)
        return f"'{missing}' is missing, though '{present[0]}' is there"
    for field in present:
        if not _is_name_lists(manifest[field]):
            return f"'{field}' is not a list of lists of file names"
    cameras, sequences = (sorted(name for group in manifest.get(field, []) for name in group)
                          for field in IMAGE_FIELDS)
    if cameras != sequences or len(set(cameras)) < len(cameras):
        return "'cameras' and 'sequences' do not name the same images, each once"
    return None


def _sources_problem(sources) -> str | None:
    if not (isinstance(sources, dict)
            and all(map(_is_size_and_mtime, sources.keys(), sources.values()))):
        return "'sources' is not an object of file names to their size and mtime_ns"
    return None


def _agreement_problem(manifest: dict) -> str | None:
    """``cameras`` against ``sources``, where both are there: each input file has its
    images (a photo one, a video its frames), and each image its input file."""
    if not {"cameras", "sources"} <= manifest.keys():
        return None
    images = set(image_names(manifest))
    made = {source: _images_of(source, images) for source in manifest["sources"]}
    without = sorted(source for source, found in made.items() if not found)
    if without:
        return f"'cameras' names no image of {a_few(without)} of 'sources'"
    strays = sorted(images.difference(*made.values()))
    if strays:
        return f"'cameras' names {a_few(strays)}, made from nothing in 'sources'"
    return None


def _images_of(source: str, images: set[str]) -> set[str]:
    """Those of ``images`` made from the input file ``source``: a video's frames, or a
    photo's image (named as the photo, or with ".png" added where it was converted)."""
    if Path(source).suffix.lower() in VIDEO_SUFFIXES:
        return {image for image in images
                if (frame := FRAME.fullmatch(image)) and frame[1] == image_name(source)}
    return {image_name(source), image_name(source) + ".png"} & images


def _is_name_lists(value) -> bool:
    return isinstance(value, list) and all(
        isinstance(group, list) and all(map(_is_file_name, group)) for group in value)


def _is_size_and_mtime(name, stat) -> bool:
    """``name: {"size": bytes, "mtime_ns": ns}``, as ``source_record`` writes it."""
    return (_is_file_name(name) and isinstance(stat, dict)
            and stat.keys() == {"size", "mtime_ns"}
            and _is_int(stat["size"]) and stat["size"] >= 0 and _is_int(stat["mtime_ns"]))


def _is_int(value) -> bool:
    return type(value) is int  # not isinstance: True and False are ints too


def _is_file_name(name) -> bool:
    """A name inside one folder: no path separator, not ``.`` or ``..``."""
    return isinstance(name, str) and name not in ("", ".", "..") and not set(name) & set("/\\\0")

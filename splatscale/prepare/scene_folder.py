"""The folder ``prepare`` makes: ``images/``, ``sparse/0/``, ``database.db`` and
``prepare.json``, its record of what it was made from and of what SfM found.

``prepare.json`` is written first, so a folder holding the others without it
was not made by ``prepare`` and is never touched. A folder made from the same
input files (each one's name, size and mtime, as rsync judges change) with the
same settings is continued: its images and the database's features and matches
are reused. Half-written parts are dot-named and cleared before the next run
writes. Clearing removes the entries named here and nothing else, whatever the
folder holds.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from splatscale.atomic import write_json
from splatscale.data.media import a_few
from splatscale.errors import SplatscaleError

MANIFEST = "prepare.json"
DATABASE = "database.db"
DATABASE_ENTRIES = tuple(DATABASE + tail for tail in ("", "-journal", "-wal", "-shm"))  # sqlite's
ENTRIES = ("images", "sparse", *DATABASE_ENTRIES, MANIFEST)
STAGING_IMAGES = ".images.partial"
STAGING_MODEL, OLD_MODEL = "sparse/.0.partial", "sparse/.old.partial"
PARTIALS = (STAGING_IMAGES, STAGING_MODEL, OLD_MODEL)
IMAGE_FIELDS = ("cameras", "sequences")
AFRESH = "--overwrite starts afresh"


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
        if manifest["settings"] != settings:
            changed = sorted(k for k in settings if manifest["settings"].get(k) != settings[k])
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
        """Remove what an earlier ``prepare`` wrote (``ENTRIES``), and half-written
        parts. A link among them is removed, never what it leads to."""
        for name in ENTRIES:
            _remove(self.path / name)
        self.clear_partial()

    def clear_partial(self) -> None:
        for name in PARTIALS:
            _remove(self.path / name)

    def write_manifest(self, manifest: dict) -> None:
        write_json(self.manifest, manifest)

    def publish_images(self, staged: Path) -> None:
        """Put the fully written ``staged`` folder in the place of ``images/``."""
        _remove(self.images)
        staged.rename(self.images)

    def publish_model(self, reconstruction) -> None:
        """Write the model to ``sparse/0``, replacing an earlier one only once it is whole."""
        sparse = self.path / "sparse"
        sparse.mkdir(exist_ok=True)
        staged, old, target = self.path / STAGING_MODEL, self.path / OLD_MODEL, sparse / "0"
        staged.mkdir()
        reconstruction.write(str(staged))
        if target.exists():
            target.rename(old)
        staged.rename(target)
        shutil.rmtree(old, ignore_errors=True)


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
    return _images_problem(manifest) or _sources_problem(manifest.get("sources", {}))


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

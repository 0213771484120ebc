"""The folder ``prepare`` makes: ``images/``, ``sparse/0/``, ``database.db`` and
``prepare.json``, its record of what it was made from and of what SfM found.

``prepare.json`` is written first, so a folder holding the others without it
was not made by ``prepare`` and is never touched. A folder made from the same
input with the same settings is continued: its images and the database's
features and matches are reused. Half-written parts are dot-named and cleared
before the next run writes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from splatscale.atomic import write_json
from splatscale.errors import SplatscaleError

MANIFEST = "prepare.json"
DATABASE = "database.db"
ENTRIES = ("images", "sparse", DATABASE, MANIFEST)
STAGING_IMAGES = ".images.partial"


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
        try:
            return json.loads(self.manifest.read_text())
        except (OSError, ValueError) as error:
            raise SplatscaleError(f"{self.manifest}: unreadable ({error}); --overwrite "
                                  "starts afresh") from None

    def check(self, settings: dict, overwrite: bool) -> dict | None:
        """Refuse a folder holding anything ``prepare`` did not make; the manifest of
        the scene being continued, or None when it starts afresh."""
        entries = self._entries()
        foreign = [name for name in entries if name not in ENTRIES
                   and not name.startswith(DATABASE)]  # sqlite's -journal, -wal
        if foreign or (entries and MANIFEST not in entries):
            raise SplatscaleError(
                f"{self.path}: holds {', '.join((foreign or entries)[:4])}, which prepare "
                "did not write; choose a new or empty folder")
        if not entries or overwrite:
            return None
        manifest = self.read_manifest()
        if manifest.get("settings") != settings:
            changed = sorted(k for k in settings if manifest.get("settings", {}).get(k)
                             != settings[k])
            raise SplatscaleError(
                f"{self.path}: prepared from {manifest.get('settings', {}).get('input')} "
                f"with other settings ({', '.join(changed)}); --overwrite starts afresh")
        return manifest

    def clear(self) -> None:
        """Remove what an earlier ``prepare`` wrote, and half-written parts."""
        for name in self._entries():
            target = self.path / name
            shutil.rmtree(target) if target.is_dir() else target.unlink()
        self.clear_partial()

    def clear_partial(self) -> None:
        for partial in (*self.path.glob(".*.partial"), *self.path.glob("sparse/.*.partial")):
            shutil.rmtree(partial)

    def write_manifest(self, manifest: dict) -> None:
        write_json(self.manifest, manifest)

    def publish_images(self, staged: Path) -> None:
        """Put the fully written ``staged`` folder in the place of ``images/``."""
        if self.images.exists():
            shutil.rmtree(self.images)
        staged.rename(self.images)

    def publish_model(self, reconstruction) -> None:
        """Write the model to ``sparse/0``, replacing an earlier one only once it is whole."""
        sparse = self.path / "sparse"
        sparse.mkdir(exist_ok=True)
        staged, old, target = sparse / ".0.partial", sparse / ".old.partial", sparse / "0"
        staged.mkdir()
        reconstruction.write(str(staged))
        if target.exists():
            target.rename(old)
        staged.rename(target)
        shutil.rmtree(old, ignore_errors=True)

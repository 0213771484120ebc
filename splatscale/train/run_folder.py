"""The output folder of a training run: what may be written there, and when.

A folder holding a previous run is only replaced when asked (``--overwrite``)
or continued (``--resume``); one run at a time writes there (a lock file
naming the process); nothing in it changes before ``begin``, which the run
calls once every input has been checked; then temporaries left by a killed run
are removed and, on resume, ``metrics.jsonl`` is cut back to the checkpoint, so
no step is logged twice.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from splatscale.atomic import atomic_path
from splatscale.errors import SplatscaleError
from splatscale.folder_lock import locked_folder
from splatscale.train.checkpoint import is_shard_of
from splatscale.train.render_folder import RenderFolder

CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"
# What a training run writes; their presence marks a folder as holding a run.
RUN_FILES = ("config.json", METRICS, CHECKPOINT, "point_cloud.ply", "report.json")
# The models saved on the way (--save-at), exactly as named: a user's
# point_cloud_best.ply is not the run's.
SAVED_MODEL = re.compile(r"point_cloud_\d+\.ply")
RENDERS = "renders"  # its folders of renders hold what their renders.json lists
TEMPORARY = re.compile(r"\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp")  # tempfile.mkstemp's names


class RunFolder:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @property
    def checkpoint(self) -> Path:
        return self.path / CHECKPOINT

    @property
    def metrics(self) -> Path:
        return self.path / METRICS

    def previous_run(self) -> list[str]:
        """The names of an earlier run's files in the folder (``renders`` for its
        renders)."""
        if not self.path.is_dir():
            return []
        names = [name for name in RUN_FILES if os.path.lexists(self.path / name)]
        if self._render_folders():
            names.append(RENDERS)
        return names + sorted(p.name for p in self.path.iterdir() if self._run_named(p.name))

    def _run_named(self, name: str) -> bool:
        """Whether ``name`` is one the run gives a model on the way, or a shard."""
        return bool(SAVED_MODEL.fullmatch(name)) or is_shard_of(self.checkpoint, name)

    def _render_folders(self) -> list[RenderFolder]:
        """The folders of renders under ``renders/`` (each with its renders.json)."""
        renders = self.path / RENDERS
        if not renders.is_dir() or renders.is_symlink():
            return []
        return [RenderFolder(p) for p in sorted(renders.iterdir())
                if p.is_dir() and not p.is_symlink() and RenderFolder(p).manifest.is_file()]

    def check(self, resume: bool, overwrite: bool) -> None:
        """Refuse, before anything is written, what would damage the folder's contents."""
        if resume and overwrite:
            raise SplatscaleError("--resume and --overwrite: choose one")
        linked = [name for name in (*RUN_FILES, RENDERS) if (self.path / name).is_symlink()]
        if linked:
            raise SplatscaleError(f"{self.path / linked[0]}: a link, where the run writes its "
                                  "own; remove it or choose another folder")
        previous = self.previous_run()
        if resume and not self.checkpoint.is_file():
            if previous:
                raise SplatscaleError(f"{self.path}: its run stopped before its first "
                                      "checkpoint, so there is nothing to resume; "
                                      "--overwrite starts it again")
            raise SplatscaleError(f"{self.checkpoint}: nothing to resume from (no run there)")
        if previous and not (resume or overwrite):
            ways = ("--resume continues it, --overwrite replaces it"
                    if self.checkpoint.is_file() else
                    "it stopped before its first checkpoint; --overwrite replaces it")
            raise SplatscaleError(
                f"{self.path}: holds a previous run ({', '.join(previous[:4])}); {ways}")

    def lock(self):
        """Hold the folder's lock while the run checks its inputs and writes
        (``folder_lock.locked_folder``)."""
        return locked_folder(self.path)

    def begin(self, resume_at: int | None) -> None:
        """The run has passed every check: from here it writes. Remove a killed run's
        half-written files, then cut the log back to the checkpoint resumed at image
        ``resume_at``, or (a new run) remove an earlier run's files."""
        self._remove_temporaries()
        if resume_at is None:
            self.clear_previous_run()
        else:
            self.truncate_metrics(resume_at)

    def _remove_temporaries(self) -> None:
        """Half-written files of a killed run: ``atomic_path``'s ``.NAME.XXXXXXXX.tmp``
        for the run's own files (a user's files of that shape stay)."""
        for stale in self.path.rglob(".*.tmp"):
            written = TEMPORARY.fullmatch(stale.name)
            if written and self._writes(stale.parent / written["name"]):
                stale.unlink(missing_ok=True)

    def _writes(self, path: Path) -> bool:
        """Whether a run writes ``path``: one of its files, or a render of its own."""
        relative = path.relative_to(self.path)
        if len(relative.parts) == 1:
            return relative.name in RUN_FILES or self._run_named(relative.name)
        return relative.parts[0] == RENDERS and relative.suffix in (".png", ".json")

    def clear_previous_run(self) -> None:
        """Remove an earlier run's files (``--overwrite``): its own files, and the renders
        its folders of renders list; other files stay, and the folders holding them."""
        for name in self.previous_run():
            if name != RENDERS:
                (self.path / name).unlink()
        for folder in self._render_folders():
            folder.clear()
        _remove_empty_folders(self.path / RENDERS)

    def truncate_metrics(self, images_seen: int) -> None:
        """Drop the log lines written after the checkpoint being resumed."""
        if not self.metrics.is_file():
            return
        kept = [line for line in self.metrics.read_text(errors="replace").splitlines()
                if _logged_by(line, images_seen)]
        with atomic_path(self.metrics) as tmp:
            tmp.write_text("".join(line + "\n" for line in kept))



def _remove_empty_folders(top: Path) -> None:
    """``top`` and the folders below it that hold nothing, deepest first."""
    if not top.is_dir() or top.is_symlink():
        return
    for folder in sorted((p for p in top.rglob("*") if p.is_dir() and not p.is_symlink()),
                         key=lambda p: len(p.parts), reverse=True) + [top]:
        try:
            folder.rmdir()
        except OSError:  # it holds a file that is not the run's
            pass


def _logged_by(line: str, images_seen: int) -> bool:
    """Whether the log ``line`` is an entry of the run up to image ``images_seen``: a
    line torn by a kill, or one that is not an entry, is not."""
    try:
        entry = json.loads(line)
    except ValueError:
        return False
    return (isinstance(entry, dict) and type(entry.get("images")) is int
            and entry["images"] <= images_seen)

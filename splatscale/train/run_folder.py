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
import re
import shutil
from fnmatch import fnmatch
from pathlib import Path

from splatscale.atomic import atomic_path
from splatscale.errors import SplatscaleError
from splatscale.folder_lock import locked_folder

CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"
# What a training run writes; their presence marks a folder as holding a run.
RUN_FILES = ("config.json", METRICS, CHECKPOINT, "point_cloud.ply", "report.json")
RUN_GLOBS = ("point_cloud_*.ply", CHECKPOINT + ".*.rank*")  # the models saved on the way, shards
RUN_FOLDERS = ("renders",)
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
        """The names of an earlier run's files in the folder."""
        if not self.path.is_dir():
            return []
        names = [name for name in RUN_FILES + RUN_FOLDERS if (self.path / name).exists()]
        return names + sorted(p.name for g in RUN_GLOBS for p in self.path.glob(g))

    def check(self, resume: bool, overwrite: bool) -> None:
        """Refuse, before anything is written, what would damage the folder's contents."""
        if resume and overwrite:
            raise SplatscaleError("--resume and --overwrite: choose one")
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
            return (relative.name in RUN_FILES
                    or any(fnmatch(relative.name, glob) for glob in RUN_GLOBS))
        return relative.parts[0] in RUN_FOLDERS and relative.suffix == ".png"

    def clear_previous_run(self) -> None:
        """Remove an earlier run's files (``--overwrite``); other files stay."""
        for name in self.previous_run():
            target = self.path / name
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink()

    def truncate_metrics(self, images_seen: int) -> None:
        """Drop the log lines written after the checkpoint being resumed."""
        if not self.metrics.is_file():
            return
        kept = []
        for line in self.metrics.read_text().splitlines():
            try:
                if json.loads(line).get("images", 0) <= images_seen:
                    kept.append(line)
            except json.JSONDecodeError:  # a line torn by a kill
                continue
        with atomic_path(self.metrics) as tmp:
            tmp.write_text("".join(line + "\n" for line in kept))


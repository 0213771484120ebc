"""What a run folder remembers of its run: ``config.json``, written before the run's
first step, holds its settings and the scene it trained on, read as it was read.

Every command given a run's model (the run folder, or a PLY inside it) reads the
scene as the run did unless its flags say otherwise, and ``train --resume``
continues with all of it. Each field is checked as it is read: a bad one is refused
in one line naming the file and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from splatscale.errors import DataError

RECORD = "config.json"
MODEL = "point_cloud.ply"


@dataclass(frozen=True)
class RunRecord:
    """The scene a run trained on and how it was read."""

    path: Path                    # the config.json it was read from
    data: str | None              # the scene's folder; None: the built-in demo scene
    resolution: int
    max_width: int | None
    max_pixels: int | None
    eval: bool                    # every 8th view held out for testing
    white_background: bool
    masks: str | None = None      # as TrainConfig's: the masks it trained with
    alpha_mask: bool = False
    invert_masks: bool = False
    skip_missing_masks: bool = False

    @property
    def masked(self) -> bool:
        return self.masks is not None or self.alpha_mask


# Each field of a record, what it may be, and its value when absent (None: required).
FIELDS: dict[str, tuple[Callable[[object], bool], str, object]] = {
    "data": (lambda v: v is None or (isinstance(v, str) and v != ""),
             "a path or null", None),
    "resolution": (lambda v: v in (1, 2, 4, 8) and type(v) is int, "1, 2, 4 or 8", 1),
    "max_width": (lambda v: v is None or (type(v) is int and v >= 16),
                  "null or an integer of at least 16", None),
    "max_pixels": (lambda v: v is None or (type(v) is int and v >= 256),
                   "null or an integer of at least 256", None),
    "eval": (lambda v: isinstance(v, bool), "true or false", False),
    "white_background": (lambda v: isinstance(v, bool), "true or false", False),
    "masks": (lambda v: v is None or isinstance(v, str), "a path, \"\" or null", None),
    "alpha_mask": (lambda v: isinstance(v, bool), "true or false", False),
    "invert_masks": (lambda v: isinstance(v, bool), "true or false", False),
    "skip_missing_masks": (lambda v: isinstance(v, bool), "true or false", False),
}


def read_record(path: Path) -> RunRecord:
    """The record in ``path`` (a run's config.json), every field checked."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as error:  # UnicodeDecodeError is a ValueError
        raise DataError(f"{path}: not a run's config.json ({error})") from None
    if not isinstance(record, dict):
        raise DataError(f"{path}: not a run's config.json (not a JSON object)")
    if "data" not in record:
        raise DataError(f"{path}: not a run's config.json (it names no scene: no 'data')")
    values = {}
    for name, (fits, expected, absent) in FIELDS.items():
        value = record.get(name, absent)
        if not fits(value):
            raise DataError(f"{path}: {name} must be {expected}, not {value!r}")
        values[name] = value
    return RunRecord(path, **values)


def run_record(folder: Path) -> RunRecord | None:
    """The record of the run in ``folder``, or None when it holds none."""
    path = folder / RECORD
    return read_record(path) if path.is_file() else None


def model_of(target: Path) -> tuple[Path, RunRecord | None]:
    """The PLY that ``target`` names (a PLY, or a run folder's point_cloud.ply) and
    the record of the run it belongs to (None for a PLY outside a run folder)."""
    if target.is_dir():
        model = target / MODEL
        if not model.is_file():
            raise DataError(f"{target}: a folder without {MODEL} (a finished run's model); "
                            "name a PLY, or a run folder")
        return model, run_record(target)
    if not target.is_file():
        raise DataError(f"{target}: no such file or folder")
    return target, run_record(target.parent)

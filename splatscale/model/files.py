"""A model file of any format we read, told by its name: .splat (antimatter15's rows),
.spz (Niantic's), anything else a PLY."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np

from splatscale.model.gaussians import GaussianModel
from splatscale.model.ply import read_ply, read_splat, recorded_up
from splatscale.model.spz import read_spz


class ModelFile(NamedTuple):
    model: GaussianModel
    up: np.ndarray | None  # the world's up direction, where the file records it (our PLYs)


OTHER_FORMATS = {".splat": read_splat, ".spz": read_spz}


def is_ply(path: Path) -> bool:
    """Whether ``path`` is read as a PLY (any name but the other formats')."""
    return path.suffix.lower() not in OTHER_FORMATS


def read_model(path: Path) -> ModelFile:
    read = OTHER_FORMATS.get(path.suffix.lower())
    if read is not None:
        return ModelFile(read(path), None)
    return ModelFile(read_ply(path), recorded_up(path))

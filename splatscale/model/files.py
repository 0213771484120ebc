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


def read_model(path: Path) -> ModelFile:
    suffix = path.suffix.lower()
    if suffix == ".splat":
        return ModelFile(read_splat(path), None)
    if suffix == ".spz":
        return ModelFile(read_spz(path), None)
    return ModelFile(read_ply(path), recorded_up(path))

"""Checkpoints: everything needed to continue a run bit for bit, written atomically."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from splatscale.atomic import atomic_path
from splatscale.errors import DataError

FORMAT = 1


def save_checkpoint(path: Path, trainer_state: dict, engine_state: dict) -> None:
    state = {"format": FORMAT, "trainer": trainer_state, "engine": engine_state,
             "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                     "python": random.getstate()}}
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def load_checkpoint(path: Path) -> tuple[dict, dict]:
    """(trainer state, engine state); restores the global RNGs."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except (OSError, RuntimeError, EOFError) as error:
        raise DataError(f"{path}: not a readable checkpoint ({error})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise DataError(f"{path}: not a splatscale checkpoint of format {FORMAT}")
    torch.set_rng_state(state["rng"]["torch"])
    np.random.set_state(state["rng"]["numpy"])
    random.setstate(state["rng"]["python"])
    return state["trainer"], state["engine"]

"""Checkpoints: everything needed to continue a run bit for bit, written atomically."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from splatscale.atomic import atomic_path
from splatscale.errors import DataError

FORMAT = 2  # 2: the trainer state holds the scene's fingerprint
KEYS = {"trainer": ("images_seen", "steps", "sh_degree", "train_seconds", "order", "queue",
                    "config", "scene", "eval_split"),
        "rng": ("torch", "numpy", "python")}


def save_checkpoint(path: Path, trainer_state: dict, engine_state: dict) -> None:
    state = {"format": FORMAT, "trainer": trainer_state, "engine": engine_state,
             "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                     "python": random.getstate()}}
    # Through a file object, a full disk is an OSError (a path gives torch's RuntimeError).
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        torch.save(state, handle)


def load_checkpoint(path: Path) -> tuple[dict, dict]:
    """(trainer state, engine state); restores the global RNGs."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:  # garbage gives UnpicklingError, EOFError, RuntimeError...
        raise DataError(f"{path}: not a readable checkpoint ({type(error).__name__})") from None
    if not isinstance(state, dict) or "format" not in state:
        raise DataError(f"{path}: not a splatscale checkpoint")
    if state["format"] != FORMAT:
        raise DataError(f"{path}: a checkpoint of format {state['format']}, this version "
                        f"reads format {FORMAT}")
    for part, keys in KEYS.items():
        if not isinstance(state.get(part), dict) or not all(k in state[part] for k in keys):
            raise DataError(f"{path}: not a splatscale checkpoint (its {part} state is incomplete)")
    torch.set_rng_state(state["rng"]["torch"])
    np.random.set_state(state["rng"]["numpy"])
    random.setstate(state["rng"]["python"])
    return state["trainer"], state["engine"]

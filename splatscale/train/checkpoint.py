"""Checkpoints: everything needed to continue a run bit for bit, written atomically.

A single process writes one file. Ranks each write their shard of the engine
state to a file of their own (named by the images seen and the rank), then
rank 0 writes ``checkpoint.pt``, naming the shards, last: a kill before that
leaves the previous checkpoint and its shards whole. No rank holds the whole
model to save or to resume, and a checkpoint resumes at any number of ranks:
each reads the rows of its even share from whichever shards hold them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
import random
import re
from pathlib import Path

import numpy as np
import torch

from splatscale.atomic import atomic_path
from splatscale.engine.distributed import collectives
from splatscale.engine.state import (EngineState, concat_states, shard_rows, state_problem,
                                     state_rows, state_size)
from splatscale.errors import DataError
from splatscale.model.gaussians import MAX_SH_DEGREE
from splatscale.step import appearance
from splatscale.train.config import TrainConfig

FORMAT = 2  # 2: the trainer state holds the scene's fingerprint
KEYS = {"trainer": ("images_seen", "steps", "sh_degree", "train_seconds", "order", "queue",
                    "config", "scene", "eval_split"),
        "rng": ("torch", "numpy", "python")}


def _save(state: Mapping[str, object], path: Path) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        try:
            torch.save(state, handle)
        except RuntimeError as error:
            # torch's writer reports a failed write (a full disk) as its own error.
            if isinstance(error.__context__, OSError):
                raise error.__context__ from None
            raise


def save_checkpoint(path: Path, trainer_state: dict, engine_state: EngineState,
                    shard: tuple[int, int] = (0, 1), writes: bool = True) -> None:
    """Save; called by every rank, ``shard`` = (rank, world) of ``engine_state``'s part."""
    rank, world = shard
    # One rank's state is written beside the checkpoint, which holds their manifest.
    saved: Mapping[str, object] = engine_state
    manifest: dict = {}
    if world > 1:
        saved = manifest = _save_shard(path, engine_state, rank, world,
                                       trainer_state["images_seen"])
    if writes:
        _save({"format": FORMAT, "trainer": trainer_state, "engine": saved,
               "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                       "python": random.getstate()}}, path)
        kept = set(manifest.get("shards", []))
        for stale in path.parent.iterdir():
            if stale.name not in kept and is_shard_of(path, stale.name):
                stale.unlink(missing_ok=True)


# A shard's name after its checkpoint's: the images seen and the rank, as _save_shard
# writes it (a user's checkpoint.pt.backup is not one).
SHARD_SUFFIX = re.compile(r"\.\d{9}\.rank\d+-of-\d+")


def is_shard_of(checkpoint: Path, name: str) -> bool:
    """Whether the file ``name`` is a shard that ``checkpoint``'s writer wrote."""
    return (name.startswith(checkpoint.name)
            and bool(SHARD_SUFFIX.fullmatch(name[len(checkpoint.name):])))


def _save_shard(path: Path, state: EngineState, rank: int, world: int, images: int) -> dict:
    """Write this rank's part; return what the manifest says of all parts."""
    name = f"{path.name}.{images:09d}.rank{rank}-of-{world}"
    _save(state, path.parent / name)
    counts = torch.zeros(world, dtype=torch.int64)
    counts[rank] = state_size(state)
    collectives.all_reduce(counts)  # also a barrier: every shard is written after it
    return {"shards": [f"{path.name}.{images:09d}.rank{r}-of-{world}" for r in range(world)],
            "counts": counts.tolist()}


def _read_share(path: Path, manifest: dict, rank: int, world: int) -> EngineState:
    """Rows ``rank`` of ``world`` (an even split) read from the shards holding them."""
    share = shard_rows(sum(manifest["counts"]), rank, world)
    lo, hi = share.start, share.stop
    parts, start = [], 0
    for name, count in zip(manifest["shards"], manifest["counts"]):
        if start < hi and start + count > lo:
            try:
                state = torch.load(path.parent / name, map_location="cpu", weights_only=False,
                                   mmap=True)
            except Exception as error:  # noqa: BLE001 - missing or torn: the user's to know
                raise DataError(f"{path.parent / name}: a shard of {path} is unreadable "
                                f"({type(error).__name__})") from None
            _check_engine_state(state, path.parent / name)
            if state_size(state) != count:
                raise DataError(f"{path.parent / name}: holds {state_size(state)} Gaussians; "
                                f"{path} says {count}")
            parts.append(state_rows(state, slice(max(lo - start, 0), min(hi - start, count))))
        start += count
    return concat_states(parts)


def load_trainer_state(path: Path) -> dict:
    """The trainer's part alone (the run's settings and progress)."""
    return _read_manifest(path)["trainer"]


def load_checkpoint(path: Path, shard: tuple[int, int] = (0, 1)
                    ) -> tuple[dict, EngineState]:
    """(trainer state, engine state of part ``shard`` = (rank, world)); restores the
    global RNGs. Saved by any number of ranks, read by any number."""
    state = _read_manifest(path)
    torch.set_rng_state(state["rng"]["torch"])
    np.random.set_state(state["rng"]["numpy"])
    random.setstate(state["rng"]["python"])
    engine, (rank, world) = state["engine"], shard
    if "shards" in engine:
        return state["trainer"], _read_share(path, engine, rank, world)
    if world > 1:
        engine = state_rows(engine, shard_rows(state_size(engine), rank, world))
    return state["trainer"], engine


def _read_manifest(path: Path) -> dict:
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:  # garbage gives UnpicklingError, EOFError, RuntimeError...
        raise DataError(f"{path}: not a readable checkpoint ({type(error).__name__})") from None
    if not isinstance(state, dict) or "format" not in state:
        raise DataError(f"{path}: not a splatscale checkpoint")
    if type(state["format"]) is not int:
        raise DataError(f"{path}: not a splatscale checkpoint (its format is "
                        f"{state['format']!r}, not a format number)")
    if state["format"] != FORMAT:
        raise DataError(f"{path}: a checkpoint of format {state['format']}, this version "
                        f"reads format {FORMAT}")
    for part, keys in KEYS.items():
        if not isinstance(state.get(part), dict) or not all(k in state[part] for k in keys):
            raise DataError(f"{path}: not a splatscale checkpoint (its {part} state is incomplete)")
    _check_trainer_state(state["trainer"], path)
    _check_rng_state(state["rng"], path)
    _check_engine_manifest(state.get("engine"), path)
    return state


def _count(value) -> bool:
    return type(value) is int and value >= 0


# What each field of the trainer's state must be.
TRAINER_FIELDS = {
    "images_seen": (_count, "a count of images"),
    "steps": (_count, "a count of steps"),
    "sh_degree": (lambda v: type(v) is int and 0 <= v <= MAX_SH_DEGREE, "an SH degree, 0 to 3"),
    "train_seconds": (lambda v: type(v) in (int, float) and 0 <= v < math.inf,
                      "a number of seconds"),
    "order": (lambda v: _restores(lambda: torch.Generator().set_state(v)),
              "a random generator's state"),
    "queue": (lambda v: isinstance(v, list) and all(_count(i) for i in v), "a list of views"),
    "scene": (lambda v: isinstance(v, str), "a scene's fingerprint"),
    "eval_split": (lambda v: isinstance(v, bool), "true or false"),
}


# The random generators a checkpoint restores, each tried on a generator of its kind.
RNG_RESTORES = {"torch": lambda v: torch.Generator().set_state(v),
                "numpy": lambda v: np.random.RandomState().set_state(v),
                "python": lambda v: random.Random().setstate(v)}


def _restores(restore) -> bool:
    """Whether ``restore()`` takes its state without complaint."""
    try:
        restore()
    except Exception:  # noqa: BLE001 - each library says "wrong state" its own way
        return False
    return True


def _check_trainer_state(trainer: dict, path: Path) -> None:
    """Each field of the trainer's state, its type and range, named if it is wrong."""
    for name, (fits, expected) in TRAINER_FIELDS.items():
        if not fits(trainer[name]):
            raise DataError(f"{path}: its {name} must be {expected}, not "
                            f"{_shown(trainer[name])}")
    config = TrainConfig.from_dict(trainer["config"], f"{path}: config")
    _check_appearance(trainer, config, path)
    if trainer["images_seen"] != trainer["steps"] * config.batch_size:
        raise DataError(f"{path}: its images_seen ({trainer['images_seen']}) is not its "
                        f"steps ({trainer['steps']}) times its batch size "
                        f"({config.batch_size})")


def _check_appearance(trainer: dict, config: TrainConfig, path: Path) -> None:
    """The colour transforms and their Adam: present exactly when the run trains them
    (a checkpoint without them is of a run without them), and well formed."""
    held = "appearance" in trainer
    if held != (config.appearance != "none"):
        raise DataError(f"{path}: its config's appearance is {config.appearance!r}, but it "
                        f"{'holds' if held else 'lacks'} colour transforms")
    problem = appearance.state_problem(trainer["appearance"]) if held else None
    if problem is not None:
        raise DataError(f"{path}: its appearance state is malformed ({problem})")


def _check_rng_state(rng: dict, path: Path) -> None:
    for name, restore in RNG_RESTORES.items():
        if not _restores(lambda: restore(rng[name])):
            raise DataError(f"{path}: its {name} random state is not one")


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"a {type(value).__name__}"


def _check_engine_manifest(engine, path: Path) -> None:
    """The engine state, or the list of the shards that hold it."""
    if isinstance(engine, dict) and "shards" in engine:
        shards, counts = engine["shards"], engine.get("counts")
        if not (isinstance(shards, list) and isinstance(counts, list)
                and len(shards) == len(counts) > 0 and all(map(_count, counts))
                and all(isinstance(n, str) and Path(n).name == n
                        and n.startswith(f"{path.name}.") for n in shards)):
            raise DataError(f"{path}: not a splatscale checkpoint (its list of shards is "
                            "malformed)")
        return
    _check_engine_state(engine, path)


def _check_engine_state(state, path: Path) -> None:
    problem = state_problem(state)
    if problem is not None:
        raise DataError(f"{path}: not a splatscale checkpoint ({problem})")

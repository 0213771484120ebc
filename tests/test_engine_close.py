"""A run shuts down what it starts: however ``Trainer.run`` ends (finished,
interrupted, diverged), the engine is closed and no thread of its is left, and the
results are those of an engine without threads."""

from __future__ import annotations

import os
import signal
import threading
from functools import partial
from pathlib import Path

import pytest
from tqdm import tqdm

from splatscale.engine.factory import OffloadOptions, make_engine
from splatscale.errors import DataError, Interrupted, TrainingDiverged
from tests.test_training import SHORT, make_trainer

# The host update in a worker thread.
FORWARDING = partial(make_engine, offload=OffloadOptions(forwarding=True))
STOP_AFTER = 3  # steps


def new_threads(before: set[threading.Thread]) -> list[str]:
    """The threads alive that were not in ``before``, but tqdm's monitor (a daemon,
    one per process, which tqdm keeps for every bar)."""
    return [thread.name for thread in threading.enumerate()
            if thread not in before and thread is not tqdm.monitor]


def trainer_of(folder: Path, engine_factory):
    trainer = make_trainer(folder, make_engine=engine_factory, **SHORT)
    trainer.options.output.mkdir(parents=True)
    return trainer


def test_a_finished_run_leaves_no_thread_and_the_same_model(tmp_path):
    before = set(threading.enumerate())
    forwarded = trainer_of(tmp_path / "forwarding", FORWARDING)
    report = forwarded.run()
    assert new_threads(before) == []
    local = trainer_of(tmp_path / "local", make_engine)
    expected = local.run()
    for name in ("num_gaussians", "iterations", "steps"):
        assert report[name] == expected[name]
    model = "point_cloud.ply"
    assert (forwarded.options.output / model).read_bytes() == \
        (local.options.output / model).read_bytes()


def stop_after(trainer, steps: int, stop) -> None:
    """``stop(trainer)`` once the run has made ``steps`` steps."""
    step = trainer.train_step

    def then_stop() -> dict:
        entry = step()
        if trainer.steps == steps:
            stop(trainer)
        return entry
    trainer.train_step = then_stop


def ctrl_c(trainer) -> None:
    os.kill(os.getpid(), signal.SIGINT)


def diverge(trainer) -> None:
    trainer.config.feature_lr = float("inf")  # colours become infinite, then the loss NaN


@pytest.mark.parametrize("stop, ending", [(ctrl_c, Interrupted), (diverge, TrainingDiverged)])
def test_a_stopped_run_leaves_no_thread(tmp_path, stop, ending):
    before = set(threading.enumerate())
    trainer = trainer_of(tmp_path, FORWARDING)
    stop_after(trainer, STOP_AFTER, stop)
    with pytest.raises(ending):
        trainer.run()
    assert new_threads(before) == []


def test_a_run_refused_after_its_engine_was_made_leaves_no_thread(tmp_path):
    """The worker starts with the first step's update: a refusal comes before it."""
    before = set(threading.enumerate())
    trainer = make_trainer(tmp_path, make_engine=FORWARDING, **SHORT)
    (tmp_path / "checkpoint.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(DataError):
        trainer.resume(tmp_path / "checkpoint.pt")
    assert new_threads(before) == []

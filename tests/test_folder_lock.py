"""One writer per folder, also when two processes take over a dead writer's lock at
the same moment."""

from __future__ import annotations

import multiprocessing
import os
import socket
import subprocess
import time
from pathlib import Path

from splatscale.errors import SplatscaleError
from splatscale.folder_lock import LOCK_NAME, locked_folder
from tests.conftest import HANG_GUARD

RACES = 12


def dead_pid() -> int:
    finished = subprocess.Popen(["true"])
    finished.wait()
    return finished.pid


def hold(folder: str, start, held) -> None:
    """Take the folder's lock as soon as the other racer is ready; while it is held,
    record the moments it was held between."""
    start.wait(timeout=HANG_GUARD)
    try:
        with locked_folder(Path(folder)):
            began = time.monotonic()
            time.sleep(0.05)
            held.put((began, time.monotonic()))
    except SplatscaleError:
        held.put(None)


def test_two_takeovers_at_once_never_both_hold_the_lock(tmp_path):
    context = multiprocessing.get_context("fork")
    for race in range(RACES):
        folder = tmp_path / f"race{race}"
        folder.mkdir()
        (folder / LOCK_NAME).write_text(f"{dead_pid()} {socket.gethostname()}\n")
        start, held = context.Barrier(2), context.Queue()
        racers = [context.Process(target=hold, args=(str(folder), start, held))
                  for _ in range(2)]
        for racer in racers:
            racer.start()
        spans = [held.get(timeout=HANG_GUARD) for _ in racers]
        for racer in racers:
            racer.join(timeout=HANG_GUARD)
        taken = sorted(span for span in spans if span is not None)
        assert taken, "one of them takes the lock"
        if len(taken) == 2:  # one after the other, never both at once
            assert taken[0][1] <= taken[1][0], taken
        assert not (folder / LOCK_NAME).exists()


def test_a_lock_held_by_a_running_process_is_refused_and_kept(tmp_path):
    (tmp_path / LOCK_NAME).write_text(f"{os.getpid()} {socket.gethostname()}\n")
    try:
        with locked_folder(tmp_path):
            raise AssertionError("taken from a live process")
    except SplatscaleError as refusal:
        assert f"process {os.getpid()}" in str(refusal)
    assert (tmp_path / LOCK_NAME).read_text().split()[0] == str(os.getpid())

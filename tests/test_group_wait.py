"""Ranks waiting for one rank's long work (a machine's first compile): they wait as
long as it takes, yet a rank that dies meanwhile still stops them."""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from splatscale.errors import lost_peer
from splatscale.launch import group
from tests.conftest import HANG_GUARD
from tests.test_stop_signals import free_port

# Seconds. Long enough that a busy machine answers each collective within it; the
# slow work outlasts it.
COLLECTIVE_TIMEOUT = 4.0
SLOW = 2.5 * COLLECTIVE_TIMEOUT


class Work:
    """Work that ends ``seconds`` after it began; its result is ``result``."""

    def __init__(self, seconds: float, result: list[int]) -> None:
        self.end, self.result, self.called = time.monotonic() + seconds, result, False

    def done(self) -> bool:
        return time.monotonic() >= self.end

    def __call__(self) -> list[int]:
        self.called = True
        time.sleep(max(0.0, self.end - time.monotonic()))
        return self.result


def rank_waits(rank: int, world: int, port: int, wait: str, out: str) -> None:
    """Rank 0's work is slow; the outcome of ``group``'s ``wait`` on each rank is
    written to ``out``/rank. With ``wait == "rank 1 dies"``, rank 1 exits instead,
    while rank 0 waits."""
    group.TIMEOUT = timedelta(seconds=COLLECTIVE_TIMEOUT)
    ranks = group.Membership(rank, world, rank, world, "127.0.0.1", port)
    group.join(ranks)
    work = Work(SLOW if rank == 0 else 0.0, [rank])
    if wait == "rank 1 dies" and rank == 1:
        time.sleep(COLLECTIVE_TIMEOUT / 2)
        os._exit(1)
    try:
        waited = group.agreed if wait == "agreed" else group.agreed_when_done
        outcome = {"result": waited(work, ranks)}
    except Exception as error:  # noqa: BLE001 - the outcome is the test's verdict
        outcome = {"lost_peer": lost_peer(error), "waited_for_its_work": work.called}
    Path(out, str(rank)).write_text(json.dumps(outcome))
    group.leave()


def outcomes(tmp_path: Path, wait: str) -> dict[int, dict]:
    """Each rank's outcome; every rank ends by itself (none is stopped for another)."""
    context = mp.start_processes(rank_waits, args=(2, free_port(), wait, str(tmp_path)),
                                 nprocs=2, join=False, start_method="spawn")
    for process in context.processes:
        process.join(HANG_GUARD)
    return {rank: json.loads((tmp_path / str(rank)).read_text())
            for rank in range(2) if (tmp_path / str(rank)).exists()}


def test_ranks_wait_for_work_longer_than_a_collective_timeout(tmp_path):
    assert outcomes(tmp_path, "agreed_when_done") == {0: {"result": [0]}, 1: {"result": [1]}}


@pytest.mark.slow
def test_a_plain_agreement_would_have_given_up(tmp_path):
    """The premise of the waiting: without it the waiting rank's collective times out."""
    assert outcomes(tmp_path, "agreed")[1] == {"lost_peer": True, "waited_for_its_work": True}


def test_a_rank_that_dies_stops_a_rank_whose_work_is_under_way(tmp_path):
    """Rank 0 stops as its peer dies, without waiting for its own work to end."""
    assert outcomes(tmp_path, "rank 1 dies") == {
        0: {"lost_peer": True, "waited_for_its_work": False}}

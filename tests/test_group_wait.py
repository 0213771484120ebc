"""Ranks waiting for one rank's long work (a machine's first compile): they wait as
long as it takes, yet a rank that dies meanwhile still stops them."""

from __future__ import annotations

import json
import os
import socket
import time
from datetime import timedelta
from pathlib import Path

import torch.multiprocessing as mp

from splatscale.errors import lost_peer
from splatscale.launch import group
from tests.conftest import HANG_GUARD

COLLECTIVE_TIMEOUT = 2.0  # seconds: the work below outlasts it several times
SLOW = 3 * COLLECTIVE_TIMEOUT


class Work:
    """Work that ends ``seconds`` after it began; its result is ``result``."""

    def __init__(self, seconds: float, result: list[int]) -> None:
        self.end, self.result = time.monotonic() + seconds, result

    def done(self) -> bool:
        return time.monotonic() >= self.end

    def __call__(self) -> list[int]:
        time.sleep(max(0.0, self.end - time.monotonic()))
        return self.result


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rank_waits(rank: int, world: int, port: int, wait: str, out: str) -> None:
    """Rank 0's work is slow (in ``wait == "dies"`` it exits instead of ending); the
    outcome of ``group``'s ``wait`` on each rank is written to ``out``/rank."""
    group.TIMEOUT = timedelta(seconds=COLLECTIVE_TIMEOUT)
    ranks = group.Membership(rank, world, rank, world, "127.0.0.1", port)
    group.join(ranks)
    work = Work(SLOW if rank == 0 else 0.0, [rank])
    if wait == "dies" and rank == 0:
        time.sleep(COLLECTIVE_TIMEOUT / 2)
        os._exit(1)
    try:
        waited = group.agreed if wait == "agreed" else group.agreed_when_done
        outcome = {"result": waited(work, ranks)}
    except Exception as error:  # noqa: BLE001 - the outcome is the test's verdict
        outcome = {"lost_peer": lost_peer(error)}
    Path(out, str(rank)).write_text(json.dumps(outcome))
    group.leave()


def outcomes(tmp_path: Path, wait: str) -> dict[int, dict]:
    """Each rank's outcome; every rank ends by itself (none is stopped for another)."""
    context = mp.start_processes(rank_waits, args=(2, _free_port(), wait, str(tmp_path)),
                                 nprocs=2, join=False, start_method="spawn")
    for process in context.processes:
        process.join(HANG_GUARD)
    return {rank: json.loads((tmp_path / str(rank)).read_text())
            for rank in range(2) if (tmp_path / str(rank)).exists()}


def test_ranks_wait_for_work_longer_than_a_collective_timeout(tmp_path):
    assert outcomes(tmp_path, "agreed_when_done") == {0: {"result": [0]}, 1: {"result": [1]}}


def test_a_plain_agreement_would_have_given_up(tmp_path):
    """What the waiting is for: without it the waiting rank's collective times out."""
    assert outcomes(tmp_path, "agreed")[1] == {"lost_peer": True}


def test_a_rank_that_dies_while_the_others_wait_stops_them(tmp_path):
    assert outcomes(tmp_path, "dies") == {1: {"lost_peer": True}}

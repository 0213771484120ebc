"""The process group: joined from torchrun's environment, or made by spawning local ranks.

torchrun (and Slurm through it) sets RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT; ``spawn`` sets the same for N
processes on this machine, so both paths join the group the same way. The
backend is gloo on the CPU (NCCL once the CUDA backend exists). Collectives
time out, so a rank that dies makes the others fail rather than hang.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable

import torch.distributed as dist
import torch.multiprocessing as mp

from splatscale.errors import SplatscaleError

TIMEOUT = timedelta(seconds=60)


@dataclass(frozen=True)
class Ranks:
    rank: int
    world: int
    local_world: int


def from_environment() -> Ranks | None:
    """This process' place in a group started by torchrun or ``spawn``; None alone."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return None
    return Ranks(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_WORLD_SIZE", world)))


def join(ranks: Ranks) -> None:
    """Join the group; returns when every rank has joined, so what each did before
    (checking the output folder) is done before any rank goes on (writing to it)."""
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=ranks.rank, world_size=ranks.world,
                                timeout=TIMEOUT)
    dist.barrier()


def leave() -> None:
    """Leave the group, so that gloo's threads end while Python can still free the
    tensors their last collectives hold (at exit they would abort the process)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def threads_per_rank(local_world: int) -> int:
    return max(1, (os.cpu_count() or 1) // local_world)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _child(rank: int, nproc: int, port: int, main: Callable[[], int]) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
                      LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    code = main()
    if code:
        sys.exit(code)


def spawn(main: Callable[[], int], nproc: int) -> None:
    """Run ``main`` in ``nproc`` local ranks; when one fails the others are ended."""
    try:
        mp.spawn(_child, args=(nproc, _free_port(), main), nprocs=nproc)
    except mp.ProcessExitedException as failure:
        raise SplatscaleError(f"rank {failure.error_index} of {nproc} exited with status "
                              f"{failure.exit_code}; the other ranks were stopped") from None
    except mp.ProcessRaisedException as failure:
        raise SplatscaleError(f"rank {failure.error_index} of {nproc} failed: "
                              f"{str(failure).strip().splitlines()[-1]}") from None

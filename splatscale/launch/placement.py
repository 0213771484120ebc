"""Where each rank computes and how the ranks talk.

On CPUs every rank computes on the host and the collectives run over gloo. With
``--device cuda`` a rank computes on GPU ``LOCAL_RANK % GPUs`` of those it sees:
when no two ranks of the group are on the same GPU (told apart by their UUIDs,
which every rank publishes as it joins, so that all choose alike, whatever GPUs
each machine or each Slurm task is given), the collectives run over NCCL in
device memory; when some share one, over gloo through host memory (NCCL refuses
two ranks on one GPU). ``--comm`` chooses for itself where that can work.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

from splatscale.errors import SplatscaleError


class PlacementError(SplatscaleError):
    """A --comm that cannot work: every rank finds it alike, so rank 0 says it."""

    voice = "rank 0"


@dataclass(frozen=True)
class Placement:
    device: str    # this rank's: "cpu" or "cuda:<index>"
    comm: str      # the group's backend: "gloo" or "nccl"
    shared: bool   # some ranks of the group are on one GPU

    def describe(self, world: int) -> str:
        """A line for the run's first notice, on GPUs."""
        where = "some sharing a GPU" if self.shared else "each on a GPU of its own"
        route = ("over NCCL in device memory" if self.comm == "nccl"
                 else "over gloo through host memory")
        return f"{world} ranks, {where}, collectives {route}"


def rank_device(device: str, local_rank: int) -> str:
    """The device rank ``local_rank`` of its machine computes on."""
    if device == "cpu":
        return "cpu"
    return f"cuda:{local_rank % torch.cuda.device_count()}"


def gpu_identity(device: str) -> str:
    """What tells this rank's GPU from every other in the group ("cpu" on CPUs)."""
    if device == "cpu":
        return "cpu"
    properties = torch.cuda.get_device_properties(torch.device(device))
    uuid = getattr(properties, "uuid", None)  # older torch: the machine and the index
    return str(uuid) if uuid is not None else f"{socket.gethostname()}:{device}"


def chosen_backend(device: str, shared: bool, comm: str | None = None) -> str:
    """gloo on CPUs and where ranks share a GPU, else NCCL where torch has it; ``comm``
    where it can work, else refused, naming the flag."""
    if device == "cpu":
        if comm == "nccl":
            raise PlacementError("--comm nccl: NCCL joins GPUs; ranks with --device cpu "
                                 "talk over gloo (drop --comm, or train with --device cuda)")
        return "gloo"
    if comm == "nccl" and shared:
        raise PlacementError("--comm nccl: some ranks would share a GPU, which NCCL "
                             "refuses; use --comm gloo (the default then), or no more "
                             "ranks on a machine than it has GPUs")
    if comm == "nccl" and not dist.is_nccl_available():
        raise PlacementError("--comm nccl: this build of torch has no NCCL; use --comm gloo")
    if comm is not None:
        return comm
    return "nccl" if not shared and dist.is_nccl_available() else "gloo"

"""Where each rank computes and how the ranks talk.

On CPUs every rank computes on the host and the collectives run over gloo. With
``--device cuda`` a rank computes on GPU ``LOCAL_RANK % GPUs``: when each rank
of the machine has a GPU of its own, the collectives run over NCCL in device
memory; when ranks share one, over gloo through host memory (NCCL refuses two
ranks on one GPU). ``--comm`` chooses for itself where both can work.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from splatscale.errors import SplatscaleError


@dataclass(frozen=True)
class Placement:
    device: str   # "cpu" or "cuda:<index>"
    comm: str     # the process group's backend: "gloo" or "nccl"
    gpus: int     # GPUs this machine's ranks share (0 on CPUs)

    def describe(self, local_world: int) -> str:
        """A line for the run's first notice, on GPUs."""
        ranks = f"{local_world} rank{'s' * (local_world > 1)} on this machine"
        sharing = ("each on a GPU of its own" if local_world <= self.gpus
                   else f"sharing {self.gpus} GPU{'s' * (self.gpus > 1)}")
        route = ("over NCCL in device memory" if self.comm == "nccl"
                 else "over gloo through host memory")
        return f"{ranks}, {sharing}, collectives {route}"


def placement(device: str, local_rank: int, local_world: int, gpus: int,
              comm: str | None = None) -> Placement:
    """Where rank ``local_rank`` of the ``local_world`` on this machine computes, with
    ``gpus`` GPUs visible, and its backend (``comm`` if given); a choice that cannot
    work is refused, naming the flag."""
    if device == "cpu":
        if comm == "nccl":
            raise SplatscaleError("--comm nccl: NCCL joins GPUs; ranks with --device cpu "
                                  "talk over gloo (drop --comm, or train with --device cuda)")
        return Placement("cpu", "gloo", 0)
    shared = local_world > gpus
    if comm == "nccl" and shared:
        raise SplatscaleError(f"--comm nccl: the {local_world} ranks on this machine would "
                              f"share its {gpus} GPU{'s' * (gpus > 1)}, which NCCL refuses; "
                              f"use --comm gloo (the default then) or at most {gpus} "
                              "ranks per machine")
    chosen = comm or ("gloo" if shared else "nccl")
    if chosen == "nccl" and not dist.is_nccl_available():
        raise SplatscaleError("--comm nccl: this build of torch has no NCCL; use --comm gloo")
    return Placement(f"cuda:{local_rank % gpus}", chosen, gpus)

"""Where ranks compute and how they talk: the choice of device and backend, and the
collectives' staging of buffers the backend cannot use in place."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from splatscale.engine.distributed import collectives
from splatscale.engine.distributed.placement import placement
from splatscale.errors import SplatscaleError
from tests.test_distributed import join


def test_ranks_on_cpus_talk_over_gloo():
    where = placement("cpu", 1, 2, gpus=0)
    assert (where.device, where.comm) == ("cpu", "gloo")
    with pytest.raises(SplatscaleError, match="--comm nccl: NCCL joins GPUs"):
        placement("cpu", 0, 2, gpus=0, comm="nccl")


def test_ranks_sharing_a_gpu_stage_through_host_memory():
    where = [placement("cuda", rank, 2, gpus=1) for rank in range(2)]
    assert [(w.device, w.comm) for w in where] == [("cuda:0", "gloo")] * 2
    assert where[0].describe(2) == ("2 ranks on this machine, sharing 1 GPU, collectives "
                                    "over gloo through host memory")
    with pytest.raises(SplatscaleError, match="would share its 1 GPU, which NCCL refuses"):
        placement("cuda", 0, 2, gpus=1, comm="nccl")
    assert placement("cuda", 3, 4, gpus=2).device == "cuda:1"


def test_ranks_each_on_a_gpu_talk_over_nccl(monkeypatch):
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    where = placement("cuda", 1, 2, gpus=2)
    assert (where.device, where.comm) == ("cuda:1", "nccl")
    assert "each on a GPU of its own, collectives over NCCL" in where.describe(2)
    assert placement("cuda", 1, 2, gpus=2, comm="gloo").comm == "gloo"
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)
    with pytest.raises(SplatscaleError, match="no NCCL; use --comm gloo"):
        placement("cuda", 1, 2, gpus=2)


def staged_rank(rank: int, world: int, init_file: str, out_file: str) -> None:
    """Each collective given strided views, which gloo cannot use in place."""
    join(rank, world, init_file)
    table = torch.arange(12, dtype=torch.float64).view(4, 3) * (rank + 1)
    collectives.all_reduce(table[:, 1])  # a strided column: staged, reduced, copied back
    received = torch.zeros(4, 2, dtype=torch.float64)
    sent = torch.arange(8, dtype=torch.float64).view(2, 4).t() + 10 * rank  # strided
    collectives.all_to_all_single(received.t()[0], sent[:, 0].clone(), [2, 2], [2, 2])
    message = torch.zeros(3, 2)
    if rank == 1:
        collectives.send(torch.ones(3, 2)[:, 0], 0)  # strided
    else:
        collectives.receive(message[:, 0], 1)  # a strided destination
    if rank == 0:
        torch.save({"table": table, "received": received, "message": message}, out_file)
    dist.destroy_process_group()


def test_collectives_stage_what_the_backend_cannot_use_in_place(tmp_path):
    out = tmp_path / "rank0.pt"
    mp.spawn(staged_rank, args=(2, str(tmp_path / "init"), str(out)), nprocs=2)
    got = torch.load(out)
    want = torch.arange(12, dtype=torch.float64).view(4, 3)
    want[:, 1] *= 3  # 1x + 2x over the two ranks; the other columns untouched
    assert torch.equal(got["table"], want)
    # Rank 0 receives rows 0-1 of its own column 0 and rows 0-1 of rank 1's.
    assert got["received"][:, 0].tolist() == [0.0, 1.0, 10.0, 11.0]
    assert got["received"][:, 1].tolist() == [0.0] * 4
    assert got["message"][:, 0].tolist() == [1.0, 1.0, 1.0]

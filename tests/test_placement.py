"""Where ranks compute and how they talk: the choice of device and backend, and the
collectives' staging of buffers the backend cannot use in place."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from splatscale.engine.distributed import collectives
from splatscale.launch import group
from splatscale.launch.placement import Placement, PlacementError, chosen_backend
from splatscale.errors import lost_peer
from tests.conftest import HANG_GUARD
from tests.test_distributed import join


def test_ranks_on_cpus_talk_over_gloo():
    assert chosen_backend("cpu", shared=False) == "gloo"
    with pytest.raises(PlacementError, match="--comm nccl: NCCL joins GPUs"):
        chosen_backend("cpu", False, comm="nccl")


def test_ranks_sharing_a_gpu_talk_over_gloo(monkeypatch):
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    assert chosen_backend("cuda", shared=True) == "gloo"
    with pytest.raises(PlacementError, match="some ranks would share a GPU, which NCCL"):
        chosen_backend("cuda", True, comm="nccl")
    assert Placement("cuda:0", "gloo", shared=True).describe(2) == (
        "2 ranks, some sharing a GPU, collectives over gloo through host memory")


def test_ranks_each_on_a_gpu_talk_over_nccl_where_torch_has_it(monkeypatch):
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    assert chosen_backend("cuda", shared=False) == "nccl"
    assert chosen_backend("cuda", False, comm="gloo") == "gloo"
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)
    assert chosen_backend("cuda", shared=False) == "gloo"
    with pytest.raises(PlacementError, match="no NCCL; use --comm gloo"):
        chosen_backend("cuda", False, comm="nccl")


def joining_rank(rank: int, world: int, port: int, identities: list[str], comm,
                 out_file: str) -> None:
    """Join as the CLI does, on a GPU whose identity is ``identities[rank]``."""
    group.gpu_identity = lambda device: identities[rank]
    ranks = group.Membership(rank, world, rank, world, "127.0.0.1", port)
    try:
        outcome = group.join(ranks, HANG_GUARD, "cuda:0", comm)
    except PlacementError as error:
        outcome = str(error)
    except Exception as error:  # noqa: BLE001 - rank 0, refusing, took its store away
        assert rank > 0 and lost_peer(error), error
        outcome = "lost rank 0"
    torch.save(outcome, f"{out_file}.{rank}")
    group.leave()


@pytest.mark.parametrize("identities, comm, want", [
    (["GPU-a", "GPU-a"], None, Placement("cuda:0", "gloo", shared=True)),
    (["GPU-a", "GPU-a"], "nccl", "--comm nccl: some ranks would share a GPU"),
    (["GPU-a", "GPU-b"], "gloo", Placement("cuda:0", "gloo", shared=False)),
])
def test_the_ranks_choose_alike_from_every_rank_s_gpu(tmp_path, identities, comm, want):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = tmp_path / "outcome"
    mp.spawn(joining_rank, args=(2, port, identities, comm, str(out)), nprocs=2)
    outcomes = [torch.load(f"{out}.{rank}", weights_only=False) for rank in range(2)]
    if isinstance(want, str):  # refused: rank 0 says why; the others may lose it first
        assert want in outcomes[0]
        assert want in outcomes[1] or outcomes[1] == "lost rank 0"
    else:
        assert outcomes == [want, want]


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

"""Engines on one GPU against one process holding everything on it, in float32 with
gsplat's kernels: 2 ranks sharing the GPU (gloo through host memory), distributed
and offloaded shards, one step of forward and backward; and one process offloading
to it (pinned copies, forwarding on) over several steps."""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from splatscale.engine.factory import OffloadOptions, RankOptions, make_engine, shard_of
from splatscale.strategy.default import GradientNorms
from tests.conftest import densifying_scene
from tests.test_cuda_backend import assert_gradients_close
from tests.test_distributed import by_key, gather_rows, join

ENGINES = {"distributed": partial(make_engine, ranks=RankOptions()),
           "offloaded_shards": partial(make_engine, offload=OffloadOptions(),
                                       ranks=RankOptions())}
BATCH = 2


def rank_step(rank: int, world: int, init_file: str, out_file: str, engine: str,
              device: str) -> None:
    join(rank, world, init_file)
    views, model = densifying_scene(torch.float32)
    shard = shard_of(model, rank, world)
    step = ENGINES[engine](shard, BATCH, torch.zeros(3), device=device)
    result = step.forward_backward(views[:BATCH], GradientNorms())
    assert_on(step, device)
    grads = {n: gather_rows(p.grad.cpu()) for n, p in step.model.parameters().items()
             if p.grad is not None} if engine == "distributed" else step_gradients(step)
    keys = gather_rows(step.model.keys.cpu())
    if rank == 0:
        torch.save((result.loss, by_key(keys, grads)), out_file)
    dist.destroy_process_group()


def assert_on(engine, device: str) -> None:
    """The engine holds, or computes, on ``device``: not quietly on the host."""
    kind = torch.device(device).type
    if hasattr(engine.rows, "transfers"):  # offloaded: the geometry and each step's rows
        assert engine.rows.geometry.means.device.type == kind
        assert engine.rows.transfers.bytes["host_to_device"] > 0
    else:
        assert {p.device.type for p in engine.model.parameters().values()} == {kind}


def step_gradients(engine) -> dict:
    """The offloaded shard's gradients of the last step, every row (zeros where unseen),
    gathered in rank order."""
    pending, rows = engine.rows.pending, len(engine.model)
    dense = {}
    for name, grad in pending.grads.items():
        dense[name] = grad.new_zeros((rows, *grad.shape[1:]))
        dense[name][pending.rows] = grad
    return {name: gather_rows(grad) for name, grad in dense.items()}


def one_process_step(device: str) -> tuple[float, dict]:
    views, model = densifying_scene(torch.float32)
    engine = make_engine(model, BATCH, torch.zeros(3), device=device)
    result = engine.forward_backward(views[:BATCH], GradientNorms())
    return result.loss, by_key(engine.model.keys.cpu(),
                               {n: p.grad.cpu() for n, p in engine.model.parameters().items()
                                if p.grad is not None})


def two_ranks_against_one(engine: str, device: str, tmp_path) -> None:
    out = tmp_path / "rank0.pt"
    mp.spawn(rank_step, args=(2, str(tmp_path / "init"), str(out), engine, device), nprocs=2)
    loss, got = torch.load(out)
    want_loss, want = one_process_step(device)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    assert torch.equal(got["keys"], want["keys"])
    for name in want:
        if name != "keys":
            assert_gradients_close(got[name], want[name], name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_two_ranks_on_one_gpu_equal_one_process(engine, tmp_path):
    two_ranks_against_one(engine, "cuda:0", tmp_path)


def offload_against_local(device: str, forwarding: bool | None = None) -> None:
    """Four steps with Adam, each told the next batch: the same losses and parameters
    to float32 agreement."""
    views, model = densifying_scene(torch.float32)
    rates = {"means": 1e-3, "sh0": 2.5e-3, "shN": 1e-4, "opacity_logits": 0.05,
             "log_scales": 5e-3, "quats": 1e-3}
    engines = {"local": make_engine(model.detach(), BATCH, torch.zeros(3), device=device),
               "offload": make_engine(model.detach(), BATCH, torch.zeros(3), device=device,
                                      offload=OffloadOptions(forwarding=forwarding))}
    for step in range(4):
        batch = views[(step * BATCH) % len(views):][:BATCH]
        after = [view.camera for view in views[((step + 1) * BATCH) % len(views):][:BATCH]]
        for engine in engines.values():
            engine.expect(after, rates)  # offloaded: the next batch's rows sent early
        losses = {name: e.forward_backward(batch, GradientNorms()).loss
                  for name, e in engines.items()}
        assert losses["offload"] == pytest.approx(losses["local"], rel=1e-5), step
        for engine in engines.values():
            assert_on(engine, device)
            engine.optimizer_step(rates)
    parts = {name: next(e.model_parts()) for name, e in engines.items()}
    for name in model.PARAMETERS:
        torch.testing.assert_close(getattr(parts["offload"], name),
                                   getattr(parts["local"], name), rtol=1e-4, atol=1e-5,
                                   msg=name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_offloading_to_a_gpu_equals_holding_everything_on_it():
    offload_against_local("cuda")  # forwarding on, as by default there

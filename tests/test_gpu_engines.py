"""Engines on one GPU against one process holding everything on it, in float32 with
gsplat's kernels: 2 ranks sharing the GPU (gloo through host memory), distributed
and offloaded shards, one step of forward and backward; one process offloading
to it (pinned copies, forwarding on) over several steps; a step with colour
transforms, and steps of anti-aliased splats and of fisheye cameras, against the
CPU's."""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor

from splatscale.data.cameras import Camera
from splatscale.engine import TrainView
from splatscale.engine.factory import OffloadOptions, RankOptions, make_engine, shard_of
from splatscale.step.appearance import Appearance
from splatscale.strategy.default import GradientNorms
from tests.conftest import densifying_scene
from tests.test_appearance import changed_views
from tests.test_cuda_backend import assert_gradients_close
from tests.test_distributed import by_key, gather_rows, join
from tests.test_masks import masked_scene

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
    grads = {n: gather_rows(g.cpu()) for n, g in step.rows.gradients().items()}
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


def one_process_step(device: str) -> tuple[float, dict]:
    views, model = densifying_scene(torch.float32)
    engine = make_engine(model, BATCH, torch.zeros(3), device=device)
    result = engine.forward_backward(views[:BATCH], GradientNorms())
    return result.loss, by_key(engine.model.keys.cpu(),
                               {n: g.cpu() for n, g in engine.rows.gradients().items()})


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


def affine_step(device: str) -> tuple[float, list, Tensor, dict]:
    """One step of a batch whose photos' colours changed, each view with its transform
    (``--appearance affine``): the loss, the transforms' gradients, the transforms
    after their Adam step, and the Gaussians' gradients by key."""
    views, model = changed_views(torch.float32), densifying_scene(torch.float32)[1]
    engine = make_engine(model, BATCH, torch.zeros(3), device=device)
    colours, ids = Appearance(len(views), BATCH), list(range(BATCH))
    leaves = colours.leaves(ids)
    batch = [TrainView(views[i].camera, views[i].target, appearance=leaf)
             for i, leaf in zip(ids, leaves)]
    loss = engine.forward_backward(batch, GradientNorms()).loss
    grads = [leaf.grad.clone() for leaf in leaves]
    colours.step(ids, leaves, 0.05)
    return loss, grads, colours.transforms, by_key(
        engine.model.keys.cpu(), {n: g.cpu() for n, g in engine.rows.gradients().items()})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_colour_transforms_train_on_the_gpu_as_on_the_cpu():
    """The render mapped on the GPU, the transforms' gradients back on the host."""
    got, want = affine_step("cuda"), affine_step("cpu")
    assert got[0] == pytest.approx(want[0], rel=1e-5)
    for ours, theirs in zip(got[1], want[1]):
        assert_gradients_close(ours, theirs, "transform")
    torch.testing.assert_close(got[2], want[2], rtol=0, atol=1e-6)  # Adam's first step: the sign
    for name in want[3]:
        if name != "keys":
            assert_gradients_close(got[3][name], want[3][name], name)


def masked_run(device: str) -> tuple[list[tuple[float, float]], dict]:
    """Four steps with Adam on ``masked_scene`` (noise under the masks), its views read
    as uint8 pixels with their masks (kept on the device): each step's loss and PSNR,
    and the parameters after."""
    views, model = masked_scene(noise=True, dtype=torch.float32)
    pixels = [(view.target * 255).round().to(torch.uint8) for view in views]
    rates = {"means": 1e-3, "sh0": 2.5e-3, "shN": 1e-4, "opacity_logits": 0.05,
             "log_scales": 5e-3, "quats": 1e-3}
    engine = make_engine(model.detach(), BATCH, torch.zeros(3), device=device)
    steps = []
    for step in range(4):
        batch = [TrainView(views[k].camera, read=partial(rows_of, pixels[k]), masked=True)
                 for k in ((step * BATCH + i) % len(views) for i in range(BATCH))]
        result = engine.forward_backward(batch, GradientNorms())
        steps.append((result.loss, result.psnr))
        engine.optimizer_step(rates)
    assert_on(engine, device)
    part = next(engine.model_parts())
    return steps, {name: getattr(part, name).cpu() for name in model.PARAMETERS}


def rows_of(pixels: torch.Tensor, rows: tuple[int, int] | None) -> torch.Tensor:
    return pixels if rows is None else pixels[rows[0]:rows[1]]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_masked_run_on_the_gpu_equals_the_cpu_one():
    """gsplat's kernels and torch's masked SSIM against the numba ones: the same losses
    and PSNR over the masked-in pixels, and parameters, to float32 agreement."""
    (cpu_steps, cpu_params), (gpu_steps, gpu_params) = (masked_run(d) for d in ("cpu", "cuda"))
    for (cpu_loss, cpu_psnr), (gpu_loss, gpu_psnr) in zip(cpu_steps, gpu_steps):
        assert gpu_loss == pytest.approx(cpu_loss, rel=1e-5)
        assert gpu_psnr == pytest.approx(cpu_psnr, rel=1e-5)
    for name, want in cpu_params.items():
        torch.testing.assert_close(gpu_params[name], want, rtol=1e-4, atol=1e-5, msg=name)


def kind_run(device: str, camera_model: str, antialiased: bool) -> tuple[list[float], dict]:
    """Four steps with Adam of ``densifying_scene``'s model, anti-aliased or not, its
    cameras projecting as ``camera_model``: the losses and the parameters after."""
    views, model = densifying_scene(torch.float32)
    model.antialiased = antialiased
    views = [TrainView(Camera(v.camera.viewmat, v.camera.K, v.camera.width, v.camera.height,
                              v.camera.name, camera_model), v.target) for v in views]
    rates = {"means": 1e-3, "sh0": 2.5e-3, "shN": 1e-4, "opacity_logits": 0.05,
             "log_scales": 5e-3, "quats": 1e-3}
    engine = make_engine(model, BATCH, torch.zeros(3), device=device)
    losses = []
    for step in range(4):
        batch = [views[(step * BATCH + i) % len(views)] for i in range(BATCH)]
        losses.append(engine.forward_backward(batch, GradientNorms()).loss)
        engine.optimizer_step(rates)
    assert_on(engine, device)
    part = next(engine.model_parts())
    assert part.antialiased == antialiased
    return losses, {name: getattr(part, name).cpu() for name in model.PARAMETERS}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("camera_model, antialiased", [("pinhole", True), ("fisheye", False),
                                                       ("fisheye", True)])
def test_antialiased_and_fisheye_runs_on_the_gpu_equal_the_cpu_ones(camera_model, antialiased):
    """gsplat's compensations and fisheye projection against the numba kernels over
    steps of training: the same losses and parameters, to float32 agreement."""
    (cpu_losses, cpu_params), (gpu_losses, gpu_params) = (
        kind_run(d, camera_model, antialiased) for d in ("cpu", "cuda"))
    assert gpu_losses == pytest.approx(cpu_losses, rel=1e-5)
    for name, want in cpu_params.items():
        torch.testing.assert_close(gpu_params[name], want, rtol=1e-4, atol=1e-5, msg=name)

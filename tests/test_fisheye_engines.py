"""Fisheye cameras on every engine: W ranks (1, 2, 3), the offload engine (forwarding and
lookahead on and off) and ranks that offload equal one process in float64. The ranks cut
each batch's rows by the projected splats (``partition.py`` reads their means and radii,
whatever projection made them), so nothing there assumes a pinhole."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from splatscale.engine import TrainView
from splatscale.engine.factory import OffloadOptions, RankOptions, make_engine, shard_of
from splatscale.engine.offload.lookahead import same_view
from splatscale.engine.state import concat_states
from splatscale.render import render
from splatscale.strategy.default import GradientNorms
from tests.conftest import densifying_run, look_at_camera, random_model, state_by_key
from tests.test_distributed import by_key, gather_rows, join
from tests.test_offload import assert_same_sets

WIDTH, HEIGHT = 41, 37  # not a multiple of the 16-pixel tiles
FOCAL = 0.5 * WIDTH     # as a fisheye: 1.0 radian to the side edges, 1.35 to the corners


def wide_cameras(model: str, dtype=torch.float64) -> list:
    """Four cameras 2 from the origin looking at it, of ``Camera.model`` ``model``: as
    fisheyes about 115 degrees across (r = f theta)."""
    cameras = [look_at_camera([2.0 * math.cos(a), 0.6, 2.0 * math.sin(a)], [0, 0, 0], WIDTH,
                              HEIGHT, focal=FOCAL, dtype=dtype)
               for a in np.linspace(0, 2 * math.pi, 4, endpoint=False)]
    return [dataclasses.replace(camera, model=model) for camera in cameras]


def fisheye_scene(dtype=torch.float64) -> tuple[list[TrainView], object]:
    """Four fisheye views of a random model around the origin (1.2 across, so Gaussians
    reach far off axis), and another random model to train, large enough to densify."""
    truth = random_model(150, seed=11, spread=1.2, dtype=dtype)
    with torch.no_grad():
        views = [TrainView(c, render(truth, c).rgb.clamp(0, 1))
                 for c in wide_cameras("fisheye", dtype)]
    return views, random_model(60, seed=12, spread=1.2, log_scale=(-2.5, -1.0), dtype=dtype)


def test_the_scene_is_seen_through_a_fisheye():
    """The engines below see fisheye images: the same model through the same cameras as
    pinholes renders otherwise (guards every test here against a pinhole stand-in)."""
    views, model = fisheye_scene()
    for view, pinhole in zip(views, wide_cameras("pinhole")):
        with torch.no_grad():
            assert not torch.allclose(render(model, view.camera).rgb,
                                      render(model, pinhole).rgb, atol=0.05)


@pytest.fixture(scope="module")
def one_process():
    views, model = fisheye_scene()
    grads = {}
    for batch_size in (1, 4):
        engine = make_engine(model.detach(), batch_size, torch.zeros(3))
        loss = engine.forward_backward(views[:batch_size], GradientNorms()).loss
        grads[batch_size] = loss, by_key(engine.model.keys, engine.rows.gradients())
    engine = make_engine(model.detach(), 2, torch.zeros(3))
    losses = densifying_run(engine, views)
    return {"grads": grads, "losses": losses, "state": engine.state_dict(),
            "render": engine.render(views[1].camera)}


def fisheye_rank(rank: int, world: int, init_file: str, out_file: str,
                 offload: bool) -> None:
    join(rank, world, init_file)
    views, model = fisheye_scene()
    results: dict = {"grads": {}}
    options = (OffloadOptions(forwarding=rank == 0, lookahead=rank == 1) if offload
               else None)
    if not offload:
        for batch_size in (1, 4):
            engine = make_engine(shard_of(model, rank, world), batch_size, torch.zeros(3),
                                 ranks=RankOptions())
            result = engine.forward_backward(views[:batch_size], GradientNorms())
            grads = {n: gather_rows(g) for n, g in engine.rows.gradients().items()}
            results["grads"][batch_size] = (result.loss,
                                            by_key(gather_rows(engine.model.keys), grads),
                                            result.diagnostics["bands"])
    engine = make_engine(shard_of(model, rank, world), 2, torch.zeros(3), offload=options,
                         ranks=RankOptions(max_imbalance=1.0))  # rebalance after each edit
    results["losses"] = densifying_run(engine, views)
    results["render"] = engine.render(views[1].camera)
    torch.save((results, engine.state_dict()), f"{out_file}.{rank}")
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [1, 2, 3])
def test_ranks_with_fisheye_cameras_equal_one_process(world, one_process, tmp_path):
    out = tmp_path / "rank"
    mp.spawn(fisheye_rank, args=(world, str(tmp_path / "init"), str(out), False),
             nprocs=world)
    ranks = [torch.load(f"{out}.{r}", weights_only=False) for r in range(world)]
    results = ranks[0][0]
    for batch_size in (1, 4):
        want_loss, want = one_process["grads"][batch_size]
        loss, got, bands = results["grads"][batch_size]
        assert loss == pytest.approx(want_loss, rel=1e-12)
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=1e-9, atol=1e-14,
                                       msg=lambda m, name=name: f"B={batch_size} {name}: {m}")
        if world > 1:
            cuts = [band.rows[0] for rank_bands in bands[1:] for band in rank_bands[:1]]
            assert any(cut % 16 for cut in cuts), f"some band must split a tile row: {bands}"
    assert results["losses"] == pytest.approx(one_process["losses"], rel=1e-9)
    torch.testing.assert_close(results["render"].rgb, one_process["render"].rgb, rtol=1e-12,
                               atol=0)
    state = concat_states([rank[1] for rank in ranks])
    got, want = state_by_key(state), state_by_key(one_process["state"])
    assert len(want["keys"]) != 60, "densification must have happened"
    assert torch.equal(got["keys"], want["keys"])
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-9, atol=1e-14, msg=name)


@pytest.mark.parametrize("forwarding, lookahead", [(True, True), (True, False),
                                                   (False, True), (False, False)])
def test_offloaded_fisheye_training_equals_one_process(one_process, forwarding, lookahead):
    """Bit for bit, as for pinholes: the working set (the conservative cull's candidates)
    renders what the whole model renders."""
    views, model = fisheye_scene()
    engine = make_engine(model.detach(), 2, torch.zeros(3),
                         offload=OffloadOptions(forwarding=forwarding, lookahead=lookahead))
    np.testing.assert_allclose(densifying_run(engine, views), one_process["losses"], rtol=0)
    assert_same_sets(engine.state_dict(), one_process["state"], 0.0)


def test_ranks_that_offload_with_fisheye_cameras_equal_one_process(one_process, tmp_path):
    out = tmp_path / "rank"
    mp.spawn(fisheye_rank, args=(2, str(tmp_path / "init"), str(out), True), nprocs=2)
    ranks = [torch.load(f"{out}.{r}", weights_only=False) for r in range(2)]
    np.testing.assert_allclose(ranks[0][0]["losses"], one_process["losses"], rtol=1e-9)
    assert_same_sets(concat_states([rank[1] for rank in ranks]), one_process["state"], 1e-9)


def test_the_lookahead_tells_a_fisheye_from_a_pinhole_at_one_pose():
    """Rows sent early for a fisheye's step (its cull) serve only that step."""
    fisheye, again, pinhole = (wide_cameras(model)[0] for model in ("fisheye", "fisheye",
                                                                     "pinhole"))
    assert same_view(fisheye, again) and not same_view(fisheye, pinhole)

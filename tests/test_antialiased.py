"""Anti-aliased splats (``--antialiased``, gsplat's ``rasterize_mode="antialiased"``) end
to end: the flag reaches the renderer and stays with the model through every engine
(W ranks, offloaded rows, both: each equal to one process in float64, and to a
permuted copy), edits, checkpoints, the run's files and the commands that read them."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from splatscale.cli import main
from splatscale.engine.factory import OffloadOptions, RankOptions, make_engine, shard_of
from splatscale.errors import DataError
from splatscale.model.gaussians import GaussianModel
from splatscale.model.ply import read_ply, write_ply
from splatscale.render import render
from splatscale.train.config import TrainConfig
from tests.conftest import antialiased, densifying_run, densifying_scene, state_by_key
from tests.test_distributed import by_key, gather_rows, join
from tests.test_training import SHORT, make_trainer


@pytest.fixture(scope="module")
def one_process():
    """The losses and final state of the densifying run of an anti-aliased model."""
    views, model = densifying_scene()
    engine = make_engine(antialiased(model), 2, torch.zeros(3))
    return densifying_run(engine, views), engine.state_dict()


def test_the_flag_reaches_the_renderer_and_stays_through_edits(one_process):
    views, model = densifying_scene()
    with torch.no_grad():
        plain, smoothed = (render(m, views[0].camera).rgb for m in (model, antialiased(model)))
    assert (plain - smoothed).abs().max() > 1e-2, "compensated opacities change the pixels"
    engine = make_engine(model.detach(), 2, torch.zeros(3))
    losses, _ = one_process
    assert densifying_run(engine, views) != losses
    edited = make_engine(antialiased(model), 2, torch.zeros(3))
    densifying_run(edited, views)
    assert edited.model.antialiased and len(edited.model) != len(model), "densified, still so"


def test_a_checkpointed_state_loads_into_an_antialiased_engine_as_it_was(one_process):
    """The engine state holds numbers only: the engine it is loaded into renders as its
    run does, which the run's settings say."""
    views, model = densifying_scene()
    _, state = one_process
    engine = make_engine(antialiased(model), 2, torch.zeros(3))
    engine.load_state_dict(state)
    assert engine.model.antialiased
    got, want = state_by_key(engine.state_dict()), state_by_key(state)
    assert all(torch.equal(got[name], want[name]) for name in want)


@pytest.mark.parametrize("forwarding, lookahead", [(True, True), (True, False),
                                                   (False, True), (False, False)])
def test_offloaded_antialiased_training_equals_local(one_process, forwarding, lookahead):
    views, model = densifying_scene()
    engine = make_engine(antialiased(model), 2, torch.zeros(3),
                         offload=OffloadOptions(forwarding, lookahead))
    losses, state = one_process
    np.testing.assert_allclose(densifying_run(engine, views), losses, rtol=0)
    got, want = state_by_key(engine.state_dict()), state_by_key(state)
    assert torch.equal(got["keys"], want["keys"])
    for name in want:
        assert torch.equal(got[name], want[name]), name


def test_storage_order_does_not_change_antialiased_training(one_process):
    views, model = densifying_scene()
    order = torch.randperm(len(model), generator=torch.Generator().manual_seed(0))
    engine = make_engine(antialiased(model.rows(order)), 2, torch.zeros(3))
    densifying_run(engine, views)
    got, want = state_by_key(engine.state_dict()), state_by_key(one_process[1])
    assert torch.equal(got["keys"], want["keys"])
    for name in want:
        scale = float(want[name].abs().max())
        torch.testing.assert_close(got[name], want[name], rtol=1e-12, atol=1e-12 * scale,
                                   msg=name)


def run_rank(rank: int, world: int, init_file: str, out_file: str) -> None:
    """The densifying run of an anti-aliased model's shard by the ranks, its rows
    resident and offloaded (rebalanced after every densification); rank 0 saves each
    run's losses and Gaussians."""
    join(rank, world, init_file)
    views, model = densifying_scene()
    results = {}
    for name, offload in (("resident", None), ("offloaded", OffloadOptions())):
        engine = make_engine(shard_of(antialiased(model), rank, world), 2, torch.zeros(3),
                             offload=offload, ranks=RankOptions(max_imbalance=1.0))
        losses = densifying_run(engine, views)
        parts = list(engine.model_parts())
        results[name] = (losses, by_key(gather_rows(engine.model.keys), {
            n: gather_rows(t.detach()) for n, t in engine.model.parameters().items()}),
            engine.model.antialiased and all(part.antialiased for part in parts))
    if rank == 0:
        torch.save(results, out_file)
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [1, 2, 3])
def test_ranks_equal_the_single_process_antialiased(world, one_process, tmp_path):
    out = tmp_path / "rank0.pt"
    mp.spawn(run_rank, args=(world, str(tmp_path / "init"), str(out)), nprocs=world)
    ranks = torch.load(out, weights_only=False)
    want_losses, state = one_process
    want = state_by_key(state)
    for name, (losses, got, kept_flag) in ranks.items():
        assert kept_flag, f"{name}: every rank's model and every exported part anti-aliased"
        assert losses == pytest.approx(want_losses, rel=1e-9), name
        assert torch.equal(got["keys"], want["keys"]), name
        for param in GaussianModel.PARAMETERS:
            torch.testing.assert_close(got[param], want[param], rtol=1e-9, atol=1e-14,
                                       msg=lambda m, p=param: f"{name} {p}: {m}")


def test_a_resumed_trainer_continues_antialiased_bit_for_bit(tmp_path):
    straight = make_trainer(tmp_path / "a", antialiased=True, **SHORT)
    for _ in range(30):
        straight.train_step()
    first = make_trainer(tmp_path / "b", antialiased=True, **SHORT)
    for _ in range(15):
        first.train_step()
    first.options.output.mkdir(parents=True)
    first.save_checkpoint()
    resumed = make_trainer(tmp_path / "b", antialiased=True, **SHORT)
    resumed.resume(first.options.output / "checkpoint.pt")
    for _ in range(15):
        resumed.train_step()
    assert resumed.engine.model.antialiased
    a, b = straight.engine.state_dict(), resumed.engine.state_dict()
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name


def test_a_run_setting_read_from_disk_is_checked_and_old_ones_are_plain(tmp_path):
    old = {k: v for k, v in TrainConfig().to_dict().items() if k != "antialiased"}
    assert TrainConfig.from_dict(old, "checkpoint.pt: config").antialiased is False
    with pytest.raises(DataError, match="checkpoint.pt: config: antialiased must be true "
                                        "or false, not 'yes'"):
        TrainConfig.from_dict({**old, "antialiased": "yes"}, "checkpoint.pt: config")


def test_an_antialiased_run_says_so_and_render_and_eval_render_its_model_so(tmp_path, capfd):
    out, cache = tmp_path / "run", ["--cache-dir", str(tmp_path / "cache")]
    assert main(["train", "-o", str(out), "--iterations", "20", "--antialiased", "--quiet",
                 *cache]) == 0
    report = json.loads(capfd.readouterr().out)
    assert report["antialiased"] is True
    assert json.loads((out / "config.json").read_text())["antialiased"] is True
    model = read_ply(out / "point_cloud.ply")
    assert model.antialiased
    model.antialiased = False
    write_ply(model, out / "plain.ply")  # the same Gaussians, drawn as a plain model
    scores = []
    for name in ("point_cloud.ply", "plain.ply"):
        assert main(["eval", str(out / name), "--split", "train", *cache]) == 0
        scores.append(json.loads(capfd.readouterr().out)["psnr"])
    assert scores[0] != scores[1]
    assert main(["render", str(out / "point_cloud.ply"), "--split", "train", "-o",
                 str(tmp_path / "renders"), *cache]) == 0
    capfd.readouterr()
    assert json.loads((tmp_path / "renders" / "renders.json").read_text())["antialiased"]

    assert main(["train", "-o", str(out), "--resume", "--iterations", "30", "--quiet",
                 *cache]) == 0
    capfd.readouterr()
    assert read_ply(out / "point_cloud.ply").antialiased, "the resumed run keeps its setting"


def test_a_plain_run_says_so(tmp_path, capfd):
    out = tmp_path / "run"
    assert main(["train", "-o", str(out), "--iterations", "10", "--quiet", "--cache-dir",
                 str(tmp_path / "cache")]) == 0
    assert json.loads(capfd.readouterr().out)["antialiased"] is False
    assert not read_ply(out / "point_cloud.ply").antialiased
    assert json.loads((out / "config.json").read_text())["antialiased"] is False


def test_the_viewer_renders_an_antialiased_model_so_and_says_so():
    from splatscale.viewer.app import served
    from splatscale.viewer.page import Page

    views, model = densifying_scene()
    camera = views[0].camera
    exact = {}
    with served("127.0.0.1", 0) as server:
        page = Page(server, None, torch.zeros(3), "model.ply")
        for shown in (model.detach(), antialiased(model)):
            page.show_model(shown)
            exact[shown.antialiased] = page.exact(camera)
            assert ("anti-aliased" in page.summary.content) == shown.antialiased
    with torch.no_grad():
        want = render(antialiased(model), camera).rgb
    np.testing.assert_array_equal(exact[True], (want.clamp(0, 1) * 255).round().byte().numpy())
    assert not np.array_equal(exact[True], exact[False])

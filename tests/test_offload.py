"""The offload engine equals training on one device (DESIGN, invariant 3)."""

from __future__ import annotations

import copy
import math
from functools import partial

import numba
import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from splatscale.engine import TrainView
from splatscale.engine.factory import OffloadOptions, RankOptions, make_engine, shard_of
from splatscale.engine.state import concat_states
from splatscale.engine.offload.rows import OffloadedRows
from splatscale.engine.offload.culling import candidates
from splatscale.engine.offload.host_adam import MAX_SKIPPED_STEPS, DeferredAdam
from splatscale.engine.offload.transfers import Transfers
from splatscale.model.gaussians import GaussianModel
from splatscale.render import render
from splatscale.render.projection import visibility
from splatscale.step.optimizer import GaussianAdam
from splatscale.strategy.default import GradientNorms, reset_opacity
from splatscale.strategy.mcmc import Regularisers
from tests.conftest import (absgrad_run, capped_run, densifying_scene, look_at_camera, mcmc_run,
                            orbit_cameras, random_model, scheduled_run, state_by_key,
                            TRAIN_RATES)
from tests.test_batch_rule import Rows
from tests.test_training import SHORT, make_trainer

STEPS = 50


def offloaded(model: GaussianModel, batch_size: int, background: torch.Tensor,
              forwarding: bool | None = None, lookahead: bool | None = None):
    """An engine whose rows are in host memory."""
    return make_engine(model, batch_size, background,
                       offload=OffloadOptions(forwarding=forwarding, lookahead=lookahead))


def offload_scene(dtype=torch.float64) -> tuple[list[TrainView], GaussianModel]:
    """Eight narrow views of different parts of a scene: each sees about half of it,
    so most steps leave many Gaussians untouched."""
    cameras = []
    for a in np.linspace(0, 2 * math.pi, 8, endpoint=False):
        eye = [3.5 * math.cos(a), 1.0, 3.5 * math.sin(a)]
        target = [1.2 * math.cos(a + 2.0), 0.0, 1.2 * math.sin(a + 2.0)]
        cameras.append(look_at_camera(eye, target, 40, 30, focal=90, dtype=dtype))
    truth = random_model(300, seed=21, spread=1.6, dtype=dtype)
    with torch.no_grad():
        views = [TrainView(c, render(truth, c).rgb.clamp(0, 1)) for c in cameras]
    return views, random_model(120, seed=22, spread=1.6, log_scale=(-2.5, -1.2), dtype=dtype)


def train(engine, views: list[TrainView], batch_size: int, steps: range = range(STEPS)):
    """Steps with two densifications (the second pruning large ones) and an opacity
    reset between them; the losses and the fraction of rows each step updated."""
    touched = []

    def count_touched(engine) -> None:
        if isinstance(engine.rows, OffloadedRows):
            touched.append(len(engine.rows.pending.rows) / len(engine.model))
    losses = scheduled_run(engine, views, batch_size, steps, densify={12: False, 30: True},
                           reset=21, grad_threshold=2e-3, after_forward=count_touched)
    return losses, touched


def assert_same_sets(actual: dict, expected: dict, rtol: float) -> None:
    """Equal row for row, each tensor to ``rtol`` of its largest value."""
    a, e = state_by_key(actual), state_by_key(expected)
    assert torch.equal(a["keys"], e["keys"])
    for name in e:
        scale = float(e[name].abs().max()) if e[name].numel() else 0.0
        torch.testing.assert_close(a[name], e[name], rtol=rtol, atol=rtol * scale,
                                   msg=lambda m, name=name: f"{name}: {m}")


@pytest.fixture(scope="module")
def local_runs():
    runs = {}
    for dtype in (torch.float64, torch.float32):
        views, model = offload_scene(dtype)
        for batch_size in (1, 4):
            engine = make_engine(model.detach(), batch_size, torch.zeros(3, dtype=dtype))
            losses, _ = train(engine, views, batch_size)
            runs[dtype, batch_size] = losses, engine.state_dict()
    return runs


# The host Adam replays with the dense step's own code, and the working set renders
# exactly what the whole model renders: the engines agree bit for bit.
@pytest.mark.parametrize("dtype, rtol", [(torch.float64, 0.0), (torch.float32, 0.0)])
@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("forwarding, lookahead", [(True, True), (True, False),
                                                   (False, True), (False, False)])
def test_offloaded_training_equals_local(local_runs, dtype, rtol, batch_size, forwarding,
                                         lookahead):
    views, model = offload_scene(dtype)
    engine = offloaded(model.detach(), batch_size, torch.zeros(3, dtype=dtype),
                       forwarding=forwarding, lookahead=lookahead)
    losses, touched = train(engine, views, batch_size)
    expected_losses, expected = local_runs[dtype, batch_size]
    np.testing.assert_allclose(losses, expected_losses, rtol=rtol)
    assert_same_sets(engine.state_dict(), expected, rtol)
    if batch_size == 1:  # the deferred path carried real weight
        assert np.mean(touched) < 0.6


# Under a budget, MCMC (whose regularisers give every row a gradient each step), and
# AbsGS's statistic.
@pytest.mark.parametrize("run", [capped_run, mcmc_run, absgrad_run])
@pytest.mark.parametrize("forwarding, lookahead", [(True, True), (False, False)])
def test_offloaded_strategies_equal_local(run, forwarding, lookahead):
    views, model = densifying_scene()
    local = make_engine(model.detach(), 2, torch.zeros(3))
    expected_losses = run(local, views)
    engine = offloaded(model.detach(), 2, torch.zeros(3), forwarding=forwarding,
                       lookahead=lookahead)
    np.testing.assert_allclose(run(engine, views), expected_losses, rtol=0)
    assert_same_sets(engine.state_dict(), local.state_dict(), 0.0)


def hinted(engine, hint: str) -> list[int]:
    """``engine`` told the truth about the next step, or something else; the rows of
    each step that were sent a step early."""
    expect, forward_backward, early = engine.expect, engine.forward_backward, []
    if hint == "other cameras":
        elsewhere = look_at_camera([0.0, 5.0, 0.0], [0.0, 0.0, 0.1], 40, 30, focal=90,
                                   dtype=engine.model.means.dtype)
        engine.expect = lambda cameras, rates: expect([elsewhere], rates)
    elif hint == "other rates":
        engine.expect = lambda cameras, rates: expect(cameras, {**rates, "sh0": 1e-3})

    def recorded(*args, **kwargs):
        result = forward_backward(*args, **kwargs)
        early.append(result.diagnostics["sent_a_step_early"])
        return result
    engine.forward_backward = recorded
    return early


@pytest.mark.parametrize("hint", ["true", "other cameras", "other rates"])
def test_rows_sent_a_step_early_change_nothing(local_runs, hint):
    """The next step's rows, sent while this one's backward pass runs, are used when
    the step goes as the caller said, and dropped when it does not: either way the
    run is the run on one device, bit for bit."""
    views, model = offload_scene()
    engine = offloaded(model.detach(), 1, torch.zeros(3, dtype=model.means.dtype),
                       lookahead=True)
    early = hinted(engine, hint)
    losses, _ = train(engine, views, 1)
    expected_losses, expected = local_runs[model.means.dtype, 1]
    np.testing.assert_allclose(losses, expected_losses, rtol=0)
    assert_same_sets(engine.state_dict(), expected, 0.0)
    served = sum(count > 0 for count in early)
    assert served > STEPS // 2 if hint == "true" else served == 0


def test_rows_sent_early_wait_for_the_step_they_were_sent_after():
    """A step computed again before Adam has taken the one they follow does not use
    them: their values are those after that step."""
    views, model = offload_scene()
    engine = offloaded(model.detach(), 1, torch.zeros(3, dtype=model.means.dtype),
                       lookahead=True)
    for step in range(2):
        engine.expect([views[step + 1].camera], TRAIN_RATES)
        engine.forward_backward([views[step]], GradientNorms())
        engine.optimizer_step(TRAIN_RATES)
    engine.expect([views[3].camera], TRAIN_RATES)
    engine.forward_backward([views[2]], GradientNorms())
    again = engine.forward_backward([views[3]], GradientNorms())  # no Adam step between
    assert again.diagnostics["sent_a_step_early"] == 0
    engine.optimizer_step(TRAIN_RATES)


@pytest.mark.parametrize("edit", ["opacity reset", "checkpoint loaded", "every row's gradient"])
def test_an_edit_drops_rows_sent_early(edit):
    """Rows sent a step early hold the values the step leaves to rows it does not
    see: where an edit after it (an opacity reset, a checkpoint loaded) or a gradient
    of every row (MCMC's regularisers) changes them, they are sent again."""
    views, model = offload_scene()
    background = torch.zeros(3, dtype=model.means.dtype)
    runs = []
    for engine in (make_engine(model.detach(), 1, background),
                   offloaded(model.detach(), 1, background, lookahead=True)):
        losses, saved = [], None
        for step in range(10):
            engine.expect([views[(step + 1) % len(views)].camera], TRAIN_RATES)
            result = engine.forward_backward(
                [views[step % len(views)]], GradientNorms(),
                regularisers=Regularisers() if (step, edit) == (6, "every row's gradient")
                else None)
            losses.append((result.loss, result.diagnostics.get("sent_a_step_early")))
            engine.optimizer_step(TRAIN_RATES)
            if step == 3:
                saved = copy.deepcopy(engine.state_dict())
            if (step, edit) == (6, "opacity reset"):
                engine.edit_rows(lambda rows, total: reset_opacity(rows))
            elif (step, edit) == (6, "checkpoint loaded"):
                engine.load_state_dict(saved)
        runs.append((losses, engine.state_dict()))
    (local_losses, local_state), (losses, state) = runs
    assert [loss for loss, _ in losses] == [loss for loss, _ in local_losses]
    assert_same_sets(state, local_state, 0.0)
    early = [count for _, count in losses]
    assert early[7] == 0 and sum(early[1:7]) > 0 and sum(early[8:]) > 0, str(early)


def dense_and_deferred(seed: int, rows: int = 300):
    generator = torch.Generator().manual_seed(seed)
    params = {"a": torch.randn(rows, 3, generator=generator, dtype=torch.float64),
              "b": torch.randn(rows, 2, 4, generator=generator, dtype=torch.float64)}
    dense = Rows.of({n: t.clone() for n, t in params.items()})
    deferred = Rows.of({n: t.clone() for n, t in params.items()})
    return (generator, (GaussianAdam(params, batch_size=2), dense), deferred,
            DeferredAdam(GaussianAdam(params, batch_size=2), deferred, rows))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_deferred_adam_equals_dense_adam(seed):
    generator, (dense_adam, dense), adam, deferred = dense_and_deferred(seed)
    rows = len(adam.params["a"])
    # Some rows are seen often, some rarely, some never (caught up by force only).
    chance = torch.rand(rows, generator=generator, dtype=torch.float64) ** 3
    chance[:20] = 0.0
    for step in range(60):
        rates = {"a": 0.01 * 0.97 ** step, "b": 0.003 if step < 30 else 0.02}
        seen = (torch.rand(rows, generator=generator, dtype=torch.float64) < chance).nonzero()[:, 0]
        grads = {n: torch.zeros_like(p) for n, p in dense.params.items()}
        for grad in grads.values():
            grad[seen] = torch.randn(len(seen), *grad.shape[1:], generator=generator,
                                     dtype=torch.float64)
        for name, param in dense.params.items():
            param.grad = grads[name]
        dense_adam.step(dense, rates)
        deferred.log_step(rates, {"a", "b"})
        update = torch.cat([seen, deferred.overdue()]).unique()
        deferred.write(deferred.advance(update, {n: g[update] for n, g in grads.items()}))
        assert deferred.step_count - int(deferred.updated_at.min()) < MAX_SKIPPED_STEPS
    assert (deferred.updated_at < deferred.step_count).any()  # rows were still deferred
    deferred.catch_up_all()
    for name in dense.params:
        # Replayed by the dense step's own code, eps included: equal, bit for bit.
        for mine, theirs in ((adam.params, dense.params),
                             (adam.moments["exp_avg"], dense.moments["exp_avg"]),
                             (adam.moments["exp_avg_sq"], dense.moments["exp_avg_sq"])):
            assert torch.equal(mine[name], theirs[name])


def test_culling_keeps_every_gaussian_the_exact_test_keeps_under_large_drift():
    model = random_model(3000, seed=5, spread=5.0, log_scale=(-4.0, -1.5))
    cameras = orbit_cameras(3, 48, 36, radius=5.0)[:1]
    params = {n: model.parameters()[n] for n in ("means", "log_scales")}
    deferred = DeferredAdam(GaussianAdam(params), Rows.of(params), len(model))
    generator = torch.Generator().manual_seed(0)
    rates = {"means": 0.3, "log_scales": 0.2}  # steps far larger than training's
    lagging = {n: t.clone() for n, t in params.items()}
    sizes = []
    for step in range(MAX_SKIPPED_STEPS + 5):
        deferred.log_step(rates, {"means", "log_scales"})
        # The first steps push every row; later only a few, the rest drift on momentum.
        pushed = torch.arange(len(model)) if step < 3 else torch.randperm(
            len(model), generator=generator)[:100]
        pushed = torch.cat([pushed, deferred.overdue()]).unique()
        grads = {n: torch.randn(len(pushed), 3, generator=generator, dtype=torch.float64)
                 for n in params}
        written = deferred.advance(pushed, grads)
        deferred.write(written)
        for name in params:
            lagging[name][pushed] = written.params[name]
        truth = deferred.advance(torch.arange(len(model))).params
        exact = visibility(GaussianModel(
            truth["means"], model.quats, truth["log_scales"], model.opacity_logits, model.sh0,
            model.shN), cameras).visible.any(dim=0)
        superset = candidates(lagging["means"], lagging["log_scales"],
                              deferred.reach("means", deferred.updated_at),
                              deferred.reach("log_scales", deferred.updated_at), cameras)
        assert not (exact & ~superset).any(), f"step {step}: the cull missed visible rows"
        sizes.append((int(exact.sum()), int(superset.sum())))
    # Without drift (every row just written) the bound is tight: it culls what it should.
    assert sizes[0][1] <= 1.2 * sizes[0][0] < 0.8 * len(model)


@pytest.mark.parametrize("first, second", [(offloaded, make_engine),
                                           (make_engine, offloaded),
                                           (offloaded, offloaded)])
def test_checkpoints_move_between_engines(first, second):
    views, model = offload_scene()
    straight = offloaded(model.detach(), 1, torch.zeros(3, dtype=torch.float64))
    train(straight, views, 1, range(20))
    engine = first(model.detach(), 1, torch.zeros(3, dtype=torch.float64))
    train(engine, views, 1, range(10))
    resumed = second(random_model(5), 1, torch.zeros(3, dtype=torch.float64))
    resumed.load_state_dict(engine.state_dict())
    train(resumed, views, 1, range(10, 20))
    assert_same_sets(resumed.state_dict(), straight.state_dict(), 1e-9)


def test_export_writes_the_caught_up_model(local_runs):
    views, model = offload_scene()
    engine = offloaded(model.detach(), 1, torch.zeros(3, dtype=torch.float64))
    train(engine, views, 1)
    part, = list(engine.model_parts())
    expected = state_by_key(local_runs[torch.float64, 1][1])
    order = torch.argsort(engine.model.keys)
    for name, tensor in part.parameters().items():
        torch.testing.assert_close(tensor[order], expected[name], rtol=1e-9, atol=1e-12)


def test_the_device_keeps_44_bytes_per_gaussian():
    views, model = offload_scene(torch.float32)
    engine = offloaded(model.detach(), 1, torch.zeros(3))
    engine.forward_backward(views[:1], GradientNorms())  # the statistics exist once observed
    memory = engine.rows.memory_per_gaussian()
    assert memory["device"] == 44  # means, log-scales, quaternions, the step written
    assert memory["host"] == 59 * 4 * 3 + 8 + 8 + 8  # params, Adam moments, key, step, stats


SHARDED_STEPS = 32  # both densifications and the opacity reset


def offloaded_rank(rank: int, world: int, init_file: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    views, model = offload_scene()
    engine = make_engine(shard_of(model, rank, world), 2, torch.zeros(3, dtype=torch.float64),
                         offload=OffloadOptions(forwarding=rank == 0, lookahead=rank == 1),
                         # rebalance after every densification
                         ranks=RankOptions(max_imbalance=1.0))
    losses, touched = train(engine, views, 2, range(SHARDED_STEPS))
    views, model = densifying_scene()
    mcmc = make_engine(shard_of(model, rank, world), 2, torch.zeros(3),
                       offload=OffloadOptions(forwarding=rank == 0),
                       ranks=RankOptions(max_imbalance=1.0))
    mcmc_losses = mcmc_run(mcmc, views)
    torch.save((losses, touched, engine.state_dict(), mcmc_losses, mcmc.state_dict()),
               f"{out}.{rank}")
    dist.destroy_process_group()


def test_ranks_that_offload_their_shards_equal_one_device(tmp_path):
    views, model = offload_scene()
    local = make_engine(model.detach(), 2, torch.zeros(3, dtype=torch.float64))
    expected_losses, _ = train(local, views, 2, range(SHARDED_STEPS))
    out = tmp_path / "state"
    mp.spawn(offloaded_rank, args=(2, str(tmp_path / "init"), str(out)), nprocs=2)
    ranks = [torch.load(f"{out}.{r}", weights_only=False) for r in range(2)]
    np.testing.assert_allclose(ranks[0][0], expected_losses, rtol=1e-9)
    assert np.mean(ranks[0][1]) < 0.9  # rows were deferred on the ranks too
    assert_same_sets(concat_states([rank[2] for rank in ranks]), local.state_dict(), 1e-9)
    views, model = densifying_scene()
    local = make_engine(model.detach(), 2, torch.zeros(3))
    np.testing.assert_allclose(ranks[0][3], mcmc_run(local, views), rtol=1e-9)
    assert_same_sets(concat_states([rank[4] for rank in ranks]), local.state_dict(), 1e-9)


def test_the_cli_offloads_and_resumes_on_one_device(tmp_path):
    """Offloaded, looking ahead, then resumed: the model a resident run trains."""
    from splatscale.cli import main
    from splatscale.model.ply import read_ply

    common = ["--batch-size", "2", "--quiet", "--cache-dir", str(tmp_path / "cache")]
    assert main(["train", "-o", str(tmp_path / "a"), "--iterations", "20", "--offload",
                 "--lookahead", "--checkpoint-every", "20", *common]) == 0
    assert main(["train", "-o", str(tmp_path / "a"), "--iterations", "40", "--resume",
                 *common]) == 0
    assert main(["train", "-o", str(tmp_path / "b"), "--iterations", "40", *common]) == 0
    resumed, straight = (read_ply(tmp_path / run / "point_cloud.ply") for run in "ab")
    for name, tensor in straight.parameters().items():
        assert torch.equal(resumed.parameters()[name], tensor), name


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])])
def test_copies_land_whole_and_are_counted(device):
    """Copies in flight on the copy stream are read from the compute stream only after
    they land, from staging buffers (pinned on a GPU) or any host tensor."""
    transfers = Transfers(torch.device(device))
    staged = transfers.staging((1 << 22, 3), torch.float32)
    assert staged.is_pinned() == (device == "cuda")
    staged.copy_(torch.randn(staged.shape))
    plain = torch.arange(1 << 20)
    if device == "cuda":  # the copies start late: a read that did not wait would see it
        with torch.cuda.stream(transfers.stream):
            torch.cuda._sleep(10 ** 8)
    in_flight = transfers.send({"staged": staged, "plain": plain})
    busy = torch.randn(2048, 2048, device=device)
    busy = busy @ busy  # the compute stream works while the copies run
    landed = in_flight.ready()
    sums = {name: float(t.double().sum()) for name, t in landed.items()}
    assert sums == {"staged": float(staged.double().sum()), "plain": float(plain.sum())}
    assert all(t.device.type == device for t in landed.values())
    back = transfers.download({"plain": landed["plain"] * 2}).ready()
    assert torch.equal(back["plain"], plain * 2)
    assert transfers.bytes == {"host_to_device": staged.nbytes + plain.nbytes,
                               "device_to_host": plain.nbytes}


def test_the_trainer_tells_the_rows_the_next_batch(tmp_path):
    """Through the Trainer's hints, most steps find their rows sent a step early, and
    the run is the one on one device. (A step that raises the SH degree takes a band of
    coefficients on: what was sent before it is dropped.)"""
    runs, rose = {}, {}
    for name, engine_factory in (("local", make_engine),
                                 ("ahead", partial(offloaded, lookahead=True))):
        trainer = make_trainer(tmp_path / name, make_engine=engine_factory, **SHORT)
        runs[name], rose[name] = [], []
        for _ in range(30):
            degree = trainer.sh_degree
            runs[name].append(trainer.train_step())
            rose[name].append(trainer.sh_degree != degree)
    assert [r["loss"] for r in runs["ahead"]] == [r["loss"] for r in runs["local"]]
    steady = [r for r, risen in zip(runs["ahead"], rose["ahead"]) if not risen]
    early = [r["diagnostics"]["sent_a_step_early"] > 0 for r in steady]
    assert len(steady) >= 25 and sum(early) > len(early) // 2

"""Per-image colour transforms (``--appearance affine``): the transform and its fit
against their definitions, their Adam against torch's, every engine against one
process in float64, resume and checkpoints, and the default untouched."""

from __future__ import annotations

import json
import math

import numba
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from splatscale.cli import main
from splatscale.engine import TrainView
from splatscale.engine.distributed.cost_model import RowCost
from splatscale.engine.state import concat_states
from splatscale.engine.factory import OffloadOptions, RankOptions, make_engine, shard_of
from splatscale.errors import DataError
from splatscale.step import appearance
from splatscale.step.appearance import Appearance, apply, fit, fitted_right_half
from splatscale.step.loss import psnr
from splatscale.step.optimizer import batch_hyperparameters
from splatscale.train.checkpoint import load_checkpoint
from splatscale.train.config import TrainConfig
from tests.conftest import TRAIN_RATES, densifying_scene, state_by_key
from tests.test_training import SHORT, make_trainer

STEPS = 6
BATCH = 2
LR = 0.05  # the transforms' rate in the engine runs: large enough to move in 6 steps


def random_transform(seed: int) -> torch.Tensor:
    """A transform near the identity, as a photo's exposure and white balance make."""
    g = torch.Generator().manual_seed(seed)
    return torch.eye(3, 4, dtype=torch.float64) + 0.2 * (torch.rand(3, 4, generator=g,
                                                                     dtype=torch.float64) - 0.5)


def test_a_transform_maps_each_pixel_by_its_matrix_and_offset():
    rgb = torch.rand(5, 7, 3, dtype=torch.float64)
    t = random_transform(1)
    want = torch.einsum("ck,hwk->hwc", t[:, :3], rgb) + t[:, 3]
    torch.testing.assert_close(apply(rgb, t), want, rtol=1e-15, atol=1e-15)
    assert apply(rgb, None) is rgb, "no transform: the render itself, untouched"


def test_the_identity_maps_a_float32_render_exactly():
    """What the default's equality below rests on: x 1 + y 0 + z 0 + 0 is x."""
    rgb = torch.rand(9, 11, 3) * 3 - 1
    assert torch.equal(apply(rgb, appearance.identity(1)[0]), rgb)


def test_the_fit_recovers_a_transform_from_the_left_half_alone():
    render = torch.rand(16, 20, 3, dtype=torch.float64)
    t = random_transform(2)
    photo = apply(render, t)
    torch.testing.assert_close(fit(render, photo), t, rtol=0, atol=1e-12)
    changed = photo.clone()
    changed[:, 10:] = 0.5  # the right half is what it is scored on, never fitted to
    mapped, right = fitted_right_half(render, changed)
    torch.testing.assert_close(mapped, photo[:, 10:].clamp(0, 1), rtol=0, atol=1e-12)
    assert torch.equal(right, changed[:, 10:])


def test_the_fit_counts_only_masked_in_pixels():
    render = torch.rand(8, 12, 3, dtype=torch.float64)
    t = random_transform(4)
    mask = (torch.rand(8, 12, 1, dtype=torch.float64) > 0.3).to(torch.float64)
    photo = torch.cat([torch.where(mask > 0, apply(render, t), torch.rand(8, 12, 3,
                                                                          dtype=torch.float64)),
                       mask], -1)
    torch.testing.assert_close(fit(render, photo), t, rtol=0, atol=1e-12)
    assert torch.equal(fitted_right_half(render, photo)[1], photo[:, 6:]), "the mask kept"
    photo[..., 3] = 0
    assert torch.equal(fit(render, photo), appearance.identity(1)[0]), "nothing to fit to"


def test_the_fit_of_a_flat_render_is_the_least_squares_offset():
    """A render of one colour fixes no matrix: the minimum-norm fit still maps it to
    the photo's mean, the best any transform does."""
    render = torch.full((6, 8, 3), 0.25, dtype=torch.float64)
    photo = torch.rand(6, 8, 3, dtype=torch.float64)
    mapped = apply(render, fit(render, photo))
    torch.testing.assert_close(mapped, photo.mean((0, 1)).expand_as(photo), rtol=0, atol=1e-12)


def as_maps(transforms: torch.Tensor) -> torch.Tensor:
    """[n, 3, 4] transforms as [n, 4, 4] affine maps."""
    maps = torch.eye(4, dtype=transforms.dtype).repeat(len(transforms), 1, 1)
    maps[:, :3] = transforms
    return maps


def pinned(transforms: torch.Tensor) -> torch.Tensor:
    """Each transform composed with the inverse of their mean, solved as 4x4 maps."""
    maps = as_maps(transforms)
    mean = maps.mean(0)
    return torch.linalg.solve(mean.T, maps.transpose(1, 2)).transpose(1, 2)[:, :3]


def test_adam_with_the_pull_equals_torch_adam_with_the_batch_rule():
    """Two steps of a batch of 2, then one without image 1 (its moments carry it on):
    torch.optim.Adam on the dense tensor, with the batch rule's settings and the pull's
    gradient, 2 PULL (T - I) / B for each view of the batch, the transforms then
    composed with the inverse of their mean."""
    images, batch_size, lr = 4, 2, 0.01
    ours = Appearance(images, batch_size)
    reference = appearance.identity(images).requires_grad_()
    h = batch_hyperparameters(lr, batch_size, eps=appearance.EPS)
    adam = torch.optim.Adam([reference], lr=h.lr, betas=(h.beta1, h.beta2), eps=h.eps)
    g = torch.Generator().manual_seed(3)
    for ids in ([1, 2], [2, 1], [3, 0]):
        leaves = ours.leaves(ids)
        grads = [torch.randn(3, 4, generator=g, dtype=torch.float64) for _ in ids]
        for leaf, grad in zip(leaves, grads):
            leaf.grad = grad
        ours.step(ids, leaves, lr)
        dense = torch.zeros(images, 3, 4, dtype=torch.float64)
        for i, grad in zip(ids, grads):
            dense[i] = grad + 2 * appearance.PULL / len(ids) * (
                reference.detach()[i] - torch.eye(3, 4, dtype=torch.float64))
        reference.grad = dense
        adam.step()
        with torch.no_grad():
            reference.copy_(pinned(reference))
        torch.testing.assert_close(ours.transforms, reference.detach(), rtol=1e-12, atol=1e-15)
    assert ours.transforms.grad is None


def test_the_training_transforms_mean_is_held_at_the_identity():
    """A common change of every training photo goes to the scene's colours, not to
    the transforms; a test view's transform stays the identity."""
    ours = Appearance(4, 1, trained=[1, 2, 3])
    for i in (1, 2, 3):
        leaf, = ours.leaves([i])
        leaf.grad = torch.full((3, 4), -1.0, dtype=torch.float64)  # every photo brighter
        ours.step([i], [leaf], 0.01)
        torch.testing.assert_close(ours.transforms[1:].mean(0),
                                   torch.eye(3, 4, dtype=torch.float64), rtol=0, atol=1e-14)
    assert torch.equal(ours.transforms[0], torch.eye(3, 4, dtype=torch.float64))
    assert not torch.equal(ours.transforms[1], ours.transforms[2])


def test_the_rate_decays_from_the_reference_3dgs_exposure_rates():
    assert Appearance.learning_rate(0, 3000) == pytest.approx(appearance.LR_INIT)
    assert Appearance.learning_rate(3000, 3000) == pytest.approx(appearance.LR_FINAL)
    assert Appearance.learning_rate(1500, 3000) == pytest.approx(
        math.sqrt(appearance.LR_INIT * appearance.LR_FINAL))


# -- every engine equals one process in float64 --------------------------------------

def changed_views(dtype: torch.dtype = torch.float64) -> list[TrainView]:
    """densifying_scene's views, each photo's colours changed by a transform of its own."""
    views, _ = densifying_scene(dtype)
    return [TrainView(v.camera, apply(v.target, random_transform(10 + i)))
            for i, v in enumerate(views)]


def affine_run(engine, views: list[TrainView], colours: Appearance, lr: float = LR,
               steps: range = range(STEPS)) -> list[float]:
    """Batches of ``BATCH`` taken in turn, each view with its transform; the Gaussians
    and the transforms stepped after each; the losses."""
    losses = []
    for step in steps:
        ids = [(BATCH * step + k) % len(views) for k in range(BATCH)]
        leaves = colours.leaves(ids)
        batch = [TrainView(views[i].camera, views[i].target, appearance=leaf)
                 for i, leaf in zip(ids, leaves)]
        losses.append(engine.forward_backward(batch).loss)
        engine.optimizer_step(TRAIN_RATES)
        colours.step(ids, leaves, lr)
    return losses


def plain_run(engine, views: list[TrainView]) -> list[float]:
    """``affine_run``'s batches, without transforms."""
    losses = []
    for step in range(STEPS):
        losses.append(engine.forward_backward(
            [views[(BATCH * step + k) % len(views)] for k in range(BATCH)]).loss)
        engine.optimizer_step(TRAIN_RATES)
    return losses


def engine_runs(make) -> dict:
    """What each engine ``make()`` makes does: an affine run, and a run whose
    transforms stay the identity (rate 0) beside one without any."""
    views, _ = densifying_scene()
    results = {}
    engine, colours = make(), Appearance(len(views), BATCH)
    results["affine"] = (affine_run(engine, changed_views(), colours), engine.state_dict(),
                         colours.state_dict())
    still, none = make(), make()
    affine_run(still, views, Appearance(len(views), BATCH), lr=0.0)
    plain_run(none, views)
    results["identity"] = (still.state_dict(), none.state_dict())
    return results


def one_process(offload: OffloadOptions | None = None):
    _, model = densifying_scene()
    return lambda: make_engine(model.detach(), BATCH, torch.zeros(3, dtype=torch.float64),
                               offload=offload)


def rank_runs(rank: int, world: int, init_file: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    _, model = densifying_scene()
    results: dict = {}
    for name, offload in (("ranks", None), ("both", OffloadOptions(forwarding=rank == 0))):
        make = lambda: make_engine(  # noqa: E731
            shard_of(model.detach(), rank, world), BATCH, torch.zeros(3, dtype=torch.float64),
            # Fixed costs: the bands are the same in every run (measured ones differ).
            offload=offload, ranks=RankOptions(fixed_cost=RowCost(0.05, 1.0)))
        results[name] = engine_runs(make)
    views = changed_views()
    results["bands"] = make().forward_backward(views[:BATCH]).diagnostics["bands"]
    torch.save(results, f"{out}.{rank}")
    dist.destroy_process_group()


def assert_same_states(got: dict, want: dict, rtol: float, what: str) -> None:
    got, want = state_by_key(got), state_by_key(want)
    assert torch.equal(got["keys"], want["keys"]), what
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=rtol, atol=rtol * 1e-5,
                                   msg=lambda m, name=name: f"{what} {name}: {m}")


@pytest.fixture(scope="module")
def local():
    return engine_runs(one_process())


def test_the_transforms_learn_the_photos_changes(local):
    losses, _, state = local["affine"]
    assert losses[-1] < losses[0]
    moved = (state["transforms"] - appearance.identity(len(state["transforms"]))).abs()
    assert bool((moved.flatten(1).max(1).values > 1e-3).all()), "every view's moved"


def test_a_run_with_identity_transforms_trains_the_gaussians_as_one_without(local):
    """The transform's path (applied, its gradient taken, summed over ranks) changes
    nothing of the Gaussians' when it is the identity: the default's result is today's."""
    still, none = local["identity"]
    for name, tensor in state_by_key(none).items():
        assert torch.equal(state_by_key(still)[name], tensor), name


def test_offload_equals_one_process(local):
    got = engine_runs(one_process(OffloadOptions(forwarding=False)))
    assert got["affine"][0] == local["affine"][0]
    assert_same_states(got["affine"][1], local["affine"][1], 0, "offload")
    for name, tensor in local["affine"][2].items():
        assert torch.equal(torch.as_tensor(got["affine"][2][name]), torch.as_tensor(tensor)), name


def test_ranks_and_ranks_that_offload_equal_one_process(local, tmp_path):
    out = tmp_path / "ranks"
    mp.spawn(rank_runs, args=(2, str(tmp_path / "init"), str(out)), nprocs=2)
    ranks = [torch.load(f"{out}.{r}", weights_only=False) for r in range(2)]
    bands = ranks[0]["bands"]
    assert {b.camera for b in bands[0]} & {b.camera for b in bands[1]}, \
        f"an image's rows on both ranks, its transform's gradient summed: {bands}"
    want_losses, want_state, want_colours = local["affine"]
    for name in ("ranks", "both"):
        losses = ranks[0][name]["affine"][0]
        assert losses == pytest.approx(want_losses, rel=1e-12), name
        assert_same_states(concat_states([r[name]["affine"][1] for r in ranks]), want_state, 1e-9,
                           name)
        for r in ranks:  # every rank holds the same transforms, the single process' too
            for key in ("transforms", "exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(r[name]["affine"][2][key], want_colours[key],
                                           rtol=1e-9, atol=1e-15, msg=f"{name} {key}")
        still = concat_states([r[name]["identity"][0] for r in ranks])
        none = concat_states([r[name]["identity"][1] for r in ranks])
        for key, tensor in state_by_key(none).items():
            assert torch.equal(state_by_key(still)[key], tensor), (name, key)


# -- the Trainer: resume, checkpoints, evaluation ------------------------------------

def test_resume_continues_the_transforms_bit_for_bit(tmp_path):
    settings = {**SHORT, "appearance": "affine"}
    straight = make_trainer(tmp_path / "a", **settings)
    for _ in range(40):
        straight.train_step()
    first = make_trainer(tmp_path / "b", **settings)
    for _ in range(20):
        first.train_step()
    first.options.output.mkdir(parents=True)
    first.save_checkpoint()
    resumed = make_trainer(tmp_path / "b", **settings)
    resumed.resume(first.options.output / "checkpoint.pt")
    for _ in range(20):
        resumed.train_step()
    a, b = straight.appearance.state_dict(), resumed.appearance.state_dict()
    assert a["steps"] == b["steps"] == 40
    for key in ("transforms", "exp_avg", "exp_avg_sq"):
        assert torch.equal(a[key], b[key]), key
    assert not torch.equal(a["transforms"], appearance.identity(len(a["transforms"])))
    for name, tensor in straight.engine.state_dict()["model"].items():
        assert torch.equal(tensor, resumed.engine.state_dict()["model"][name]), name


@pytest.fixture(scope="module")
def affine_checkpoint(tmp_path_factory):
    """A checkpoint of a run with transforms, and its trainer, after 4 steps."""
    folder = tmp_path_factory.mktemp("affine")
    trainer = make_trainer(folder, **{**SHORT, "appearance": "affine"})
    for _ in range(4):
        trainer.train_step()
    trainer.options.output.mkdir(parents=True)
    trainer.save_checkpoint()
    return trainer.options.output / "checkpoint.pt"


def tampered(path, tmp_path, change) -> object:
    state = torch.load(path, weights_only=False)
    change(state["trainer"])
    torch.save(state, tmp_path / "checkpoint.pt")
    return tmp_path / "checkpoint.pt"


@pytest.mark.parametrize("change, message", [
    (lambda t: t.pop("appearance"), "its config's appearance is 'affine', but it lacks"),
    (lambda t: t["config"].update(appearance="none"), "'none', but it holds"),
    (lambda t: t["appearance"].update(transforms=torch.zeros(3, 3, 4)),
     "its transforms must be float64"),
    (lambda t: t["appearance"]["exp_avg"].__setitem__(0, math.nan), "exp_avg holds NaN"),
    (lambda t: t["appearance"]["exp_avg_sq"].__setitem__(0, -1.0), "negative"),
    (lambda t: t["appearance"].update(steps=-1), "its steps must be a count"),
    (lambda t: t["appearance"].pop("batch_size"), "not a set of"),
])
def test_a_malformed_appearance_state_is_refused_in_one_line(affine_checkpoint, tmp_path,
                                                              change, message):
    with pytest.raises(DataError, match=message) as caught:
        load_checkpoint(tampered(affine_checkpoint, tmp_path, change))
    assert "\n" not in str(caught.value)


def test_transforms_of_another_image_count_are_refused_on_resume(affine_checkpoint, tmp_path):
    def fewer(trainer: dict) -> None:
        for key in ("transforms", "exp_avg", "exp_avg_sq"):
            trainer["appearance"][key] = trainer["appearance"][key][:-1].clone()
    path = tampered(affine_checkpoint, tmp_path, fewer)
    resumed = make_trainer(tmp_path / "run", **{**SHORT, "appearance": "affine"})
    with pytest.raises(DataError, match="not this scene's"):
        resumed.resume(path)


def test_a_run_without_transforms_keeps_none(tmp_path):
    trainer = make_trainer(tmp_path, **SHORT)
    trainer.train_step()
    assert trainer.appearance is None and "appearance" not in trainer.state_dict()
    trainer.options.output.mkdir(parents=True)
    assert "fitted_affine_right_half" not in trainer.evaluate(ids=[0])


def test_evaluation_reports_both_scores(tmp_path):
    """The plain scores of the test views as before, and beside them the right halves'
    under the transform fitted on each left half."""
    trainer = make_trainer(tmp_path, **{**SHORT, "appearance": "affine"})
    for _ in range(3):
        trainer.train_step()
    scores = trainer.evaluate(ids=[0, 1])
    renders = [trainer.engine.render(trainer.store.camera(i)).rgb.clamp(0, 1).cpu()
               for i in (0, 1)]
    photos = [trainer.store.as_float(i) for i in (0, 1)]
    assert scores["psnr"] == pytest.approx(sum(psnr(r, p) for r, p in zip(renders, photos)) / 2)
    fitted = [psnr(*fitted_right_half(r, p)) for r, p in zip(renders, photos)]
    assert scores["fitted_affine_right_half"]["psnr"] == pytest.approx(sum(fitted) / 2)
    assert "ssim" in scores["fitted_affine_right_half"]


def test_the_command_line_trains_reports_and_resumes_with_transforms(tmp_path, capfd):
    out, cache = tmp_path / "run", ["--cache-dir", str(tmp_path / "cache")]
    assert main(["train", "-o", str(out), "--iterations", "16", "--batch-size", "2", "--eval",
                 "--appearance", "affine", "--quiet", *cache]) == 0
    report = json.loads(capfd.readouterr().out)
    assert report["appearance"] == "affine"
    assert set(report["test"]["fitted_affine_right_half"]) >= {"psnr", "ssim"}
    assert json.loads((out / "config.json").read_text())["appearance"] == "affine"
    saved = load_checkpoint(out / "checkpoint.pt")[0]["appearance"]
    assert main(["train", "-o", str(out), "--resume", "--iterations", "24", "--appearance",
                 "none", "--quiet", *cache]) == 0
    captured = capfd.readouterr()
    assert "--appearance none ignored" in captured.err
    resumed = load_checkpoint(out / "checkpoint.pt")[0]["appearance"]
    assert resumed["steps"] == saved["steps"] + 4, "the resumed run kept its transforms"


def test_a_setting_of_another_kind_is_refused(tmp_path):
    with pytest.raises(DataError, match="config: appearance must be 'none' or 'affine', "
                                        "not 'bilateral'"):
        TrainConfig.from_dict({"appearance": "bilateral"}, "checkpoint.pt: config")

"""Masks: the loss over masked-in pixels only, on every engine, and nothing under a mask
reaches training."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numba
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from splatscale.data.colmap import read_colmap
from splatscale.data.images import ImageStore, pixels_as_float
from splatscale.engine import TrainView
from splatscale.engine.distributed.cost_model import RowCost
from splatscale.engine.factory import OffloadOptions, RankOptions, make_engine, shard_of
from splatscale.engine.state import concat_states
from splatscale.step.loss import photometric_loss, psnr
from splatscale.step.ssim import ssim_cpu, ssim_map, ssim_torch
from splatscale.step.view_loss import band_loss, masked_in_values
from splatscale.strategy.default import GradientNorms
from splatscale.train.metrics import ImageMetrics
from tests.conftest import (absgrad_run, data_path, densifying_run, densifying_scene,
                            state_by_key)


def disc_mask(height: int, width: int, dtype=torch.float64) -> torch.Tensor:
    """[h, W]: 0 in a disc off the centre and in the two left columns, 1 elsewhere."""
    y, x = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    inside = (y - 0.4 * height) ** 2 + (x - 0.6 * width) ** 2 > (0.25 * height) ** 2
    inside &= x >= 2
    return inside.to(dtype)


def with_mask(target: torch.Tensor, under: torch.Tensor | None = None) -> torch.Tensor:
    """``target`` with ``disc_mask`` as its fourth channel; ``under``, where given,
    replaces its colours under the mask."""
    mask = disc_mask(*target.shape[:2], dtype=target.dtype)
    colours = target if under is None else torch.where(mask[..., None] > 0, target, under)
    return torch.cat([colours, mask[..., None]], dim=-1)


def masked_scene(noise: bool, dtype=torch.float64) -> tuple[list[TrainView], object]:
    """``densifying_scene`` with a mask on every view; under it the photo, or noise."""
    views, model = densifying_scene(dtype)
    generator = torch.Generator().manual_seed(5)
    masked = []
    for view in views:
        under = torch.rand(view.target.shape, generator=generator, dtype=view.target.dtype)
        masked.append(TrainView(view.camera, with_mask(view.target, under if noise else None)))
    return masked, model


def reference_loss(image, target, mask, ssim_weight=0.2):
    """The masked loss from its definition: the mean over masked-in pixels of L1, and of
    SSIM's map where, under the mask, the photo is replaced by the render."""
    inside = mask[..., None] > 0
    goal = torch.where(inside, target, image.detach())
    image = torch.where(inside, image, image.detach())
    count = 3 * mask.sum()
    l1 = ((image - goal).abs() * inside).sum() / count
    dssim = 1 - (ssim_map(image, goal) * inside).sum() / count
    return (1 - ssim_weight) * l1 + ssim_weight * dssim


def test_masked_loss_is_its_definition_and_ignores_what_lies_under_the_mask():
    torch.manual_seed(0)
    image = torch.rand(23, 29, 3, dtype=torch.float64, requires_grad=True)
    target = torch.rand(23, 29, 3, dtype=torch.float64)
    mask = disc_mask(23, 29)
    noise = torch.rand(23, 29, 3, dtype=torch.float64)
    loss = photometric_loss(image, with_mask(target))
    grad, = torch.autograd.grad(loss, image)
    want = reference_loss(image, target, mask)
    want_grad, = torch.autograd.grad(want, image)
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=0)
    torch.testing.assert_close(grad, want_grad, rtol=1e-10, atol=1e-16)
    assert torch.all(grad[mask == 0] == 0), "no gradient reaches a masked-out pixel"
    noisy = photometric_loss(image, with_mask(target, noise))
    assert torch.equal(noisy, loss)
    assert torch.equal(torch.autograd.grad(noisy, image)[0], grad)
    # PSNR over the masked-in pixels.
    inside = mask[..., None].expand(-1, -1, 3) > 0
    mse = ((image.detach().clamp(0, 1) - target)[inside] ** 2).mean()
    assert psnr(image.detach(), with_mask(target, noise)) == pytest.approx(
        float(-10 * torch.log10(mse)), rel=1e-12)


def test_masked_band_shares_add_up_to_the_whole_image():
    torch.manual_seed(1)
    image = torch.rand(37, 41, 3, dtype=torch.float64, requires_grad=True)
    target = with_mask(torch.rand(37, 41, 3, dtype=torch.float64))
    count = masked_in_values(target)
    assert count == 3 * int(disc_mask(37, 41).sum())
    whole, whole_error = band_loss(image, target, (0, 37), count, 0.2)
    total, errors = 0.0, 0.0
    for y0, y1 in ((0, 9), (9, 30), (30, 37)):
        lo, hi = max(0, y0 - 5), min(37, y1 + 5)
        share, error = band_loss(image[lo:hi], target[lo:hi], (y0 - lo, y1 - lo), count, 0.2)
        total, errors = total + share, errors + error
    torch.testing.assert_close(total, whole, rtol=1e-12, atol=0)
    assert errors == pytest.approx(whole_error, rel=1e-12)


def test_the_masked_ssim_of_torch_equals_the_fused_kernel():
    """The cuda backend's SSIM (torch) and the cpu backend's (numba), weighted by a mask,
    over a band: value and gradient."""
    torch.manual_seed(3)
    image = torch.rand(30, 26, 3, dtype=torch.float64, requires_grad=True)
    target = torch.rand(30, 26, 3, dtype=torch.float64)
    mask = disc_mask(30, 26)
    values = [ssim(image, target, (4, 21), 999, mask) for ssim in (ssim_cpu, ssim_torch)]
    grads = [torch.autograd.grad(value, image)[0] for value in values]
    torch.testing.assert_close(values[0], values[1], rtol=1e-12, atol=0)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-10, atol=1e-15)


# Without masks, what commit 68d7002 (before masks) gave, computed by
# ``without_masks``: per dtype and case the loss, the squared error and a digest of the
# gradient; the test metrics (PSNR, SSIM); digests of two snowmiku images at half size.
BEFORE_MASKS = {
    "torch.float32/whole": ["0.4516655206680298", "777.1714543078854", "450f2b082fe48faa"],
    "torch.float32/band": ["0.18951508402824402", "321.39091565499825", "8078ed3c288aaf50"],
    "torch.float32/whole_pixels": ["0.12433743476867676", "208.35845298343258",
                                   "59070962d928f1b9"],
    "torch.float32/metrics": ["7.675899950251759", "0.09812363982200623"],
    "torch.float64/whole": ["0.4420241442255934", "747.3602037297783", "5a6571000939a1a2"],
    "torch.float64/band": ["0.1829300606815426", "302.0590988820443", "2173436632b95e06"],
    "torch.float64/whole_pixels": ["0.12220730311647733", "204.522006931399",
                                   "41ad0dade4ba848f"],
    "torch.float64/metrics": ["7.8457686701576845", "0.11023066937923431"],
    "images": ["7417376c8b6deb3c", "5e940232a0111a77"],
}


def digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.detach().contiguous().numpy().tobytes()).hexdigest()[:16]


def without_masks(cache: Path) -> dict:
    """The loss of a view, of a band and with whole pixels (AbsGS's), the test metrics,
    and two images as the store reads them: every path masks change, without masks."""
    found = {}
    for dtype in (torch.float32, torch.float64):
        generator = torch.Generator().manual_seed(7)
        rgb = torch.rand(37, 41, 3, generator=generator, dtype=dtype).requires_grad_(True)
        target = torch.rand(37, 41, 3, generator=generator, dtype=dtype)
        for name, own, whole_pixels in (("whole", (0, 37), False), ("band", (5, 20), False),
                                        ("whole_pixels", (10, 20), True)):
            loss, error = band_loss(rgb, target, own, 3 * 37 * 41, 0.2, whole_pixels)
            grad, = torch.autograd.grad(loss, rgb)
            found[f"{dtype}/{name}"] = [repr(loss.item()), repr(error), digest(grad)]
        metrics = ImageMetrics()
        metrics.add(rgb.detach(), target)
        found[f"{dtype}/metrics"] = [repr(metrics.scores[name][0]) for name in ("psnr", "ssim")]
    store = ImageStore(read_colmap(data_path("snowmiku")), resolution=2, cache_dir=cache)
    found["images"] = [digest(store.image(i)) for i in (0, 5)]
    return found


def test_without_masks_everything_is_as_it_was_bit_for_bit(tmp_path):
    assert without_masks(tmp_path) == BEFORE_MASKS


def test_a_mask_of_ones_is_no_mask():
    """A mask that keeps every pixel gives the loss without one."""
    torch.manual_seed(2)
    image = torch.rand(19, 21, 3, dtype=torch.float32, requires_grad=True)
    target = torch.rand(19, 21, 3, dtype=torch.float32)
    plain = photometric_loss(image, target)
    ones = torch.cat([target, torch.ones(19, 21, 1)], dim=-1)
    torch.testing.assert_close(photometric_loss(image, ones), plain, rtol=1e-6, atol=0)
    assert masked_in_values(target) == 3 * 19 * 21


def test_a_steps_psnr_is_over_the_masked_in_pixels():
    """The progress line's training PSNR: each view's over its masked-in pixels."""
    views, model = masked_scene(noise=True)
    engine = make_engine(model.detach(), 2, torch.zeros(3))
    want = [psnr(engine.render(view.camera).rgb, view.target) for view in views[:2]]
    result = engine.forward_backward(views[:2], GradientNorms())
    assert result.psnr == pytest.approx(sum(want) / 2, rel=1e-12)


def one_process_run(views, model, run=densifying_run, **options):
    engine = make_engine(model.detach(), 2, torch.zeros(3), **options)
    return run(engine, views), engine.state_dict()


@pytest.fixture(scope="module")
def masked_runs():
    """One process on the masked scene, clean and noisy under the mask, with the 3DGS
    statistic and with AbsGS's."""
    return {(noise, run.__name__): one_process_run(*masked_scene(noise), run)
            for noise in (False, True) for run in (densifying_run, absgrad_run)}


def assert_same_state(got: dict, want: dict, exact: bool) -> None:
    got, want = state_by_key(got), state_by_key(want)
    for name in want:
        if exact:
            assert torch.equal(got[name], want[name]), name
        else:
            torch.testing.assert_close(got[name], want[name], rtol=1e-9, atol=1e-14, msg=name)


@pytest.mark.parametrize("run", ["densifying_run", "absgrad_run"])
def test_noise_under_the_mask_trains_the_same_model(masked_runs, run):
    clean_losses, clean = masked_runs[(False, run)]
    noisy_losses, noisy = masked_runs[(True, run)]
    assert noisy_losses == clean_losses
    assert len(clean["keys"]) != 60, "densification must have happened"
    assert_same_state(noisy, clean, exact=True)
    unmasked_losses, _ = one_process_run(*densifying_scene(), globals()[run])
    assert unmasked_losses != clean_losses, "the mask must change the run"


def test_the_cuda_backends_code_trains_with_masks_as_the_cpu_one(masked_runs):
    """The engine's code with the cuda backend (gsplat's torch references standing in
    for its kernels, on the CPU) trains the masked scene as the cpu backend does."""
    from tests.test_cuda_backend import STAND_INS

    losses, state = one_process_run(*masked_scene(True), densifying_run, backend=STAND_INS)
    want_losses, want = masked_runs[(False, "densifying_run")]
    torch.testing.assert_close(losses, want_losses, rtol=1e-9, atol=0)
    assert_same_state(state, want, exact=False)


@pytest.mark.parametrize("forwarding", [False, True])
def test_offload_with_masks_equals_one_process(masked_runs, forwarding):
    losses, state = one_process_run(*masked_scene(True), densifying_run,
                                    offload=OffloadOptions(forwarding=forwarding))
    want_losses, want = masked_runs[(False, "densifying_run")]
    assert losses == want_losses
    assert_same_state(state, want, exact=True)


def masked_rank(rank: int, world: int, init_file: str, out_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    results = {}
    # Bands cut by a fixed cost, not one fitted to measured times: runs compared bit for
    # bit must render the same bands, however busy the machine.
    options = RankOptions(fixed_cost=RowCost(), max_imbalance=1.0)
    for noise in (False, True):
        views, model = masked_scene(noise)
        for run in (densifying_run, absgrad_run):
            engine = make_engine(shard_of(model, rank, world), 2, torch.zeros(3), ranks=options)
            losses = run(engine, views)
            results[(noise, run.__name__)] = (losses, engine.state_dict())
    # Both: each rank's shard offloaded.
    views, model = masked_scene(True)
    engine = make_engine(shard_of(model, rank, world), 2, torch.zeros(3),
                         offload=OffloadOptions(), ranks=options)
    results["both"] = (densifying_run(engine, views), engine.state_dict())
    # Read as pixels, a rank reading only its rows: the same loss and PSNR.
    views, model = masked_scene(True)
    pixels = [(v.target * 255).round().to(torch.uint8) for v in views]
    read = [TrainView(v.camera, read=lambda rows, p=p: p if rows is None else p[rows[0]:rows[1]],
                      masked=True) for v, p in zip(views, pixels)]
    given = [TrainView(v.camera, pixels_as_float(p).double()) for v, p in zip(views, pixels)]
    steps = [make_engine(shard_of(model, rank, world), 2, torch.zeros(3),
                         ranks=RankOptions()).forward_backward(batch[:2], GradientNorms())
             for batch in (read, given)]
    results["read"] = [(step.loss, step.psnr) for step in steps]
    dist.barrier()
    torch.save(results, f"{out_file}.{rank}")
    dist.destroy_process_group()


def test_ranks_with_masks_equal_one_process(masked_runs, tmp_path):
    """Two ranks, resident and offloaded, equal one process; on ranks too nothing under
    the masks changes anything; a rank reading only its rows' pixels and masks takes
    the loss and PSNR of the same values given whole."""
    world = 2
    out = tmp_path / "ranks.pt"
    mp.spawn(masked_rank, args=(world, str(tmp_path / "init"), str(out)), nprocs=world)
    ranks = [torch.load(f"{out}.{r}", weights_only=False) for r in range(world)]
    want_losses, want = masked_runs[(False, "densifying_run")]
    assert ranks[0]["both"][0] == pytest.approx(want_losses, rel=1e-9)
    assert_same_state(concat_states([r["both"][1] for r in ranks]), want, exact=False)
    for key, (want_losses, want) in masked_runs.items():
        losses = ranks[0][key][0]
        assert losses == pytest.approx(want_losses, rel=1e-9), key
        assert_same_state(concat_states([r[key][1] for r in ranks]), want, exact=False)
        noise, run = key
        if noise:  # and on ranks, noise under the mask changes nothing at all
            assert ranks[0][key][0] == ranks[0][(False, run)][0], key
            for r in ranks:
                assert_same_state(r[key][1], r[(False, run)][1], exact=True)
    (read_loss, read_psnr), (given_loss, given_psnr) = ranks[0]["read"]
    assert read_loss == given_loss and read_psnr == given_psnr

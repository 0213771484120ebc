"""Large scratch buffers kept between renders (render/buffer_pool.py): lent only
when given back, and a render in kept buffers equals one in fresh ones, bit for bit."""

from __future__ import annotations

import importlib
import math

import pytest
import torch

from splatscale.allocator import MMAP_THRESHOLD
from splatscale.render import buffer_pool, project, rasterize
from splatscale.render.binning import bin_tiles
from splatscale.render.buffer_pool import BufferPool
from splatscale.render.rasterize import composite

from tests.test_composite import mixed_scene

rasterize_module = importlib.import_module("splatscale.render.rasterize")
binning_module = importlib.import_module("splatscale.render.binning")

ROWS = MMAP_THRESHOLD // 32  # float32 rows of 16: twice the threshold


def test_a_buffer_is_lent_again_only_once_given_back():
    pool = BufferPool()
    first = pool.lend(ROWS, 16, torch.float32)
    second = pool.lend(ROWS, 16, torch.float32)
    assert first.data_ptr() != second.data_ptr() and pool.held_bytes() == 0
    pool.give_back(first)
    assert pool.held_bytes() >= first.numel() * 4
    again = pool.lend(ROWS - 10, 16, torch.float32)
    assert again.data_ptr() == first.data_ptr() and again.shape == (ROWS - 10, 16)
    assert again.is_contiguous() and pool.held_bytes() == 0
    assert pool.lend(ROWS, 16, torch.float32).data_ptr() not in (first.data_ptr(),
                                                                  second.data_ptr())
    pool.give_back(second)
    with pytest.raises(ValueError, match="twice"):
        pool.give_back(second)
    with pytest.raises(ValueError, match="not lent"):
        pool.give_back(torch.empty(ROWS, 16))


def test_the_smallest_fitting_buffer_of_its_dtype_is_lent():
    pool = BufferPool()
    small, large = pool.lend(ROWS, 16, torch.float32), pool.lend(3 * ROWS, 16, torch.float32)
    wide = pool.lend(ROWS, 16, torch.float64)
    for lent in (large, wide, small):
        pool.give_back(lent)
    assert pool.lend(ROWS, 16, torch.float64).data_ptr() == wide.data_ptr()
    assert pool.lend(ROWS, 16, torch.float32).data_ptr() == small.data_ptr()
    assert pool.lend(ROWS, 16, torch.float32).data_ptr() == large.data_ptr()


def test_an_outgrown_buffer_is_freed_and_at_most_kept_are_held():
    pool = BufferPool(kept=2)
    outgrown = pool.lend(ROWS, 16, torch.float32)
    pool.give_back(outgrown)
    grown = pool.lend(2 * ROWS, 16, torch.float32)  # larger than the headroom
    assert grown.data_ptr() != outgrown.data_ptr() and pool.held_bytes() == 0
    lent = [pool.lend(ROWS * (i + 1), 16, torch.float32) for i in range(3)]
    for buffer in lent:
        pool.give_back(buffer)
    assert pool.held_bytes() == sum(b.untyped_storage().nbytes() for b in lent[1:])
    pool.clear()
    assert pool.held_bytes() == 0


def test_small_buffers_are_left_to_the_allocator():
    pool = BufferPool()
    small = pool.lend(100, 16, torch.float32)
    pool.give_back(small)
    assert pool.held_bytes() == 0 and small.shape == (100, 16)


class PoisonedPool(BufferPool):
    """Fills every buffer given back with NaN: a render that read one before writing
    it, or one lent while its borrower still used it, would show it."""

    def give_back(self, lent):
        whole = torch.empty(0, dtype=lent.dtype).set_(lent.untyped_storage())
        whole.fill_(float("nan") if whole.is_floating_point() else torch.iinfo(whole.dtype).max)
        super().give_back(lent)


def two_views_rendered(monkeypatch, pool):
    """Gradients of a loss over two renders whose graphs are alive at once, each
    backward taken twice (the first through a graph kept for the second)."""
    monkeypatch.setattr(rasterize_module, "INTERSECTION_ROWS", pool)
    model, camera = mixed_scene(0)
    with torch.no_grad():
        splats = project(model, [camera]).of_camera(0)
    leaves = {n: getattr(splats, n).detach().clone().requires_grad_(True)
              for n in ("means2d", "conics", "colors", "depths", "opacities")}
    bins = bin_tiles(leaves["means2d"], splats.radii, leaves["depths"], splats.keys,
                     camera.width, (0, camera.height), leaves["conics"], leaves["opacities"])
    images = []
    for background in (torch.zeros(3), torch.ones(3)):
        with torch.no_grad():  # a render for the viewer between them: given back at once
            composite(*leaves.values(), torch.ones(3), bins, camera.width, (0, camera.height))
        images.append(composite(*leaves.values(), background, bins, camera.width,
                                (0, camera.height), depth=True))
    weights = torch.linspace(-1, 1, images[0][0].numel()).reshape(images[0][0].shape)
    loss = sum((rgb * weights).sum() + depth_sum.sum() for rgb, depth_sum, _ in images)
    first = torch.autograd.grad(loss, list(leaves.values()), retain_graph=True)
    return first, torch.autograd.grad(loss, list(leaves.values())), images


def test_renders_in_kept_buffers_equal_renders_in_fresh_ones(monkeypatch):
    monkeypatch.setattr(buffer_pool, "MMAP_THRESHOLD", 0)  # every buffer pooled
    poisoned = PoisonedPool()
    kept = two_views_rendered(monkeypatch, poisoned)
    assert poisoned.held_bytes() > 0
    fresh = two_views_rendered(monkeypatch, BufferPool(kept=0))
    for got, want in zip(kept[:2], fresh[:2]):
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    for got, want in zip(kept[2], fresh[2]):
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert all(g.abs().max() > 0 and not g.isnan().any() for g in kept[0])


def filled(value):
    """An allocator of buffers filled with ``value``; NaN in an integer buffer is its
    largest value."""
    def allocate(count, dtype):
        if not dtype.is_floating_point and math.isnan(value):
            return torch.full((count,), torch.iinfo(dtype).max, dtype=dtype)
        return torch.full((count,), value, dtype=dtype)
    return allocate


def test_binnings_in_kept_buffers_equal_binnings_in_fresh_ones(monkeypatch):
    """A binning that read an array before writing it would differ from one whose
    arrays held other values."""
    monkeypatch.setattr(buffer_pool, "MMAP_THRESHOLD", 0)  # every array pooled
    made = []
    poisoned = PoisonedPool(kept=6, allocate=lambda count, dtype: made.append(count)
                            or filled(float("nan"))(count, dtype))
    # Each binning after the first reads buffers an earlier one wrote and gave back.
    for seed in (0, 1, 1):
        model, camera = mixed_scene(seed)
        with torch.no_grad():
            splats = project(model, [camera]).of_camera(0)
        inputs = (splats.means2d, splats.radii, splats.depths, splats.keys, camera.width,
                  (0, camera.height), splats.conics, splats.opacities)
        monkeypatch.setattr(binning_module, "BINNING_SCRATCH", poisoned)
        allocated = len(made)
        kept = bin_tiles(*inputs)
        monkeypatch.setattr(binning_module, "BINNING_SCRATCH",
                            BufferPool(kept=0, allocate=filled(-1.0)))
        fresh = bin_tiles(*inputs)
        for name in ("splat_ids", "blocks", "offsets"):
            assert torch.equal(getattr(kept, name), getattr(fresh, name))
    assert len(made) == allocated  # the same view binned again: every array given back
    assert poisoned.held_bytes() > 0 and len(kept.splat_ids) > 0


@pytest.mark.parametrize("grad", [False, True])
def test_a_render_gives_its_buffer_back_when_done_with_it(monkeypatch, grad):
    monkeypatch.setattr(buffer_pool, "MMAP_THRESHOLD", 0)
    pool = BufferPool()
    monkeypatch.setattr(rasterize_module, "INTERSECTION_ROWS", pool)
    model, camera = mixed_scene(1)
    model.requires_grad_(True)
    with torch.set_grad_enabled(grad):
        image = rasterize(project(model, [camera]).of_camera(0), camera.width,
                          camera.height).rgb
    assert (pool.held_bytes() > 0) != grad  # a backward follows: lent until it has run
    if grad:
        image.sum().backward()
        assert pool.held_bytes() > 0


def test_a_backward_retried_after_it_raised_packs_the_splats_again(monkeypatch):
    """The backward writes its gradient rows over the packed splats, then sums them:
    where the sum raises, a second backward through the kept graph packs them again."""
    kernels = importlib.import_module("splatscale.render.compositing_kernels")
    model, camera = mixed_scene(2)
    model.requires_grad_(True)
    image = rasterize(project(model, [camera]).of_camera(0), camera.width, camera.height).rgb
    want = torch.autograd.grad(image.sum(), list(model.parameters().values()),
                               retain_graph=True)
    sum_per_splat = kernels.sum_per_splat

    def fails_once(*args):
        monkeypatch.setattr(kernels, "sum_per_splat", sum_per_splat)
        raise MemoryError("the sum's buffer")
    monkeypatch.setattr(kernels, "sum_per_splat", fails_once)
    with pytest.raises(MemoryError):
        torch.autograd.grad(image.sum(), list(model.parameters().values()), retain_graph=True)
    got = torch.autograd.grad(image.sum(), list(model.parameters().values()))
    assert all(torch.equal(a, b) for a, b in zip(got, want))

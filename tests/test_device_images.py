"""Training images kept on the engine's device while they fit."""

from __future__ import annotations

import pytest
import torch

from splatscale.backends import backend_named
from splatscale.data.images import pixels_as_float
from splatscale.engine import TrainView
from splatscale.engine.device_images import DeviceImages
from tests.conftest import orbit_cameras


# The meta device holds no data: the cuda backend's way with images, without a GPU.
OFF_HOST = dict(device=torch.device("meta"), backend=backend_named("cuda"))


def views(count: int) -> list[TrainView]:
    cameras = orbit_cameras(count, 20, 10)
    return [TrainView(type(c)(c.viewmat, c.K, c.width, c.height, f"view{i}"),
                      torch.rand(10, 20, 3)) for i, c in enumerate(cameras)]


def test_on_the_cpu_the_views_own_images_are_used():
    images, view = DeviceImages(torch.device("cpu")), views(1)[0]
    assert images.target(view) is view.target and not images.kept


def test_images_are_uploaded_once_and_kept_within_the_budget():
    image_bytes = 10 * 20 * 3 * 4
    images = DeviceImages(budget=2 * image_bytes, **OFF_HOST)
    first, second, third = views(3)
    kept = images.target(first)
    assert kept.device.type == "meta" and kept.shape == first.target.shape
    assert images.target(first) is kept  # not uploaded again
    images.target(second)
    again = images.target(third)
    assert again.device.type == "meta" and images.target(third) is not again  # over budget
    assert set(images.kept) == {"view0", "view1"} and images.kept_bytes == 2 * image_bytes


def test_images_read_as_pixels_are_kept_as_pixels():
    pixel_bytes = 10 * 20 * 3
    images = DeviceImages(budget=2 * pixel_bytes, **OFF_HOST)
    pixels = torch.randint(0, 256, (10, 20, 3), dtype=torch.uint8)
    read = [TrainView(view.camera, read=lambda rows: pixels) for view in views(3)]
    targets = [images.target(view) for view in read]
    assert all(t.dtype == torch.float32 and t.shape == (10, 20, 3) for t in targets)
    assert {name: kept.dtype for name, kept in images.kept.items()} == {
        "view0": torch.uint8, "view1": torch.uint8}, "a quarter of the bytes: two fit"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pixels_become_the_same_floats_on_the_gpu_as_on_the_host():
    pixels = torch.arange(256, dtype=torch.uint8)
    for dtype in (torch.float32, torch.float64):
        assert torch.equal(pixels_as_float(pixels.cuda(), dtype).cpu(),
                           pixels_as_float(pixels, dtype))


def test_a_band_is_cut_from_the_kept_image_or_read_alone():
    """A rank's band: the image is kept whole while it fits (later bands are cut from
    it); past the budget only the band's rows are read."""
    images = DeviceImages(budget=10 * 20 * 3, **OFF_HOST)
    pixels = torch.randint(0, 256, (10, 20, 3), dtype=torch.uint8)
    reads = []

    def read(rows):
        reads.append(rows)
        return pixels if rows is None else pixels[rows[0]:rows[1]]
    first, second = (TrainView(view.camera, read=read) for view in views(2))
    like = torch.zeros(1, dtype=torch.float64)
    assert images.rows(first, 2, 7, like).shape == (5, 20, 3) and reads == [None]
    assert images.rows(first, 0, 3, like).device.type == "meta" and reads == [None]
    band = images.rows(second, 2, 7, like)
    assert reads == [None, (2, 7)] and band.dtype == torch.float64
    assert torch.equal(band, pixels_as_float(pixels[2:7]).double())


def test_a_masked_image_is_kept_with_its_mask_and_counted_so():
    """Four channels: the budget counts the mask's bytes before a band is cut."""
    images = DeviceImages(budget=10 * 20 * 4 - 1, **OFF_HOST)
    pixels = torch.randint(0, 256, (10, 20, 4), dtype=torch.uint8)
    reads = []

    def read(rows):
        reads.append(rows)
        return pixels if rows is None else pixels[rows[0]:rows[1]]
    view = TrainView(views(1)[0].camera, read=read, masked=True)
    like = torch.zeros(1, dtype=torch.float64)
    band = images.rows(view, 2, 7, like)
    assert reads == [(2, 7)], "one byte short of the image with its mask: read alone"
    assert band.shape == (5, 20, 4) and torch.equal(band, pixels_as_float(pixels[2:7]).double())
    roomy = DeviceImages(budget=10 * 20 * 4, **OFF_HOST)
    assert roomy.rows(view, 2, 7, like).shape == (5, 20, 4) and reads[-1] is None
    assert {name: kept.shape for name, kept in roomy.kept.items()} == {"view0": (10, 20, 4)}

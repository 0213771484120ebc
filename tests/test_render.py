"""The whole renderer: finite differences, bands, determinism."""

from __future__ import annotations

import numba
import pytest
import torch

from splatscale.render import project, rasterize, render
from tests.conftest import look_at_camera, random_model


def test_gradcheck_whole_render_float64():
    model = random_model(10, seed=3, spread=0.6, log_scale=(-1.6, -0.9), opacity=(0.3, 0.8))
    camera = look_at_camera([0.3, 0.2, 3.0], [0, 0, 0], width=21, height=19, focal=22.0)
    g = torch.Generator().manual_seed(0)
    weights = torch.randn(19, 21, 3, generator=g, dtype=torch.float64)
    alpha_weights = torch.randn(19, 21, generator=g, dtype=torch.float64)
    names = model.PARAMETERS

    def loss(*params):
        trial = type(model)(**dict(zip(names, params)), sh_degree=model.sh_degree)
        out = render(trial, camera)
        return (out.rgb * weights).sum() + (out.alpha * alpha_weights).sum()

    params = [p.detach().clone().requires_grad_(True) for p in model.parameters().values()]
    assert torch.autograd.gradcheck(loss, params, eps=1e-6, atol=1e-5, rtol=1e-4)


def _band_and_full(model, camera, rows, dtype):
    model = model.to(dtype).requires_grad_(True)
    g = torch.Generator().manual_seed(1)
    y0, y1 = rows
    weights = torch.randn(y1 - y0, camera.width, 3, generator=g).to(dtype)
    results = []
    for band in (None, rows):
        splats = project(model, [camera]).of_camera(0)
        out = rasterize(splats, camera.width, camera.height, rows=band, depth=True)
        rgb, alpha, depth = out.rgb, out.alpha, out.depth
        if band is None:
            rgb, alpha, depth = rgb[y0:y1], alpha[y0:y1], depth[y0:y1]
        grads = torch.autograd.grad((rgb * weights).sum() + alpha.sum(),
                                    list(model.parameters().values()))
        results.append((rgb.detach(), alpha.detach(), depth.detach(), grads))
    return results


@pytest.mark.parametrize("rows", [(5, 27), (16, 32), (0, 3), (30, 43)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_band_equals_crop_of_full_render(rows, dtype):
    model = random_model(120, seed=4, spread=1.0)
    camera = look_at_camera([0.2, 0.1, 3.2], [0, 0, 0], width=50, height=43, focal=45.0)
    (full_rgb, full_alpha, full_depth, full_grads), (rgb, alpha, depth, grads) = \
        _band_and_full(model, camera, rows, dtype)
    assert torch.equal(rgb, full_rgb) and torch.equal(alpha, full_alpha)
    assert torch.equal(depth, full_depth)
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    for got, want in zip(grads, full_grads):
        torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance * want.abs().max())


def _float32_step(model, cameras):
    model = model.to(torch.float32).requires_grad_(True)
    total = 0.0
    for camera in cameras:
        out = render(model, camera, depth=True)
        total = total + (out.rgb - 0.3).abs().mean() + out.depth.mean() * 1e-2
    grads = torch.autograd.grad(total, list(model.parameters().values()))
    return total.detach(), grads


def test_float32_results_identical_across_runs_and_thread_counts():
    model = random_model(3000, seed=5, spread=1.2, log_scale=(-4.0, -2.0))
    cameras = [look_at_camera([0.2, 0.1, 3.0], [0, 0, 0], 160, 120, 150.0),
               look_at_camera([-2.0, 0.5, 2.2], [0, 0, 0], 150, 97, 140.0)]
    threads = numba.get_num_threads()
    runs = [_float32_step(model, cameras) for _ in range(2)]
    numba.set_num_threads(1)
    try:
        runs.append(_float32_step(model, cameras))
    finally:
        numba.set_num_threads(threads)
    for loss, grads in runs[1:]:
        assert torch.equal(loss, runs[0][0])
        for got, want in zip(grads, runs[0][1]):
            assert torch.equal(got, want)


def test_float32_render_matches_float64():
    model = random_model(400, seed=6, spread=1.0)
    camera = look_at_camera([0.2, 0.1, 3.2], [0, 0, 0], width=64, height=48, focal=60.0)
    out64 = render(model, camera)
    out32 = render(model.to(torch.float32), camera)
    torch.testing.assert_close(out32.rgb, out64.rgb.float(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out32.alpha, out64.alpha.float(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_a_render_without_depth_is_the_render_with_it(dtype, tolerance):
    """Depth is rendered only when asked for; leaving it out changes no pixel and no
    gradient of a loss that does not read it (the kernels compiled without the depth
    channel against those with it: under fast-math they may round apart)."""
    model = random_model(300, seed=7, spread=1.0).to(dtype)
    camera = look_at_camera([0.2, 0.1, 3.2], [0, 0, 0], width=50, height=43, focal=45.0)
    weights = torch.randn(43, 50, 3, generator=torch.Generator().manual_seed(2)).to(dtype)
    outputs, gradients = [], []
    for depth in (True, False):
        leaves = model.detach().requires_grad_(True)
        out = render(leaves, camera, depth=depth)
        outputs.append(out)
        gradients.append(torch.autograd.grad((out.rgb * weights).sum() + out.alpha.sum(),
                                             list(leaves.parameters().values())))
    with_depth, without = outputs
    assert without.depth is None and with_depth.depth is not None
    for name in ("rgb", "alpha"):
        torch.testing.assert_close(getattr(without, name), getattr(with_depth, name),
                                   rtol=tolerance, atol=tolerance, msg=name)
    for got, want in zip(*gradients):
        assert want.abs().max() > 0
        torch.testing.assert_close(got, want, rtol=tolerance,
                                   atol=tolerance * want.abs().max().item())


def test_rows_outside_the_image_are_rejected():
    model = random_model(5)
    camera = look_at_camera([0, 0, 3], [0, 0, 0], width=20, height=18, focal=20.0)
    splats = project(model, [camera]).of_camera(0)
    with pytest.raises(ValueError, match="rows"):
        rasterize(splats, 20, 18, rows=(10, 19))

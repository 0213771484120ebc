"""Fisheye cameras (gsplat's camera_model="fisheye": the ideal equidistant projection
r = f theta and its Jacobian in the EWA projection) in the cpu backend's projection,
against gsplat 1.5.3's torch reference, finite differences and a brute-force render;
and the offload engine's cull for them."""

from __future__ import annotations

import math

import pytest
import torch

from splatscale.data.cameras import Camera
from splatscale.model.gaussians import GaussianModel
from splatscale.render import project, render
from splatscale.render.projection import _EwaPairs, _ewa_pairs, visibility
from splatscale.render.splats import camera_tensors, fisheye_cameras
from tests.conftest import (antialiased as with_antialiasing, assert_radii_match, leaves_of,
                            look_at_camera, pairs_of, random_model)
from tests.test_antialiased_projection import moved_within
from tests.gsplat_reference import brute_force_render, cuda_gradient, gsplat_projection

CPU = torch.device("cpu")


def fisheye(camera: Camera, field_of_view: float = 190.0) -> Camera:
    """``camera`` as an equidistant fisheye whose image circle spans ``field_of_view``
    degrees across its width."""
    focal = camera.width / 2 / math.radians(field_of_view / 2)
    K = camera.K.clone()
    K[0, 0] = K[1, 1] = focal
    return Camera(camera.viewmat, K, camera.width, camera.height, camera.name, "fisheye")


def fisheye_cameras_around(count: int, width: int, height: int, radius: float,
                           field_of_view: float = 190.0) -> list[Camera]:
    """Cameras inside the model's cloud, looking out in different directions: it
    surrounds them, near the optical axis, at right angles to it and behind."""
    return [fisheye(look_at_camera([0.2 * math.cos(a), 0.1, 0.2 * math.sin(a)],
                                   [radius * math.cos(a), 0.3, radius * math.sin(a)],
                                   width, height, focal=1.0), field_of_view)
            for a in [2 * math.pi * k / count for k in range(count)]]


def off_axis_angles(model: GaussianModel, cameras: list[Camera], camera_ids: torch.Tensor,
                    gaussian_ids: torch.Tensor) -> torch.Tensor:
    viewmats = torch.stack([c.viewmat for c in cameras])[camera_ids]
    x, y, z = (viewmats[:, :3, :3] @ model.means[gaussian_ids, :, None]
               + viewmats[:, :3, 3:])[..., 0].unbind(-1)
    return torch.atan2(torch.sqrt(x * x + y * y), z)


@pytest.fixture(scope="module")
def scene():
    model = random_model(500, seed=13, spread=3.0, log_scale=(-4.0, -0.5))
    return model, fisheye_cameras_around(3, 48, 36, radius=2.0)


@pytest.mark.parametrize("antialiased", [False, True])
def test_projection_matches_gsplat(scene, antialiased):
    model, cameras = scene
    model = with_antialiasing(model, antialiased)
    ref = gsplat_projection(model, cameras)
    splats = project(model, cameras)
    c, g = splats.camera_ids, splats.gaussian_ids
    assert ref.visible.sum() == len(splats) and ref.visible[c, g].all()
    assert 0.2 < len(splats) / ref.visible.numel() < 0.8, "the scene must have both kinds"
    assert off_axis_angles(model, cameras, c, g).max() > math.radians(80), "some far off axis"
    assert_radii_match(splats.radii, ref.box[c, g])
    torch.testing.assert_close(splats.means2d, ref.means2d[c, g], rtol=1e-10, atol=1e-8)
    torch.testing.assert_close(splats.depths, ref.depths[c, g], rtol=1e-12, atol=0)
    torch.testing.assert_close(splats.conics, ref.conics[c, g], rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(splats.opacities, ref.opacities[c, g], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("antialiased", [False, True])
def test_kernels_equal_the_torch_reference_and_gsplat(scene, antialiased):
    """The kernels' backward is gsplat's CUDA kernel's (its closed forms for J's
    derivative, the means' gradient through J), the references' autograd's of the
    forward: they agree to gsplat's eps, 1e-7, relative."""
    model, cameras = scene
    gaussian_ids, camera_ids, viewmats, Ks, sizes = pairs_of(with_antialiasing(model, antialiased),
                                                             cameras)
    leaves = leaves_of(model)
    ours = _EwaPairs.apply(*leaves, gaussian_ids, camera_ids, viewmats, Ks, sizes,
                           fisheye_cameras(cameras, CPU), antialiased)
    reference = _ewa_pairs(*(t[gaussian_ids] for t in leaves), viewmats[camera_ids],
                           Ks[camera_ids], sizes[camera_ids], antialiased,
                           torch.ones(len(gaussian_ids), dtype=torch.bool))
    trial = GaussianModel(leaves[0], leaves[1], leaves[2], model.opacity_logits, model.sh0,
                          model.shN, antialiased=antialiased)
    gsplat = gsplat_projection(trial, cameras)
    gsplat = [t[camera_ids, gaussian_ids] for t in (gsplat.means2d, gsplat.conics, gsplat.depths)
              ] + ([gsplat.compensations[camera_ids, gaussian_ids]] if antialiased else [])
    count = 4 if antialiased else 3
    for a, b, c in zip(ours[:count], reference[:count], gsplat):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(a, c, rtol=1e-9, atol=1e-10)
    generator = torch.Generator().manual_seed(0)
    upstream = [torch.randn(t.shape, generator=generator, dtype=t.dtype) for t in ours[:count]]
    if antialiased:
        reference = (*reference[:3], cuda_gradient(reference[3]))
    grads = [torch.autograd.grad(sum((o * u).sum() for o, u in zip(out, upstream)), leaves)
             for out in (ours[:count], reference[:count], gsplat)]
    for got, want, theirs in zip(*grads):
        scale = want.abs().max().item()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7 * scale)
        torch.testing.assert_close(got, theirs, rtol=1e-5, atol=1e-7 * scale)


@pytest.mark.parametrize("antialiased", [False, True])
def test_kernels_pass_gradcheck(scene, antialiased):
    model, cameras = scene
    small = with_antialiasing(GaussianModel(**{n: t[:60].detach().clone()
                                       for n, t in model.parameters().items()}), antialiased)
    gaussian_ids, camera_ids, viewmats, Ks, sizes = pairs_of(small, cameras)
    assert len(gaussian_ids) > 20
    assert torch.autograd.gradcheck(
        lambda *p: _EwaPairs.apply(*p, gaussian_ids, camera_ids, viewmats, Ks, sizes,
                                   fisheye_cameras(cameras, CPU), antialiased)[:3],
        leaves_of(small), atol=1e-5, rtol=1e-4)


def test_a_batch_mixes_camera_models(scene):
    """Each camera of a batch is projected by its own model, whatever the others'."""
    model, cameras = scene
    pinholes = [look_at_camera([0.1, 0.2, 4.0], [0, 0, 0], 40, 30, 35.0),
                look_at_camera([3.0, 0.5, 2.0], [0, 0, 0], 40, 30, 35.0)]
    mixed = [pinholes[0], cameras[0], pinholes[1], cameras[1]]
    together = project(model, mixed)
    for i, camera in enumerate(mixed):
        alone = project(model, [camera])
        part = together.of_camera(i)
        for name in ("gaussian_ids", "means2d", "conics", "depths", "radii", "opacities"):
            assert torch.equal(getattr(part, name), getattr(alone, name)), name
    leaves = leaves_of(model)
    trial = GaussianModel(*leaves, model.opacity_logits, model.sh0, model.shN)

    def loss(splats, cameras):
        """A weighted sum, each row's weights a function of its Gaussian and camera."""
        row = (splats.gaussian_ids * 0.37 + cameras * 1.3).to(torch.float64)[:, None]
        return sum((t.reshape(len(row), -1) * torch.sin(row + torch.arange(
            t.reshape(len(row), -1).shape[1]))).sum()
                   for t in (splats.means2d, splats.conics, splats.depths))

    together = project(trial, mixed)
    grads = torch.autograd.grad(loss(together, together.camera_ids), leaves)
    parts = []
    for i, camera in enumerate(mixed):
        alone = project(trial, [camera])
        parts.append(torch.autograd.grad(loss(alone, torch.full_like(alone.camera_ids, i)),
                                         leaves))
    for got, *each in zip(grads, *parts):
        torch.testing.assert_close(got, sum(each), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("antialiased", [False, True])
def test_visibility_kernel_equals_the_torch_test(scene, dtype, antialiased):
    from splatscale.render.projection import _visibility_kernel, _visibility_torch
    model, cameras = scene
    cameras = cameras + [look_at_camera([0.1, 0.2, 4.0], [0, 0, 0], 40, 30, 35.0)]
    model = model.to(dtype)
    fisheye = fisheye_cameras(cameras, CPU)
    tensors = (model.means, model.quats, model.log_scales, model.opacity_logits,
               *camera_tensors(cameras, model.means))
    ours = _visibility_kernel(*tensors, fisheye=fisheye, antialiased=antialiased)
    reference = _visibility_torch(*tensors, fisheye=fisheye, antialiased=antialiased)
    assert torch.equal(ours.visible, reference.visible)
    assert ours.visible[:-1].any(dim=1).all() and 0 < int(ours.visible[-1].sum()) < len(model)
    pinhole = _visibility_kernel(*tensors, antialiased=antialiased)
    assert torch.equal(pinhole.visible[-1], ours.visible[-1])
    torch.testing.assert_close(ours.radii[ours.visible], reference.radii[reference.visible],
                               rtol=0, atol=1)  # ceil of values rounded differently
    assert (ours.radii[ours.visible] == reference.radii[reference.visible]).float().mean() > 0.99


@pytest.mark.parametrize("antialiased", [False, True])
def test_render_equals_brute_force(antialiased):
    model = with_antialiasing(random_model(150, seed=5, spread=2.0, log_scale=(-3.0, -1.0)),
                      antialiased)
    camera = fisheye_cameras_around(1, 45, 37, radius=2.0, field_of_view=200.0)[0]
    background = torch.tensor([0.2, 0.5, 0.1], dtype=torch.float64)
    model.requires_grad_(True)
    out = render(model, camera, background=background)
    rgb, alpha = brute_force_render(model, camera, background)
    assert (alpha > 0.5).float().mean() > 0.2, "the image must hold splats"
    torch.testing.assert_close(out.rgb, rgb, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(out.alpha, alpha, rtol=1e-9, atol=1e-11)
    weights = torch.randn(rgb.shape, generator=torch.Generator().manual_seed(2),
                          dtype=torch.float64)
    parameters = list(model.parameters().values())
    for got, want in zip(torch.autograd.grad((out.rgb * weights).sum(), parameters),
                         torch.autograd.grad((rgb * weights).sum(), parameters)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7 * want.abs().max().item())


@pytest.mark.parametrize("field_of_view", [100.0, 200.0])
def test_offload_cull_keeps_every_gaussian_the_exact_test_keeps(field_of_view):
    """The offload engine's cull, from lagging geometry and how far each row may have
    moved, keeps every Gaussian the exact test keeps through fisheye cameras at any
    values within that reach (render/drift.py says why), and without drift
    keeps not many more."""
    from splatscale.engine.offload.culling import candidates
    lagging = random_model(3000, seed=17, spread=4.0, log_scale=(-5.0, -1.0),
                           opacity=(0.002, 1.0))
    cameras = fisheye_cameras_around(2, 48, 36, radius=2.0, field_of_view=field_of_view)
    generator = torch.Generator().manual_seed(3)
    reach_means = 0.3 * torch.rand(len(lagging), generator=generator, dtype=torch.float64)
    reach_scales = 0.5 * torch.rand(len(lagging), generator=generator, dtype=torch.float64)
    kept = candidates(lagging.means, lagging.log_scales, reach_means, reach_scales, cameras)
    for trial in range(4):
        truth = GaussianModel(
            moved_within(lagging.means, reach_means, generator),
            torch.randn(len(lagging), 4, generator=generator, dtype=torch.float64),
            moved_within(lagging.log_scales, reach_scales, generator),
            lagging.opacity_logits, lagging.sh0, lagging.shN, antialiased=trial % 2 == 1)
        exact = visibility(truth, cameras).visible.any(dim=0)
        assert 100 < int(exact.sum()) < len(lagging) - 100
        assert not (exact & ~kept).any(), "the cull missed visible rows"
    still = torch.zeros(len(lagging), dtype=torch.float64)
    exact = visibility(lagging, cameras).visible.any(dim=0)
    tight = candidates(lagging.means, lagging.log_scales, still, still, cameras)
    assert not (exact & ~tight).any()
    # About the pinhole bound's slack for these shapes and opacities (1.3 to 1.4).
    assert int(tight.sum()) <= 1.35 * int(exact.sum()) and int((~tight).sum()) > 100


def test_float32_render_matches_float64():
    model = random_model(300, seed=5, spread=2.0, log_scale=(-3.0, -1.0))
    camera = fisheye_cameras_around(1, 64, 48, radius=2.0, field_of_view=200.0)[0]
    results = []
    for dtype in (torch.float64, torch.float32):
        trial = model.to(dtype).requires_grad_(True)
        out = render(trial, camera)
        grads = torch.autograd.grad((out.rgb - 0.3).abs().mean(),
                                    list(trial.parameters().values()))
        results.append((out.rgb, grads))
    (rgb64, grads64), (rgb32, grads32) = results
    torch.testing.assert_close(rgb32, rgb64.float(), rtol=1e-4, atol=1e-5)
    for got, want in zip(grads32, grads64):
        torch.testing.assert_close(got, want.float(), rtol=1e-3,
                                   atol=1e-5 * want.abs().max().item())

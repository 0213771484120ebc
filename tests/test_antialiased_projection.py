"""Anti-aliased splats (gsplat's rasterize_mode="antialiased") in the cpu backend's
projection: each splat's opacity times sqrt(det cov2d / det(cov2d + eps2d I)), against
gsplat 1.5.3's torch reference, finite differences and a brute-force render."""

from __future__ import annotations

import pytest
import torch

from splatscale.model.gaussians import GaussianModel
from splatscale.render import project, render
from splatscale.render.projection import _EwaPairs, _ewa_pairs, visibility
from splatscale.render.splats import camera_tensors, fisheye_or_none
from tests.conftest import (antialiased, assert_radii_match, leaves_of, look_at_camera,
                            orbit_cameras, pairs_of, random_model)
from tests.gsplat_reference import brute_force_render, cuda_gradient, gsplat_projection

CPU = torch.device("cpu")


def test_projection_matches_gsplat(garden):
    model, cameras = garden
    model = antialiased(model)
    model.log_scales = model.log_scales.clone()
    model.log_scales[::3] -= 3.0  # a third smaller than a pixel: they fade
    ref = gsplat_projection(model, cameras)
    splats = project(model, cameras)
    c, g = splats.camera_ids, splats.gaussian_ids
    assert ref.visible.sum() == len(splats) and ref.visible[c, g].all()
    plain = gsplat_projection(antialiased(model, False), cameras)
    assert (plain.visible & ~ref.visible).sum() > 100, "the compensation must cull some"
    assert_radii_match(splats.radii, ref.box[c, g])
    torch.testing.assert_close(splats.means2d, ref.means2d[c, g], rtol=1e-10, atol=1e-8)
    torch.testing.assert_close(splats.depths, ref.depths[c, g], rtol=1e-12, atol=0)
    torch.testing.assert_close(splats.conics, ref.conics[c, g], rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(splats.opacities, ref.opacities[c, g], rtol=1e-10, atol=1e-12)
    assert ref.compensations[c, g].min() < 0.5, "some splats must be small enough to fade"


@pytest.fixture(scope="module")
def wide_scene():
    """Small and large Gaussians, in and well outside the views."""
    model = random_model(400, seed=9, spread=3.0, log_scale=(-4.0, 0.3))
    return antialiased(model), orbit_cameras(3, 45, 37, radius=3.0)


def test_kernels_equal_the_torch_reference_and_gsplat(wide_scene):
    model, cameras = wide_scene
    gaussian_ids, camera_ids, viewmats, Ks, sizes = pairs_of(model, cameras)
    leaves = leaves_of(model)
    ours = _EwaPairs.apply(*leaves, gaussian_ids, camera_ids, viewmats, Ks, sizes,
                           fisheye_or_none(cameras, CPU), True)
    reference = _ewa_pairs(*(t[gaussian_ids] for t in leaves), viewmats[camera_ids],
                           Ks[camera_ids], sizes[camera_ids], True)
    trial = GaussianModel(leaves[0], leaves[1], leaves[2], model.opacity_logits, model.sh0,
                          model.shN, antialiased=True)
    gsplat = gsplat_projection(trial, cameras)
    gsplat = [t[camera_ids, gaussian_ids] for t in (gsplat.means2d, gsplat.conics, gsplat.depths,
                                                   gsplat.compensations)]
    for a, b, c in zip(ours, reference, gsplat):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(a, c, rtol=1e-9, atol=1e-10)
    assert ours[3].min() < 0.3 and ours[3].max() > 0.9
    generator = torch.Generator().manual_seed(0)
    upstream = [torch.randn(t.shape, generator=generator, dtype=t.dtype) for t in ours]
    reference = (*reference[:3], cuda_gradient(reference[3]))
    grads = [torch.autograd.grad(sum((o * u).sum() for o, u in zip(out, upstream)), leaves)
             for out in (ours, gsplat, reference)]
    for got, want, theirs in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-10 * want.abs().max().item())
        torch.testing.assert_close(got, theirs, rtol=1e-10, atol=1e-12 * want.abs().max().item())


def test_kernels_pass_gradcheck(wide_scene):
    model, cameras = wide_scene
    small = antialiased(GaussianModel(**{n: t[:40].detach().clone()
                                         for n, t in model.parameters().items()}))
    gaussian_ids, camera_ids, viewmats, Ks, sizes = pairs_of(small, cameras)
    assert len(gaussian_ids) > 20
    assert torch.autograd.gradcheck(
        lambda *p: _EwaPairs.apply(*p, gaussian_ids, camera_ids, viewmats, Ks, sizes,
                                   fisheye_or_none(cameras, CPU), True),
        leaves_of(small), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_visibility_kernel_equals_the_torch_test(wide_scene, dtype):
    from splatscale.render.projection import _visibility_kernel, _visibility_torch
    model, cameras = wide_scene
    model = model.to(dtype)
    tensors = (model.means, model.quats, model.log_scales, model.opacity_logits,
               *camera_tensors(cameras, model.means))
    ours = _visibility_kernel(*tensors, antialiased=True)
    reference = _visibility_torch(*tensors, antialiased=True)
    plain = _visibility_kernel(*tensors)
    assert torch.equal(ours.visible, reference.visible)
    assert (plain.visible & ~ours.visible).any(), "the compensation must cull some"
    assert not (ours.visible & ~plain.visible).any()
    assert (ours.radii < plain.radii)[ours.visible].any(), "and shrink some boxes"
    torch.testing.assert_close(ours.radii[ours.visible], reference.radii[reference.visible],
                               rtol=0, atol=1)  # ceil of values rounded differently
    assert (ours.radii[ours.visible] == reference.radii[reference.visible]).float().mean() > 0.99


@pytest.mark.parametrize("seed", [0, 1])
def test_render_equals_brute_force(seed):
    model = antialiased(random_model(80, seed=seed, spread=1.0, log_scale=(-5.0, -1.5)))
    camera = look_at_camera([0.2, 0.1, 3.2], [0, 0, 0], width=45, height=37, focal=40.0)
    background = torch.tensor([0.2, 0.5, 0.1], dtype=torch.float64)
    model.requires_grad_(True)
    out = render(model, camera, background=background)
    rgb, alpha = brute_force_render(model, camera, background)
    torch.testing.assert_close(out.rgb, rgb, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(out.alpha, alpha, rtol=1e-9, atol=1e-11)
    plain = render(antialiased(model, False), camera, background=background)
    assert (plain.rgb - out.rgb).abs().max() > 0.05, "the compensation must show"
    weights = torch.randn(rgb.shape, generator=torch.Generator().manual_seed(seed),
                          dtype=torch.float64)
    parameters = list(model.parameters().values())
    for got, want in zip(torch.autograd.grad((out.rgb * weights).sum(), parameters),
                         torch.autograd.grad((rgb * weights).sum(), parameters)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7 * want.abs().max().item())


def test_gradcheck_whole_render():
    """Finite differences of a render in the parameters the compensation depends on."""
    model = antialiased(random_model(10, seed=3, spread=0.6, log_scale=(-3.5, -1.5),
                                     opacity=(0.3, 0.8)))
    camera = look_at_camera([0.3, 0.2, 3.0], [0, 0, 0], width=21, height=19, focal=22.0)
    weights = torch.randn(19, 21, 3, generator=torch.Generator().manual_seed(0),
                          dtype=torch.float64)

    def loss(means, quats, log_scales, opacity_logits):
        trial = GaussianModel(means, quats, log_scales, opacity_logits, model.sh0, model.shN,
                              sh_degree=model.sh_degree, antialiased=True)
        return (render(trial, camera).rgb * weights).sum()

    params = [t.detach().clone().requires_grad_(True)
              for t in (model.means, model.quats, model.log_scales, model.opacity_logits)]
    assert torch.autograd.gradcheck(loss, params, eps=1e-6, atol=1e-5, rtol=1e-4)


def moved_within(lagging: torch.Tensor, reach: torch.Tensor, generator: torch.Generator
                 ) -> torch.Tensor:
    """Values at most ``reach`` [N] from ``lagging`` [N, 3] per coordinate: half of the
    rows at a corner of that cube (the farthest they can be), half inside it."""
    step = 2 * torch.rand(lagging.shape, generator=generator, dtype=lagging.dtype) - 1
    corner = torch.rand(len(lagging), generator=generator) < 0.5
    step[corner] = step[corner].sign()
    return lagging + step * reach[:, None]


def test_offload_cull_keeps_every_gaussian_the_exact_test_keeps():
    """The offload engine's cull, from lagging geometry and how far each row may have
    moved, keeps every anti-aliased Gaussian the exact test keeps at any values within
    that reach (render/drift.py says why)."""
    from splatscale.engine.offload.culling import candidates
    lagging = random_model(3000, seed=11, spread=5.0, log_scale=(-6.0, -1.5),
                           opacity=(0.002, 1.0))
    cameras = orbit_cameras(3, 48, 36, radius=5.0)
    generator = torch.Generator().manual_seed(2)
    reach_means = 0.3 * torch.rand(len(lagging), generator=generator, dtype=torch.float64)
    reach_scales = 0.5 * torch.rand(len(lagging), generator=generator, dtype=torch.float64)
    kept = candidates(lagging.means, lagging.log_scales, reach_means, reach_scales, cameras)
    for _ in range(4):
        truth = antialiased(GaussianModel(
            moved_within(lagging.means, reach_means, generator),
            torch.randn(len(lagging), 4, generator=generator, dtype=torch.float64),
            moved_within(lagging.log_scales, reach_scales, generator),
            lagging.opacity_logits, lagging.sh0, lagging.shN))
        exact = visibility(truth, cameras).visible.any(dim=0)
        assert 100 < int(exact.sum()) < len(lagging) - 100
        assert not (exact & ~kept).any(), "the cull missed visible rows"

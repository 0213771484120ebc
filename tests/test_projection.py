"""Projection and SH colours against gsplat 1.5.3's pure-torch reference functions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from splatscale.data.cameras import Camera
from splatscale.model.gaussians import GaussianModel
from splatscale.render import project
from splatscale.render.sh import sh_to_color
from splatscale.render.splats import fisheye_or_none
from tests.conftest import (assert_radii_match, data_path, gsplat_kernel_boxes, look_at_camera,
                            orbit_cameras, pairs_of, random_model)

CPU = torch.device("cpu")
gsplat_torch = pytest.importorskip("gsplat.cuda._torch_impl",
                                   reason="gsplat==1.5.3 (test extra) is the reference")


def test_projection_matches_gsplat(garden):
    model, cameras = garden
    covars, _ = gsplat_torch._quat_scale_to_covar_preci(model.quats, model.scales,
                                                        compute_preci=False)
    viewmats = torch.stack([c.viewmat for c in cameras])
    Ks = torch.stack([c.K for c in cameras])
    width, height = cameras[0].width, cameras[0].height
    radii, means2d, depths, conics, _ = gsplat_torch._fully_fused_projection(
        model.means, covars, viewmats, Ks, width, height)
    exact, visible = gsplat_kernel_boxes(radii, means2d, conics, model.opacities, width, height)
    splats = project(model, cameras)

    c, g = splats.camera_ids, splats.gaussian_ids
    assert visible.sum() == len(splats) and visible[c, g].all()
    assert 0.05 < len(splats) / visible.numel() < 0.95, "the scene must have both kinds"
    assert ((radii > 0).all(dim=-1) & ~visible).sum() > 1000, "the opacity rule must cull some"
    assert_radii_match(splats.radii, exact[c, g])
    torch.testing.assert_close(splats.means2d, means2d[c, g], rtol=1e-10, atol=1e-8)
    torch.testing.assert_close(splats.depths, depths[c, g], rtol=1e-12, atol=0)
    torch.testing.assert_close(splats.conics, conics[c, g], rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(splats.opacities, torch.sigmoid(model.opacity_logits)[g])
    assert splats.camera_offsets == [0, *torch.cumsum(visible.sum(1), 0).tolist()]


@pytest.mark.parametrize("degree", [0, 1, 2, 3])
def test_sh_colors_match_gsplat(garden, degree):
    model, cameras = garden
    model.sh_degree = degree
    splats = project(model, cameras)
    centres = torch.stack([c.center for c in cameras])
    dirs = model.means[splats.gaussian_ids] - centres[splats.camera_ids]
    coeffs = model.sh[splats.gaussian_ids]
    expected = torch.clamp_min(gsplat_torch._spherical_harmonics(degree, dirs, coeffs) + 0.5, 0)
    torch.testing.assert_close(splats.colors, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(sh_to_color(coeffs, dirs), expected, rtol=1e-10, atol=1e-12)


def _wide() -> tuple[GaussianModel, list[Camera]]:
    """Large Gaussians well outside the views too, so that the frustum clamp holds some
    of the visible pairs."""
    model = random_model(400, seed=9, spread=3.0, log_scale=(-1.5, 0.3))
    return model, orbit_cameras(3, 45, 37, radius=3.0)


@pytest.fixture(scope="module")
def wide_scene():
    return _wide()


def test_projection_kernels_equal_the_torch_projection(wide_scene):
    from splatscale.render.projection import _EwaPairs, _ewa_pairs
    model, cameras = wide_scene
    gaussian_ids, camera_ids, viewmats, Ks, sizes = pairs_of(model, cameras)
    leaves = [t.detach().clone().requires_grad_(True)
              for t in (model.means, model.quats, model.log_scales)]
    ours = _EwaPairs.apply(*leaves, gaussian_ids, camera_ids, viewmats, Ks, sizes,
                           fisheye_or_none(cameras, CPU), False)[:3]
    reference = _ewa_pairs(*(t[gaussian_ids] for t in leaves), viewmats[camera_ids],
                           Ks[camera_ids], sizes[camera_ids])[:3]
    for a, b in zip(ours, reference):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    weights = torch.Generator().manual_seed(0)
    upstream = [torch.randn(t.shape, generator=weights, dtype=t.dtype) for t in ours]
    for a, b in zip(*(torch.autograd.grad(sum((o * u).sum() for o, u in zip(out, upstream)),
                                          leaves) for out in (ours, reference))):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    # The clamp must have held some pairs, or its branch of the backward went untested.
    x, _, z = (viewmats[camera_ids, :3, :3] @ model.means[gaussian_ids, :, None]
               + viewmats[camera_ids, :3, 3:])[..., 0].unbind(-1)
    assert ((x / z).abs() > 1.3 * 0.5 * 45 / Ks[camera_ids, 0, 0]).sum() > 10


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_kernel_rules_out_no_gaussian_the_test_keeps(dtype):
    """The visibility kernel rules a Gaussian out by a bound before computing its shape
    and opacity: 20,000 Gaussians of every size around and across the views' edges,
    tiny to larger than the view, and the kernel keeps exactly what the torch test
    keeps."""
    from splatscale.render.projection import _visibility_kernel, _visibility_torch
    from splatscale.render.splats import camera_tensors
    model = random_model(20_000, seed=21, spread=6.0, log_scale=(-7.0, 1.0), dtype=dtype,
                         opacity=(0.002, 1.0))
    cameras = orbit_cameras(2, 64, 48, radius=4.0, dtype=dtype)
    tensors = (model.means, model.quats, model.log_scales, model.opacity_logits,
               *camera_tensors(cameras, model.means))
    ours, reference = _visibility_kernel(*tensors), _visibility_torch(*tensors)
    assert 0.05 < ours.visible.float().mean() < 0.95
    assert torch.equal(ours.visible, reference.visible)


def test_projection_kernels_pass_gradcheck(wide_scene):
    from splatscale.render.projection import _EwaPairs
    model, cameras = wide_scene
    small = GaussianModel(**{n: t[:40].detach().clone() for n, t in model.parameters().items()},
                          sh_degree=model.sh_degree)
    gaussian_ids, camera_ids, viewmats, Ks, sizes = pairs_of(small, cameras)
    leaves = [t.detach().clone().requires_grad_(True)
              for t in (small.means, small.quats, small.log_scales)]
    assert torch.autograd.gradcheck(
        lambda *p: _EwaPairs.apply(*p, gaussian_ids, camera_ids, viewmats, Ks, sizes,
                                   fisheye_or_none(cameras, CPU), False)[:3], leaves)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_visibility_kernel_equals_the_torch_test(wide_scene, dtype):
    from splatscale.render.projection import _visibility_kernel, _visibility_torch
    from splatscale.render.splats import camera_tensors
    model, cameras = wide_scene
    model = GaussianModel(**{n: t.detach().to(dtype).clone() for n, t in
                             model.parameters().items()})
    model.opacity_logits[::7] = -6.0  # below 1/255: culled whatever the box
    tensors = (model.means, model.quats, model.log_scales, model.opacity_logits,
               *camera_tensors(cameras, model.means))
    ours, reference = _visibility_kernel(*tensors), _visibility_torch(*tensors)
    assert torch.equal(ours.visible, reference.visible)
    assert 0 < int(ours.visible.sum()) < ours.visible.numel()
    torch.testing.assert_close(ours.radii[ours.visible], reference.radii[reference.visible],
                               rtol=0, atol=1)  # ceil of values rounded differently
    assert (ours.radii[ours.visible] == reference.radii[reference.visible]).float().mean() > 0.99


@pytest.mark.parametrize("degree", [0, 1, 2, 3])
def test_sh_kernels_equal_the_torch_colours(wide_scene, degree):
    from splatscale.render.projection import _sh_colors, _ShColors
    model, cameras = wide_scene
    gaussian_ids, camera_ids, viewmats, _, _ = pairs_of(model, cameras)
    centres = torch.stack([c.center for c in cameras])
    leaves = [t.detach().clone() for t in (model.means, model.sh0, model.shN)]
    leaves[1][::5] *= 4  # some colours clamped at 0
    leaves[2][::5] *= 8
    leaves[2][:, (degree + 1) ** 2 - 1:] = torch.nan  # above the degree: never read
    leaves = [t.requires_grad_(True) for t in leaves]
    ours = _ShColors.apply(*leaves, gaussian_ids, camera_ids, centres, degree)
    reference = _sh_colors(*leaves, gaussian_ids, camera_ids, centres, degree)
    torch.testing.assert_close(ours, reference, rtol=1e-12, atol=1e-12)
    assert (reference == 0).any(), "the clamp must hold some colours"
    upstream = torch.randn(ours.shape, generator=torch.Generator().manual_seed(3),
                           dtype=ours.dtype)
    ours_grad = torch.autograd.grad((ours * upstream).sum(), leaves, allow_unused=True)
    reference_grad = torch.autograd.grad((reference * upstream).sum(), leaves,
                                         allow_unused=True)
    for a, b in zip(ours_grad, reference_grad):
        if a is None or b is None:  # none stands for zero (shN's at degree 0: unused)
            assert all(g is None or not g.any() for g in (a, b))
        else:
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert (ours_grad[2] is None) == (degree == 0)


@pytest.mark.parametrize("cameras, share", [(1, 0.7), (3, 0.3), (2, 0.0), (1, 1.0)])
def test_visible_pairs_are_torchs_nonzero(cameras, share):
    from splatscale.render.projection_kernels import visible_pairs
    visible = torch.rand(cameras, 1000, generator=torch.Generator().manual_seed(1)) < share
    for ours, torchs in zip(visible_pairs(visible.numpy()), visible.nonzero(as_tuple=True)):
        assert np.array_equal(ours, torchs.numpy())


def _reuse_scene(name: str):
    """A model and cameras for the test below: 400 Gaussians (camera 0's pairs one chunk
    of the kernels), 10,000 (many chunks of pairs, and blocks of rows), or 400 that
    camera 0, looking away, does not see."""
    if name == "many Gaussians":
        return random_model(10_000, seed=3, spread=3.0), orbit_cameras(3, 45, 37, radius=3.0)
    model, cameras = _wide()
    if name == "none seen by camera 0":
        cameras[0] = look_at_camera([0.0, 0.0, 30.0], [0.0, 0.0, 60.0], 45, 37, focal=54.0)
    return model, cameras


@pytest.mark.parametrize("scene", ["400 Gaussians", "many Gaussians", "none seen by camera 0"])
@pytest.mark.parametrize("stage", ["EWA", "EWA fisheye", "SH degree 0", "SH degree 3"])
def test_gradients_in_reused_buffers_are_those_in_fresh_ones(scene, stage):
    """The backward passes write their gradients into last step's buffers (``reusing``),
    whatever those hold: rows that no camera sees come out zero, and the others as in
    fresh buffers."""
    from splatscale.render.dense_gradients import reusing
    from splatscale.render.projection import _EwaPairs, _ShColors
    model, cameras = _reuse_scene(scene)
    if stage == "EWA fisheye":
        cameras = [Camera(c.viewmat, c.K, c.width, c.height, c.name, "fisheye")
                   for c in cameras]
    gaussian_ids, camera_ids, viewmats, Ks, sizes = pairs_of(model, cameras)
    seen_by_0 = len(set(gaussian_ids[camera_ids == 0].tolist()))
    assert seen_by_0 < len(model), "some unseen by camera 0"
    assert (seen_by_0 == 0) == (scene == "none seen by camera 0")
    if scene == "many Gaussians":
        assert seen_by_0 > 4 * 256, "camera 0's pairs in several chunks"
    ewa = stage.startswith("EWA")
    inputs = (model.means, model.quats, model.log_scales) if ewa else (model.means, model.sh0,
                                                                         model.shN)
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    centres = torch.stack([c.center for c in cameras])

    def gradients():
        if ewa:
            outputs = _EwaPairs.apply(*leaves, gaussian_ids, camera_ids, viewmats, Ks, sizes,
                                      fisheye_or_none(cameras, CPU), False)[:3]
        else:
            outputs = [_ShColors.apply(*leaves, gaussian_ids, camera_ids, centres,
                                       int(stage[-1]))]
        return torch.autograd.grad(sum(t.sum() for t in outputs), leaves, allow_unused=True)

    fresh = gradients()
    with reusing([torch.full_like(t, torch.nan) for t in leaves]):
        reused = gradients()
    unseen = torch.ones(len(model), dtype=torch.bool)
    unseen[gaussian_ids] = False
    assert unseen.any()
    for a, b in zip(fresh, reused):
        assert (a is None) == (b is None)
        assert a is None or (torch.equal(a, b) and not a.isnan().any())
        assert a is None or not a[unseen].any()


def test_sh_kernels_pass_gradcheck(wide_scene):
    from splatscale.render.projection import _ShColors
    model, cameras = wide_scene
    small = GaussianModel(**{n: t[:30].detach().clone() for n, t in model.parameters().items()})
    gaussian_ids, camera_ids, _, _, _ = pairs_of(small, cameras)
    centres = torch.stack([c.center for c in cameras])
    leaves = [t.detach().clone().requires_grad_(True) for t in (small.means, small.sh0,
                                                                 small.shN)]
    assert torch.autograd.gradcheck(
        lambda *p: _ShColors.apply(*p, gaussian_ids, camera_ids, centres, 3), leaves)


_BEFORE = np.load(data_path("projection_68d7002.npz"))
EPS = {dtype: torch.finfo(dtype).eps for dtype in (torch.float32, torch.float64)}


def _saved(name: str) -> torch.Tensor:
    return torch.from_numpy(_BEFORE[name])


def _weights_like(t: torch.Tensor, k: int) -> torch.Tensor:
    return torch.sin(torch.arange(t.numel(), dtype=torch.float64) * 0.37 + k).reshape(
        t.shape).to(t.dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_pinhole_plain_projection_is_that_of_commit_68d7002(dtype):
    """Fisheye cameras and anti-aliased splats change nothing, bit for bit, for pinhole
    cameras and plain models: the visibility, the splats and their gradients (the torch
    reference's to rounding) equal those the code computed before either existed
    (tests/data/projection_68d7002.npz, written by tests/data/projection_68d7002.py at
    that commit). Compositing, which neither touches, is left out: a render's last bits
    differed between numba's cached and freshly compiled compositing kernels. The
    opacities' sigmoid changed since, to round alike wherever a Gaussian is stored
    (``model.gaussians.sigmoid``): the opacities and their logits' gradient are held to
    rounding, the rest to the bit. So are the float64 colours: the SH kernels have
    since run in lanes, where their fast-math sums reassociate otherwise (float32's
    are the same bits, ``test_sh_kernels``)."""
    from splatscale.render.projection import _ewa_pairs, visibility_cpu, visibility_torch
    from splatscale.render.splats import camera_tensors
    params = {n: _saved(f"inputs/params/{n}").to(dtype) for n in GaussianModel.PARAMETERS}
    model = GaussianModel(**params, sh_degree=1).requires_grad_(True)
    cameras = [Camera(v, k, int(_BEFORE[f"inputs/sizes/{i}/0"]),
                      int(_BEFORE[f"inputs/sizes/{i}/1"]))
               for i, (v, k) in enumerate(zip(_saved("inputs/viewmats"), _saved("inputs/Ks")))]
    before = f"{dtype}/"

    def same(got, name):
        rounded = ("splats/4", "splat_grads/3")  # the opacities, their logits' gradient
        if name in rounded or (dtype == torch.float64 and name == "splats/3"):
            torch.testing.assert_close(got.detach(), _saved(before + name), rtol=4 * EPS[dtype],
                                       atol=0, msg=name)
        else:
            assert torch.equal(got.detach(), _saved(before + name)), name

    for name, seen in (("vis_kernel", visibility_cpu(model, cameras)),
                       ("vis_torch", visibility_torch(model, cameras))):
        same(seen.radii, f"{name}/0")
        same(seen.visible, f"{name}/1")
    splats = project(model, cameras)
    columns = [splats.means2d, splats.conics, splats.depths, splats.colors, splats.opacities]
    for k, got in enumerate(columns + [splats.radii, splats.camera_ids, splats.gaussian_ids]):
        same(got, f"splats/{k}")
    weights = [_weights_like(c, k) for k, c in enumerate(columns)]
    parameters = list(model.parameters().values())
    grads = torch.autograd.grad(sum((c * w).sum() for c, w in zip(columns, weights)),
                                parameters)
    for k, got in enumerate(grads):
        same(got, f"splat_grads/{k}")
    viewmats, Ks, sizes = camera_tensors(cameras, model.means)
    leaves = parameters[:3]
    c, g = splats.camera_ids, splats.gaussian_ids
    reference = _ewa_pairs(*(t[g] for t in leaves), viewmats[c], Ks[c], sizes[c])[:3]
    # torch's exp is vectorised and not correctly rounded: its last bit differs between
    # CPUs, so the torch reference is held to rounding, the kernels above to the bit.
    tolerance = {"rtol": 1e-12, "atol": 1e-15} if dtype == torch.float64 else {}
    for k, got in enumerate(reference):
        torch.testing.assert_close(got.detach(), _saved(before + f"ewa_torch/{k}"), **tolerance)
    reference_grads = torch.autograd.grad(
        sum((o * w).sum() for o, w in zip(reference, weights[:3])), leaves)
    for k, got in enumerate(reference_grads):
        torch.testing.assert_close(got, _saved(before + f"ewa_torch_grads/{k}"), **tolerance)

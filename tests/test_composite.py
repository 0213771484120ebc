"""Compositing kernels against a brute-force per-pixel reference in float64."""

from __future__ import annotations

import pytest
import torch

from splatscale.model.gaussians import SH_C0
from splatscale.render import project, render
from splatscale.render.binning import bin_tiles
from splatscale.render.compositing_kernels import ALPHA_MAX, ALPHA_MIN, T_MIN
from splatscale.render.rasterize import composite
from tests.conftest import look_at_camera, random_model


def brute_force_composite(means2d, conics, features, opacities, background, depths,
                          width, height):
    """Every splat of the image at every pixel, nearest first, with the 3DGS alpha rules."""
    ys, xs = torch.meshgrid(torch.arange(height, dtype=means2d.dtype) + 0.5,
                            torch.arange(width, dtype=means2d.dtype) + 0.5, indexing="ij")
    T = torch.ones(height, width, dtype=means2d.dtype)
    live = torch.ones(height, width, dtype=torch.bool)
    image = torch.zeros(height, width, features.shape[1], dtype=means2d.dtype)
    for i in torch.argsort(depths, stable=True).tolist():
        dx, dy = means2d[i, 0] - xs, means2d[i, 1] - ys
        sigma = 0.5 * (conics[i, 0] * dx * dx + conics[i, 2] * dy * dy) + conics[i, 1] * dx * dy
        alpha = torch.clamp(opacities[i] * torch.exp(-sigma), max=ALPHA_MAX)
        use = live & (sigma >= 0) & (alpha >= ALPHA_MIN)
        next_T = T * (1 - alpha)
        stop = use & (next_T <= T_MIN)
        contributes = use & ~stop
        image = image + torch.where(contributes, alpha * T, 0.0)[..., None] * features[i]
        T = torch.where(contributes, next_T, T)
        live = live & ~stop
    return image + T[..., None] * background, 1 - T


def mixed_scene(seed: int):
    """Overlapping, tiny, huge, opaque (saturating, alpha-clamped), behind-camera and
    off-image Gaussians, seen by a camera whose image is not a multiple of 16."""
    model = random_model(90, seed=seed, spread=1.2, log_scale=(-2.5, -1.2))
    with torch.no_grad():
        model.log_scales[:8] = -6.0                              # sub-pixel
        model.log_scales[8:12] = 0.3                             # larger than the image
        model.opacity_logits[12:30] = 9.0                        # alpha clamps at 0.999
        model.means[12:30] = 0.15 * model.means[12:30]           # ... and stack up: T < 1e-4
        model.means[30:36] = torch.tensor([0.0, 0.0, 8.0])       # behind the camera
        model.means[36:42, 0] = 6.0                              # far off to the side
    camera = look_at_camera([0, 0, 3.5], [0, 0, 0], width=45, height=37, focal=40.0)
    return model, camera


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_forward_and_gradients_match_brute_force(seed):
    model, camera = mixed_scene(seed)
    with torch.no_grad():
        splats = project(model, [camera]).of_camera(0)
    assert 30 < len(splats) < len(model), "the scene must cull some Gaussians and keep most"
    g = torch.Generator().manual_seed(seed)
    leaves = {
        "means2d": splats.means2d.clone(),
        "conics": splats.conics.clone(),
        "colors": splats.colors.clone(),
        "depths": splats.depths.clone(),
        "opacities": splats.opacities.clone(),
        "background": torch.rand(3, generator=g, dtype=torch.float64),
    }
    for leaf in leaves.values():
        leaf.requires_grad_(True)
    w, h = camera.width, camera.height
    rgb_weights = torch.randn(h, w, 3, generator=g, dtype=torch.float64)
    depth_weights = torch.randn(h, w, generator=g, dtype=torch.float64)
    alpha_weights = torch.randn(h, w, generator=g, dtype=torch.float64)

    bins = bin_tiles(splats.means2d, splats.radii, splats.depths, splats.keys, w, (0, h))
    rgb, depth_sum, alpha = composite(*leaves.values(), bins, w, (0, h), depth=True)
    p = leaves
    ref_image, ref_alpha = brute_force_composite(
        p["means2d"], p["conics"], torch.cat([p["colors"], p["depths"][:, None]], 1),
        p["opacities"], torch.cat([p["background"], torch.zeros(1, dtype=torch.float64)]),
        splats.depths, w, h)
    ref_rgb, ref_depth_sum = ref_image[..., :3], ref_image[..., 3]
    assert (ref_alpha > 1 - 1e-3).any(), "some pixels must saturate"
    for got, want in ((rgb, ref_rgb), (depth_sum, ref_depth_sum), (alpha, ref_alpha)):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)

    def loss(rgb, depth_sum, alpha):
        return ((rgb * rgb_weights).sum() + (depth_sum * depth_weights).sum()
                + (alpha * alpha_weights).sum())

    ours = torch.autograd.grad(loss(rgb, depth_sum, alpha), list(leaves.values()))
    reference = torch.autograd.grad(loss(ref_rgb, ref_depth_sum, ref_alpha),
                                    list(leaves.values()))
    for name, got, want in zip(leaves, ours, reference):
        assert want.abs().max() > 0, name
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9 * want.abs().max().item(),
                                   msg=lambda m, name=name: f"d/d{name}: {m}")


def test_empty_image_is_background():
    model = random_model(5)
    with torch.no_grad():
        model.means[:] = torch.tensor([0.0, 0.0, 10.0])  # all behind the camera
    camera = look_at_camera([0, 0, 3.5], [0, 0, 0], width=20, height=18, focal=20.0)
    splats = project(model, [camera]).of_camera(0)
    assert len(splats) == 0
    bins = bin_tiles(splats.means2d, splats.radii, splats.depths, splats.keys, 20, (0, 18))
    background = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)
    rgb, depth_sum, alpha = composite(splats.means2d, splats.conics, splats.colors,
                                      splats.depths, splats.opacities, background, bins, 20,
                                      (0, 18), depth=True)
    assert torch.equal(rgb, background.expand(18, 20, 3))
    assert torch.equal(depth_sum, torch.zeros(18, 20, dtype=torch.float64))
    assert torch.equal(alpha, torch.zeros(18, 20, dtype=torch.float64))


@pytest.mark.parametrize("needles", [False, True])
def test_opacity_aware_boxes_change_no_pixel(needles):
    """The render equals compositing every Gaussian in front of the camera at every
    pixel, with no box and no opacity cull: outside its opacity-aware box (and below
    opacity 1/255) a Gaussian's alpha is under 1/255 everywhere, and the blocks of
    pixels the kernels skip are outside it. Needles: long thin Gaussians at every
    angle, whose boxes are mostly empty."""
    gsplat_torch = pytest.importorskip("gsplat.cuda._torch_impl")
    model = random_model(150, seed=7, spread=1.2, log_scale=(-2.5, -1.0), opacity=(0.001, 0.999),
                         sh_degree=0)
    with torch.no_grad():
        model.opacity_logits[:10] = -5.5    # just above 1/255: a box of a fraction of a sigma
        model.opacity_logits[10:20] = -6.0  # below 1/255: culled
        if needles:
            model.log_scales[:, 0] = -0.4
            model.log_scales[:, 1:] = -4.5
    camera = look_at_camera([0, 0, 3.5], [0, 0, 0], width=45, height=37, focal=40.0)
    covars, _ = gsplat_torch._quat_scale_to_covar_preci(model.quats, model.scales,
                                                        compute_preci=False)
    _, means2d, depths, conics, _ = gsplat_torch._fully_fused_projection(
        model.means, covars, camera.viewmat[None], camera.K[None], camera.width, camera.height)
    in_front = depths[0] > 0.01
    colors = torch.clamp_min(model.sh0[:, 0] * SH_C0 + 0.5, 0)
    want, _ = brute_force_composite(means2d[0][in_front], conics[0][in_front], colors[in_front],
                                    model.opacities[in_front], torch.zeros(3, dtype=torch.float64),
                                    depths[0][in_front], camera.width, camera.height)
    splats = project(model, [camera])
    assert len(splats) < in_front.sum(), "some Gaussians must be culled by opacity"
    got = render(model, camera, background=torch.zeros(3, dtype=torch.float64)).rgb
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("absgrad", [False, True])
@pytest.mark.parametrize("depth", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_kept_graph_gives_the_same_gradients_again(absgrad, depth, dtype):
    """The backward writes its gradient rows over the packed splats: a second backward
    through a graph kept for it (``retain_graph``) packs them again, and its gradients
    (absgrad's too) are the first's, bit for bit, with depth and without."""
    model, camera = mixed_scene(0)
    with torch.no_grad():
        splats = project(model.to(dtype=dtype), [camera]).of_camera(0)
    leaves = {n: getattr(splats, n).detach().clone().requires_grad_(True)
              for n in ("means2d", "conics", "colors", "depths", "opacities")}
    absgrad_leaf = (torch.zeros_like(leaves["means2d"]).requires_grad_(True) if absgrad
                    else None)
    bins = bin_tiles(leaves["means2d"], splats.radii, leaves["depths"], splats.keys,
                     camera.width, (0, camera.height), leaves["conics"], leaves["opacities"])
    rgb, depth_sum, alpha = composite(leaves["means2d"], leaves["conics"], leaves["colors"],
                                      leaves["depths"], leaves["opacities"],
                                      torch.zeros(3, dtype=dtype), bins, camera.width,
                                      (0, camera.height), absgrad_leaf, depth=depth)
    weights = torch.linspace(-1, 1, rgb.numel(), dtype=dtype).reshape(rgb.shape)
    loss = (rgb * weights).sum() + alpha.sum() + (depth_sum.sum() if depth else 0)
    inputs = [leaf for name, leaf in leaves.items() if depth or name != "depths"]
    inputs += [absgrad_leaf] if absgrad else []
    first = torch.autograd.grad(loss, inputs, retain_graph=True)
    second = torch.autograd.grad(loss, inputs)
    assert all(g.abs().max() > 0 for g in first)
    assert all(torch.equal(a, b) for a, b in zip(first, second))

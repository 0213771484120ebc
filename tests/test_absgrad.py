"""The absolute view-space gradient (AbsGS, gsplat's ``absgrad=True``): per splat, the
sum over pixels of each pixel's |d loss / d means2d|, x and y apart, against a brute
force that differentiates each pixel's loss term on its own."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from splatscale.render import project, rasterize
from splatscale.render.rasterize import DEPTH_EPS
from tests.conftest import look_at_camera, orbit_cameras, random_model
from tests.test_composite import brute_force_composite
from tests.test_cuda_backend import CPU, STAND_INS, assert_gradients_close, weighted_sum

WIDTH, HEIGHT = 37, 29  # three tiles by two, not multiples of 16
DIFFERENTIABLE = ("means2d", "conics", "colors", "depths", "opacities")


def overlapping_splats(dtype=torch.float64):
    """A dozen large, half-transparent splats, most pixels under several of them."""
    model = random_model(12, seed=3, spread=0.5, log_scale=(-1.6, -0.9), opacity=(0.3, 0.8),
                         dtype=dtype)
    camera = look_at_camera([0.3, 0.2, 3.0], [0, 0, 0], WIDTH, HEIGHT, focal=32.0, dtype=dtype)
    with torch.no_grad():
        splats = project(model, [camera]).of_camera(0)
    assert len(splats) == 12
    return splats


def with_leaves(splats, absgrad: bool = True):
    """``splats`` with fresh leaves for the differentiable columns, and an absgrad."""
    leaves = {name: getattr(splats, name).detach().clone().requires_grad_(True)
              for name in DIFFERENTIABLE}
    if absgrad:
        leaves["absgrad"] = torch.zeros_like(leaves["means2d"]).requires_grad_(True)
    return replace(splats, **leaves), leaves


def pixel_weights(rows, dtype=torch.float64, seed=0):
    """Random weights of each pixel's rgb, alpha and depth in the loss."""
    g = torch.Generator().manual_seed(seed)
    h = rows[1] - rows[0]
    return [torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
            for shape in ((h, WIDTH, 3), (h, WIDTH), (h, WIDTH))]


def per_pixel_loss(rgb, alpha, depth, weights):
    """[h, W]: each pixel's own term of the loss (no depth term where ``depth`` is None,
    as a render without depth gives)."""
    terms = (rgb * weights[0]).sum(-1) + alpha * weights[1]
    return terms if depth is None else terms + depth * weights[2]


def brute_force_absgrad(splats, rows, weights, with_depth=True):
    """Each pixel's loss term differentiated on its own (float64 autograd through the
    per-pixel reference renderer), its absolute value summed over the band's pixels;
    the loss's depth term only ``with_depth``."""
    means2d = splats.means2d.detach().clone().requires_grad_(True)
    features = torch.cat([splats.colors, splats.depths[:, None]], 1).detach()
    image, alpha = brute_force_composite(means2d, splats.conics.detach(), features,
                                         splats.opacities.detach(),
                                         torch.zeros(4, dtype=torch.float64),
                                         splats.depths.detach(), WIDTH, HEIGHT)
    y0, y1 = rows
    depth = image[..., 3] / torch.clamp_min(alpha, DEPTH_EPS)
    terms = per_pixel_loss(image[y0:y1, :, :3], alpha[y0:y1],
                           depth[y0:y1] if with_depth else None, weights)
    total = torch.zeros_like(means2d)
    for term in terms.flatten():
        (grad,) = torch.autograd.grad(term, means2d, retain_graph=True)
        total += grad.abs()
    return total


@pytest.mark.parametrize("depth", [True, False])
@pytest.mark.parametrize("rows", [(0, HEIGHT), (6, 21)])
def test_cpu_absgrad_is_the_sum_of_each_pixels_absolute_gradient(rows, depth):
    """A whole image, and a band across a tile row's edge: only its pixels count;
    rendered with depth and without (as training renders)."""
    splats, leaves = with_leaves(overlapping_splats())
    weights = pixel_weights(rows)
    out = rasterize(splats, WIDTH, HEIGHT, rows, depth=depth)
    per_pixel_loss(out.rgb, out.alpha, out.depth, weights).sum().backward()
    want = brute_force_absgrad(splats, rows, weights, depth)
    got = leaves["absgrad"].grad
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    # The pixels pull the means different ways: the absolute sums exceed the gradient's.
    assert (want > leaves["means2d"].grad.abs() * 1.5).any()


def test_a_band_counts_only_its_own_pixels():
    """Bands that tile the image add up to the whole image's absgrad."""
    splats = overlapping_splats()
    weights = pixel_weights((0, HEIGHT))
    sums = []
    for cuts in ([0, HEIGHT], [0, 6, 21, HEIGHT]):
        total = 0
        for y0, y1 in zip(cuts[:-1], cuts[1:]):
            band, leaves = with_leaves(splats)
            out = rasterize(band, WIDTH, HEIGHT, (y0, y1), depth=True)
            per_pixel_loss(out.rgb, out.alpha, out.depth,
                           [w[y0:y1] for w in weights]).sum().backward()
            total = total + leaves["absgrad"].grad
        sums.append(total)
    torch.testing.assert_close(sums[1], sums[0], rtol=1e-12, atol=1e-15)


def test_absgrad_flows_through_each_cameras_slice():
    """Set on the splats of several cameras, each camera's rows get their own view's."""
    model = random_model(150, seed=4, spread=1.0)
    cameras = orbit_cameras(3, WIDTH, HEIGHT)
    with torch.no_grad():
        splats = project(model, cameras)
    splats, leaves = with_leaves(splats)
    weights = [pixel_weights((0, HEIGHT), seed=i) for i in range(3)]
    loss = 0
    for i in range(3):
        out = rasterize(splats.of_camera(i), WIDTH, HEIGHT, depth=True)
        loss = loss + per_pixel_loss(out.rgb, out.alpha, out.depth, weights[i]).sum()
    loss.backward()
    for i in range(3):
        view, view_leaves = with_leaves(splats.of_camera(i))
        out = rasterize(view, WIDTH, HEIGHT, depth=True)
        per_pixel_loss(out.rgb, out.alpha, out.depth, weights[i]).sum().backward()
        lo, hi = splats.camera_offsets[i], splats.camera_offsets[i + 1]
        assert torch.equal(leaves["absgrad"].grad[lo:hi], view_leaves["absgrad"].grad)


@pytest.mark.parametrize("rows", [(0, HEIGHT), (9, 25)])
def test_the_cuda_backends_absgrad_equals_the_cpu_backends(rows):
    """The cuda backend's code (its reordering and band shift, on the CPU with the
    stand-in kernels) hands back the kernel's absgrad as the cpu backend computes it,
    and the other gradients as without absgrad."""
    model = random_model(120, seed=5, spread=1.0)
    camera = orbit_cameras(3, WIDTH, HEIGHT)[1]
    with torch.no_grad():
        splats = project(model, [camera])
    splats.keys = torch.randperm(len(splats), generator=torch.Generator().manual_seed(1))
    weights = pixel_weights(rows)
    grads = {}
    for name, backend in (("cuda", STAND_INS), ("cpu", CPU)):
        ours, leaves = with_leaves(splats)
        out = rasterize(ours, WIDTH, HEIGHT, rows, backend=backend, depth=True)
        per_pixel_loss(out.rgb, out.alpha, out.depth, weights).sum().backward()
        grads[name] = {key: leaf.grad for key, leaf in leaves.items()}
    assert grads["cpu"]["absgrad"].abs().max() > 0
    for key in grads["cpu"]:
        torch.testing.assert_close(grads["cuda"][key], grads["cpu"][key], rtol=1e-8,
                                   atol=1e-12, msg=key)


@pytest.mark.parametrize("rows", [(0, 120), (37, 101)])
def test_absgrad_changes_no_pixel_and_the_other_gradients_by_rounding_only(rows):
    """In float32, with absgrad or without: the same pixels, and the other gradients
    within rounding (the backward kernel that sums absgrad is compiled apart, and its
    vectorised sums may group differently)."""
    model = random_model(2000, seed=6, spread=1.2, log_scale=(-4.0, -2.0),
                         dtype=torch.float32)
    camera = orbit_cameras(2, 160, 120, dtype=torch.float32)[0]
    with torch.no_grad():
        splats = project(model, [camera])
    results = []
    for absgrad in (False, True):
        ours, leaves = with_leaves(splats, absgrad)
        out = rasterize(ours, camera.width, camera.height, rows, depth=True)
        weighted_sum([out.rgb, out.alpha, out.depth]).backward()
        results.append(([out.rgb, out.alpha, out.depth],
                        {name: leaves[name].grad for name in DIFFERENTIABLE}))
    (plain_pixels, plain), (pixels, grads) = results
    assert all(torch.equal(a, b) for a, b in zip(plain_pixels, pixels))
    for name in DIFFERENTIABLE:
        torch.testing.assert_close(grads[name], plain[name], rtol=1e-5,
                                   atol=1e-6 * plain[name].abs().max().item(), msg=name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("rows", [None, (40, 200)])
def test_gsplats_absgrad_on_the_gpu_equals_the_cpu_backends(rows):
    """gsplat's kernels' absgrad, carried back through the cuda backend's reordering
    and band shift, against the numba kernels' in float32."""
    model = random_model(2000, seed=7, dtype=torch.float32)
    camera = orbit_cameras(1, 320, 240, dtype=torch.float32)[0]
    with torch.no_grad():
        splats = project(model, [camera])
    splats.keys = torch.arange(len(splats), 0, -1)  # reversed: the cuda backend reorders
    results = {}
    for device in ("cpu", "cuda"):  # the same splats on each
        moved = replace(splats, **{name: getattr(splats, name).to(device) for name in (
            "camera_ids", "gaussian_ids", "radii", "keys", *DIFFERENTIABLE)})
        ours, leaves = with_leaves(moved)
        out = rasterize(ours, camera.width, camera.height, rows)
        weighted_sum([out.rgb.cpu(), out.alpha.cpu()]).backward()
        results[device] = leaves["absgrad"].grad
    assert results["cpu"].abs().max() > 0
    assert_gradients_close(results["cuda"], results["cpu"], "absgrad")

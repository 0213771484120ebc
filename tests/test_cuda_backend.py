"""The cuda backend: its own code on the CPU (pure-torch stand-ins, built from gsplat's
reference functions, in place of its CUDA kernels) against the cpu backend, and on a
GPU when there is one."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import partial

import pytest
import torch

from splatscale.backends import backend_named, cuda
from splatscale.backends.cuda import Kernels, composite
from splatscale.data.cameras import Camera
from splatscale.render import project, render
from splatscale.render.binning import bin_tiles
from splatscale.render.conventions import ALPHA_MAX, ALPHA_MIN, T_MIN
from splatscale.render.rasterize import composite as cpu_composite
from splatscale.engine.factory import OffloadOptions, make_engine
from tests.gsplat_reference import cuda_gradient
from tests.conftest import (HANG_GUARD, densifying_run, densifying_scene, gsplat_kernel_boxes,
                            data_path, orbit_cameras, random_model, state_by_key)

WIDTH, HEIGHT = 45, 37  # not multiples of 16


def rasterize_to_pixels(means2d, conics, colors, opacities, width, height, tile_size, offsets,
                        flatten_ids, backgrounds, absgrad=False):
    """A pure-torch stand-in for gsplat's CUDA ``rasterize_to_pixels`` (one image),
    following its kernel: each pixel takes its tile's splats in the given order,
    alpha = min(0.999, opacity exp(-sigma)), skips alpha < 1/255, and stops before
    the transmittance would reach 1e-4. With ``absgrad``, the backward pass leaves
    on ``means2d`` (as gsplat's does) an ``absgrad`` [1, M, 2]: each pixel reads the
    means from a copy of its own, whose gradient (a hook's) is that pixel's alone."""
    channels = colors.shape[-1]
    if absgrad:
        means2d.absgrad = torch.zeros_like(means2d.detach())
    ends = torch.cat([offsets.flatten()[1:], torch.tensor([len(flatten_ids)])])
    image = torch.zeros(height, width, channels, dtype=colors.dtype)
    alphas = torch.zeros(height, width, 1, dtype=colors.dtype)
    rows = []
    for tile, (start, end) in enumerate(zip(offsets.flatten().tolist(), ends.tolist())):
        ty, tx = divmod(tile, offsets.shape[-1])
        ys, xs = torch.meshgrid(torch.arange(ty * tile_size, min(height, (ty + 1) * tile_size)),
                                torch.arange(tx * tile_size, min(width, (tx + 1) * tile_size)),
                                indexing="ij")
        ys, xs = ys.flatten(), xs.flatten()
        ids = flatten_ids[start:end]
        means = means2d[0, ids]
        if absgrad:
            means = means.expand(len(ys), *means.shape)
            means.register_hook(partial(_add_abs, means2d.absgrad[0], ids))
        d = torch.stack([xs + 0.5, ys + 0.5], -1)[:, None].to(colors.dtype) - means
        a, b, c = conics[0, ids].unbind(-1)
        sigma = 0.5 * (a * d[..., 0] ** 2 + c * d[..., 1] ** 2) + b * d[..., 0] * d[..., 1]
        alpha = torch.clamp_max(opacities[0, ids] * torch.exp(-sigma), ALPHA_MAX)
        alpha = torch.where((sigma >= 0) & (alpha >= ALPHA_MIN), alpha, torch.zeros_like(alpha))
        before = torch.cumprod(torch.cat([torch.ones_like(alpha[:, :1]), 1 - alpha], 1), 1)
        alive = torch.cumprod((before[:, 1:] > T_MIN).to(alpha.dtype), 1)  # stop for good
        weights = alive * alpha * before[:, :-1]
        rows.append((ys, xs, weights @ colors[0, ids], (weights.sum(1))))
    for ys, xs, rgb, alpha in rows:
        image = image.index_put((ys, xs), rgb)
        alphas = alphas.index_put((ys, xs), alpha[:, None])
    return (image + (1 - alphas) * backgrounds[0])[None], alphas[None]


def _add_abs(total, ids, per_pixel):
    """Each splat's absolute gradients [pixels, splats, 2] summed over the pixels."""
    total.index_add_(0, ids, per_pixel.abs().sum(0))


def isect_tiles(means2d, radii, depths, tile_size, tiles_x, tiles_y):
    """gsplat's pure-torch intersections, sorted stably as its CUDA radix sort sorts
    them (its own torch sort is not stable: equal depths would fall in any order)."""
    from gsplat.cuda import _torch_impl
    per_splat, ids, flatten_ids = _torch_impl._isect_tiles(means2d, radii, depths, tile_size,
                                                           tiles_x, tiles_y, sort=False)
    order = torch.sort(ids, stable=True).indices
    return per_splat, ids[order], flatten_ids[order]


def fully_fused_projection(means, covars, quats, scales, viewmats, Ks, width, height, eps2d,
                           near_plane, far_plane, packed, calc_compensations, camera_model,
                           opacities):
    """gsplat's packed projection: its torch reference, with its CUDA kernel's
    visibility rule (``gsplat_kernel_boxes``, of the opacities times the compensations
    where it computes them, as the kernel does) and gradient of the compensations
    (``cuda_gradient``), packed camera-major."""
    from gsplat.cuda import _torch_impl
    assert covars is None and packed
    covars, _ = _torch_impl._quat_scale_to_covar_preci(quats, scales, compute_preci=False)
    radii, means2d, depths, conics, compensations = _torch_impl._fully_fused_projection(
        means, covars, viewmats, Ks, width, height, eps2d, near_plane, far_plane,
        calc_compensations, camera_model)
    if calc_compensations:
        compensations = cuda_gradient(compensations)
        opacities = opacities * compensations.detach()
    exact, kept = gsplat_kernel_boxes(radii, means2d, conics, opacities, width, height)
    camera_ids, gaussian_ids = kept.nonzero(as_tuple=True)
    return (torch.zeros_like(camera_ids), camera_ids.int(), gaussian_ids.int(),
            torch.ceil(exact[kept]).int(), means2d[kept], depths[kept], conics[kept],
            compensations[kept] if calc_compensations else None)


def reference_kernels() -> Kernels:
    from gsplat.cuda import _torch_impl
    return Kernels(fully_fused_projection, _torch_impl._spherical_harmonics, isect_tiles,
                   _torch_impl._isect_offset_encode, rasterize_to_pixels)


# The cuda backend's code with the stand-in kernels, on CPU tensors.
STAND_INS = cuda.backend(reference_kernels)
CPU = backend_named("cpu")


def one_view(seed: int, dtype=torch.float64):
    camera = orbit_cameras(3, WIDTH, HEIGHT, dtype=dtype)[seed % 3]
    with torch.no_grad():
        splats = project(random_model(120, seed=seed, dtype=dtype), [camera]).of_camera(0)
    inputs = {name: getattr(splats, name).detach().clone().requires_grad_(True)
              for name in ("means2d", "conics", "colors", "depths", "opacities")}
    return splats, inputs


def render_both(splats, inputs, rows, background):
    """rgb, depth sum and alpha of the cuda backend's code and of the cpu backend."""
    ours = composite(inputs["means2d"], inputs["conics"], inputs["colors"], inputs["depths"],
                     inputs["opacities"], splats.radii, splats.keys, background, WIDTH, rows,
                     reference_kernels(), depth=True)
    bins = bin_tiles(splats.means2d, splats.radii, inputs["depths"].detach(), splats.keys, WIDTH,
                     rows)
    theirs = cpu_composite(inputs["means2d"], inputs["conics"], inputs["colors"],
                           inputs["depths"], inputs["opacities"], background, bins, WIDTH,
                           rows, depth=True)
    return ours, theirs


def gradients(outputs, inputs) -> dict:
    weights = torch.Generator().manual_seed(1)
    loss = sum((o * torch.rand(o.shape, generator=weights, dtype=o.dtype)).sum()
               for o in outputs)
    return dict(zip(inputs, torch.autograd.grad(loss, list(inputs.values()),
                                                allow_unused=True)))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("rows", [(0, HEIGHT), (5, 29)])
def test_cuda_compositing_code_equals_the_cpu_backend(seed, rows):
    splats, inputs = one_view(seed)
    background = torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)
    ours, theirs = render_both(splats, inputs, rows, background)
    for a, b, name in zip(ours, theirs, ("rgb", "depth sum", "alpha")):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12, msg=name)
    ours_grad, theirs_grad = gradients(ours, inputs), gradients(theirs, inputs)
    for name in ("means2d", "conics", "colors", "opacities", "depths"):
        torch.testing.assert_close(ours_grad[name], theirs_grad[name], rtol=1e-7, atol=1e-10,
                                   msg=name)


def test_a_band_equals_those_rows_of_the_full_render():
    splats, inputs = one_view(4)
    background = torch.zeros(3, dtype=torch.float64)
    kernels = reference_kernels()
    args = [inputs[n] for n in ("means2d", "conics", "colors", "depths", "opacities")]
    full = composite(*args, splats.radii, splats.keys, background, WIDTH, (0, HEIGHT), kernels,
                     depth=True)
    band = composite(*args, splats.radii, splats.keys, background, WIDTH, (11, 27), kernels,
                     depth=True)
    for whole, part in zip(full, band):
        torch.testing.assert_close(part, whole[11:27], rtol=1e-12, atol=0)


def test_equal_depths_are_composited_in_key_order():
    splats, inputs = one_view(5)
    inputs["depths"] = torch.full_like(inputs["depths"], 3.0)  # every pair a tie
    splats.keys = torch.randperm(len(splats), generator=torch.Generator().manual_seed(0))
    background = torch.zeros(3, dtype=torch.float64)
    ours, theirs = render_both(splats, inputs, (0, HEIGHT), background)
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-9, atol=1e-12)


def weighted_sum(outputs, seed: int = 1):
    weights = torch.Generator().manual_seed(seed)
    return sum((o * torch.rand(o.shape, generator=weights, dtype=o.dtype)).sum()
               for o in outputs)


def model_gradients(model, loss_of) -> dict:
    leaves = model.detach().requires_grad_(True)
    loss = loss_of(leaves)
    return dict(zip(leaves.PARAMETERS, torch.autograd.grad(
        loss, list(leaves.parameters().values()), allow_unused=True)))


def as_fisheye(camera: Camera) -> Camera:
    """``camera``'s pose and intrinsics, projecting as an equidistant fisheye."""
    return Camera(camera.viewmat, camera.K, camera.width, camera.height, camera.name,
                  "fisheye")


# Every camera model with a model plain and anti-aliased: the cuda backend's glue (the
# runs of one projection, the compensations times the opacities) against the cpu one.
KINDS = [("pinhole", False), ("pinhole", True), ("fisheye", False), ("fisheye", True)]


def assert_gradient_close(ours, theirs, camera_model: str, atol: float, name: str) -> None:
    """The stand-ins' gradient against the cpu backend's. A fisheye camera's: the cpu
    backend follows gsplat's CUDA backward (``fisheye_proj_vjp``), which differs from
    autograd through its torch reference by about that reference's eps (1e-7) relative:
    3e-8 of the largest gradient here."""
    slack = 1e-6 * float(theirs.abs().max()) if camera_model == "fisheye" else 0.0
    torch.testing.assert_close(ours, theirs, rtol=1e-7, atol=max(atol, slack), msg=name)



@pytest.mark.parametrize("degree", [0, 3])
@pytest.mark.parametrize("camera_model, antialiased", KINDS)
def test_cuda_projection_code_equals_the_cpu_backend(garden, degree, camera_model,
                                                     antialiased):
    model, cameras = garden
    model = model.detach()
    model.sh_degree, model.antialiased = degree, antialiased
    if camera_model == "fisheye":  # the second a pinhole: a batch of two runs
        cameras = [as_fisheye(cameras[0]), cameras[1], *map(as_fisheye, cameras[2:])]
    ours, theirs = project(model, cameras, backend=STAND_INS), project(model, cameras)
    assert torch.equal(ours.camera_ids, theirs.camera_ids)
    assert torch.equal(ours.gaussian_ids, theirs.gaussian_ids)
    assert ours.camera_offsets == theirs.camera_offsets
    assert torch.equal(ours.keys, theirs.keys)
    assert (ours.radii - theirs.radii).abs().max() <= 1  # a ceiling may round either way
    assert (ours.radii != theirs.radii).float().mean() < 1e-3
    for name in ("means2d", "conics", "depths", "colors", "opacities"):
        torch.testing.assert_close(getattr(ours, name), getattr(theirs, name), rtol=1e-8,
                                   atol=1e-10, msg=name)

    def loss_of(backend):
        def loss(leaves):
            splats = project(leaves, cameras, backend=backend)
            return weighted_sum([splats.means2d, splats.conics, splats.depths, splats.colors,
                                 splats.opacities])
        return loss
    ours_grad, theirs_grad = (model_gradients(model, loss_of(b)) for b in (STAND_INS, CPU))
    for name in model.PARAMETERS:
        if theirs_grad[name] is None:  # shN at degree 0
            assert ours_grad[name] is None or not ours_grad[name].any()
            continue
        assert_gradient_close(ours_grad[name], theirs_grad[name], camera_model, 1e-9, name)


def test_cameras_of_different_sizes_are_projected_in_runs():
    model = random_model(200, seed=3)
    cameras = orbit_cameras(3, WIDTH, HEIGHT)[:2] + orbit_cameras(3, 30, 20)[2:]
    ours, theirs = project(model, cameras, backend=STAND_INS), project(model, cameras)
    assert ours.camera_offsets == theirs.camera_offsets
    assert torch.equal(ours.camera_ids, theirs.camera_ids)
    assert torch.equal(ours.gaussian_ids, theirs.gaussian_ids)


@pytest.mark.parametrize("rows", [(0, HEIGHT), (9, 30)])
@pytest.mark.parametrize("camera_model, antialiased", KINDS)
def test_cuda_render_equals_the_cpu_render_with_gradients(rows, camera_model, antialiased):
    model = random_model(150, seed=6)
    model.sh_degree, model.antialiased = 2, antialiased
    camera = orbit_cameras(3, WIDTH, HEIGHT)[1]
    camera = as_fisheye(camera) if camera_model == "fisheye" else camera
    background = torch.tensor([0.2, 0.3, 0.4], dtype=torch.float64)

    def loss_of(backend):
        def loss(leaves):
            out = render(leaves, camera, rows, background, backend=backend, depth=True)
            return weighted_sum([out.rgb, out.alpha, out.depth])
        return loss
    with torch.no_grad():
        ours = render(model, camera, rows, background, backend=STAND_INS, depth=True)
        theirs = render(model, camera, rows, background, depth=True)
    for name in ("rgb", "alpha", "depth"):
        torch.testing.assert_close(getattr(ours, name), getattr(theirs, name), rtol=1e-9,
                                   atol=1e-11, msg=name)
    ours_grad, theirs_grad = (model_gradients(model, loss_of(b)) for b in (STAND_INS, CPU))
    for name in model.PARAMETERS:
        assert_gradient_close(ours_grad[name], theirs_grad[name], camera_model, 1e-10, name)


@pytest.mark.parametrize("offload, antialiased", [(False, False), (True, False),
                                                  (False, True)])
def test_engines_train_through_the_cuda_backend_as_through_the_cpu_one(offload, antialiased):
    """Twelve steps with clones, splits, pruning and an opacity reset: the engines'
    code with the cuda backend (the stand-ins on the CPU) trains as the cpu backend."""
    views, start = densifying_scene()
    start.antialiased = antialiased
    rows = OffloadOptions() if offload else None
    runs = [make_engine(start.detach(), 2, torch.zeros(3, dtype=torch.float64), offload=rows,
                        backend=backend) for backend in (STAND_INS, CPU)]
    losses = [densifying_run(run, views) for run in runs]
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-9, atol=0)
    ours, theirs = (state_by_key(run.state_dict()) for run in runs)
    assert torch.equal(ours["keys"], theirs["keys"]) and len(ours["keys"]) != len(start)
    for name in theirs:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-7, atol=1e-10, msg=name)


def on_gpu(camera):
    return type(camera)(camera.viewmat.cuda(), camera.K.cuda(), camera.width, camera.height,
                        camera.name, camera.model)


def assert_gradients_close(ours, theirs, name):
    """gsplat's kernels against the numba ones in float32: close in norm, and
    elementwise to 5e-3 of the largest gradient (gsplat's tests hold its CUDA
    gradients to its torch reference at 5e-3 or looser)."""
    ours = ours.cpu()
    scale = float(theirs.abs().max())
    assert float((ours - theirs).norm()) <= 1e-3 * float(theirs.norm()) + 1e-12, name
    torch.testing.assert_close(ours, theirs, rtol=5e-3, atol=5e-3 * scale, msg=name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("scene, rows, camera_model, antialiased", [
    *((scene, rows, "pinhole", False) for scene in ("garden", "random")
      for rows in (None, (40, 200))),
    # Anti-aliased splats and fisheye cameras: the small scene (gpu_check's time).
    *(("random", rows, *kind) for rows in (None, (40, 200)) for kind in KINDS[1:])])
def test_gsplat_kernels_on_the_gpu_equal_the_cpu_backend(garden, scene, rows, camera_model,
                                                         antialiased):
    if scene == "garden":
        model, cameras = garden
        model, camera = model.to(torch.float32).detach(), cameras[0]
        model.sh_degree = 3
    else:
        model, camera = random_model(2000, seed=7, dtype=torch.float32), orbit_cameras(
            1, 320, 240, dtype=torch.float32)[0]
    model.antialiased = antialiased
    camera = Camera(camera.viewmat.float(), camera.K.float(), camera.width, camera.height,
                    model=camera_model)
    background = torch.tensor([0.1, 0.2, 0.3])

    def loss_and_output(leaves, view):
        out = render(leaves, view, rows, background.to(leaves.means.device))
        return weighted_sum([out.rgb.cpu(), out.alpha.cpu()]), out
    cpu_leaves = model.detach().requires_grad_(True)
    gpu_leaves = model.detach().to(device="cuda").requires_grad_(True)
    cpu_loss, cpu_out = loss_and_output(cpu_leaves, camera)
    gpu_loss, gpu_out = loss_and_output(gpu_leaves, on_gpu(camera))
    torch.testing.assert_close(gpu_out.rgb.cpu(), cpu_out.rgb, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(gpu_out.alpha.cpu(), cpu_out.alpha, rtol=1e-4, atol=1e-4)
    cpu_loss.backward()
    gpu_loss.backward()
    for name in model.PARAMETERS:
        theirs = getattr(cpu_leaves, name).grad
        if theirs is not None:
            assert_gradients_close(getattr(gpu_leaves, name).grad, theirs, name)
    if rows is not None:  # a band is those rows of a full render
        with torch.no_grad():
            full = render(gpu_leaves, on_gpu(camera), None, background.cuda())
        torch.testing.assert_close(gpu_out.rgb, full.rgb[rows[0]:rows[1]], rtol=1e-5,
                                   atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_training_600_images_on_cuda_reaches_the_cpu_psnr(tmp_path):
    """The same run (seed, schedule, snowmiku) on the GPU and on the CPU: test PSNR
    within 0.2 dB."""
    psnr = {}
    for device in ("cpu", "cuda"):
        out = tmp_path / device
        result = subprocess.run(
            [sys.executable, "-m", "splatscale", "train", str(data_path("snowmiku")), "-o",
             str(out), "--iterations", "600", "--eval", "--quiet", "--device", device],
            capture_output=True, text=True, timeout=HANG_GUARD)
        assert result.returncode == 0, result.stderr
        psnr[device] = json.loads((out / "report.json").read_text())["test"]["psnr"]
    assert abs(psnr["cuda"] - psnr["cpu"]) <= 0.2, psnr

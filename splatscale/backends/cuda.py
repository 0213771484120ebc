"""The cuda backend: the renderer through gsplat 1.5.3's kernels, the rest in torch.

Stage 1 of the renderer is gsplat's fused projection, packed, with the
opacity-aware box, and its spherical harmonics; stage 2 its tile intersections
and compositing. A fisheye camera is projected with gsplat's
``camera_model="fisheye"``; an anti-aliased model (``GaussianModel.antialiased``)
with ``calc_compensations=True``, each splat's opacity then multiplied by its
compensation (gsplat's ``rasterize_mode="antialiased"``: its kernel's cull and
box already take the opacity times the compensation). The results are the
``Splats`` and ``RenderOutput`` the cpu backend returns, with gsplat's
conventions, which the cpu backend follows (``render/conventions.py``). The
loss, SSIM, Adam's step and the pixels' floats are torch operations; the
device's memory, streams and events are CUDA's.

A band of rows ``[y0, y1)`` is rendered by moving the splats up by ``y0`` and
rendering an image ``y1 - y0`` rows high: a pixel's value depends only on the
splats whose boxes cover it, taken nearest first, not on where the tile grid
falls, so the band equals those rows of a full render. Equal depths (a clone
has its parent's) are ordered by key: the splats go in sorted by key, and the
kernels' sort by depth is stable.

``absgrad`` (``Splats.absgrad``) is gsplat's: its compositing kernel, asked for
it, sets the sum of the absolute per-pixel gradients on the ``means2d`` tensor
it was given, as that tensor's ``.absgrad``, in its backward pass;
``_WithAbsgrad`` hands it back as the gradient of the splats' ``absgrad``.

The kernels are reached through a ``Kernels`` object: gsplat's CUDA
functions, or in the tests pure-torch stand-ins (gsplat's own references
where they run on a CPU) given to ``backend``, which is how this module's own
code (packing, SH, bands, ordering, the depth channel, absgrad, autograd) is
tested without a GPU.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import Tensor

from splatscale.backends import Backend, Streams
from splatscale.data.cameras import Camera
from splatscale.errors import SplatscaleError
from splatscale.messages import notice
from splatscale.model.gaussians import GaussianModel
from splatscale.render.conventions import EPS2D, FAR_PLANE, NEAR_PLANE, TILE_SIZE
from splatscale.render.drift import candidates_torch
from splatscale.render.projection import Visibility, visibility_torch
from splatscale.render.splats import Splats, camera_centres, camera_offsets, camera_tensors
from splatscale.step.loss import abs_difference_sum_torch, squared_error_sum_torch
from splatscale.step.ssim import ssim_torch
from splatscale.step.view_norms import add_view_norms_torch


@dataclass(frozen=True)
class Kernels:
    """gsplat's functions: the packed projection and SH of a batch of cameras, and
    the compositing of one camera's splats, unpacked ([1, M, ...])."""

    fully_fused_projection: Callable
    spherical_harmonics: Callable
    isect_tiles: Callable
    isect_offset_encode: Callable
    rasterize_to_pixels: Callable


@functools.lru_cache(maxsize=1)
def cuda_kernels() -> Kernels:
    """gsplat's CUDA kernels (compiled by gsplat on first use, then cached by it)."""
    try:
        from gsplat.cuda import _wrapper
    except ImportError as missing:
        raise SplatscaleError(
            "the cuda backend needs gsplat 1.5.3: pip install 'splatscale[cuda]'") from missing
    return Kernels(_wrapper.fully_fused_projection, _wrapper.spherical_harmonics,
                   _wrapper.isect_tiles, _wrapper.isect_offset_encode,
                   _wrapper.rasterize_to_pixels)


def load_kernels() -> Kernels:
    """gsplat's CUDA kernels, compiled now if they are not yet (saying so first); a
    ``SplatscaleError`` that says what to install when they cannot be."""
    kernels = cuda_kernels()
    notice("loading gsplat's CUDA kernels (compiled with nvcc on first use, which takes "
           "minutes, then cached)")
    try:
        from gsplat.cuda._backend import _C
    except (ImportError, OSError, RuntimeError) as failure:
        raise SplatscaleError(f"gsplat could not build its CUDA kernels ({failure}): they "
                              f"need CUDA's compiler nvcc (the CUDA {torch.version.cuda} "
                              "toolkit) on PATH or in CUDA_HOME") from failure
    if _C is None:
        raise SplatscaleError("gsplat found no CUDA toolkit to build its kernels: install "
                              f"the CUDA {torch.version.cuda} toolkit (nvcc) or set CUDA_HOME")
    return kernels


def _runs_of_one_kind(cameras: Sequence[Camera]) -> list[tuple[int, int]]:
    """[start, end) runs of consecutive cameras with one image size and one projection
    (gsplat projects a batch of cameras into one width, height and camera model)."""
    def kind(camera: Camera) -> tuple[int, int, str]:
        return camera.width, camera.height, camera.model
    runs, start = [], 0
    for i in range(1, len(cameras) + 1):
        if i == len(cameras) or kind(cameras[i]) != kind(cameras[start]):
            runs.append((start, i))
            start = i
    return runs


def project(model: GaussianModel, cameras: Sequence[Camera], kernels: Kernels) -> Splats:
    """``render.project`` by gsplat's packed projection: it decides visibility itself
    (the rule ``projection.visibility`` follows), so no precomputed test is taken.
    An anti-aliased model's splats have their opacities times their compensations."""
    viewmats, Ks, _ = camera_tensors(cameras, model.means)
    scales, opacities = model.scales, model.opacities
    parts, compensations = [], []
    for start, end in _runs_of_one_kind(cameras):
        _, camera_ids, gaussian_ids, radii, means2d, depths, conics, compensation = (
            kernels.fully_fused_projection(
                model.means, None, model.quats, scales, viewmats[start:end], Ks[start:end],
                cameras[start].width, cameras[start].height, eps2d=EPS2D,
                near_plane=NEAR_PLANE, far_plane=FAR_PLANE, packed=True,
                calc_compensations=model.antialiased, camera_model=cameras[start].model,
                opacities=opacities.detach()))
        parts.append((camera_ids.long() + start, gaussian_ids.long(), radii, means2d, depths,
                      conics))
        compensations.append(compensation)
    camera_ids, gaussian_ids, radii, means2d, depths, conics = (
        torch.cat(column) for column in zip(*parts))
    splat_opacities = opacities.index_select(0, gaussian_ids)
    if model.antialiased:
        splat_opacities = splat_opacities * torch.cat(compensations)
    offsets = camera_offsets(camera_ids, len(cameras)).tolist()
    return Splats(camera_ids, gaussian_ids, means2d, conics, depths, radii,
                  _colors(model, viewmats, camera_ids, gaussian_ids, kernels),
                  splat_opacities, model.keys[gaussian_ids], offsets, list(cameras))


def _colors(model: GaussianModel, viewmats: Tensor, camera_ids: Tensor, gaussian_ids: Tensor,
            kernels: Kernels) -> Tensor:
    """SH seen from each camera's centre, + 0.5 and clamped at 0 (3DGS's colour)."""
    coeffs = model.sh.index_select(0, gaussian_ids)
    centres = camera_centres(viewmats)
    dirs = model.means.index_select(0, gaussian_ids) - centres.index_select(0, camera_ids)
    raw = kernels.spherical_harmonics(model.sh_degree, dirs, coeffs)
    return torch.clamp_min(raw + 0.5, 0.0)


def composite(means2d: Tensor, conics: Tensor, colors: Tensor, depths: Tensor,
              opacities: Tensor, radii: Tensor, keys: Tensor, background: Tensor, width: int,
              rows: tuple[int, int], kernels: Kernels, absgrad: Tensor | None = None,
              depth: bool = False) -> tuple[Tensor, Tensor | None, Tensor]:
    """rgb [h, W, 3] over ``background``, the alpha-weighted depth sum [h, W] (None
    without ``depth``) and alpha [h, W] of rows ``[y0, y1)``, as
    ``rasterize.composite`` returns them, and ``absgrad``'s gradient as it gives it."""
    y0, y1 = rows
    order = torch.argsort(keys)
    shift = torch.tensor([0.0, float(y0)], dtype=means2d.dtype, device=means2d.device)
    tiles_x, tiles_y = -(-width // TILE_SIZE), -(-(y1 - y0) // TILE_SIZE)
    means2d = (means2d[order] - shift)[None]
    radii, depths = radii[order][None], depths[order]
    _, isect_ids, flatten_ids = kernels.isect_tiles(means2d, radii, depths[None], TILE_SIZE,
                                                    tiles_x, tiles_y)
    offsets = kernels.isect_offset_encode(isect_ids, 1, tiles_x, tiles_y)
    features, backgrounds = colors[order], background
    if depth:
        features = torch.cat([features, depths[:, None]], dim=1)
        backgrounds = torch.cat([backgrounds, backgrounds.new_zeros(1)])
    features, backgrounds = features[None], backgrounds[None]
    rasterize = functools.partial(_rasterize, kernels, width, y1 - y0, offsets, flatten_ids)
    inputs = (means2d, conics[order][None], features, opacities[order][None], backgrounds)
    if absgrad is None:
        out, alpha = rasterize(*inputs)
    else:  # in key order, as the kernel gets the splats: autograd takes it back
        out, alpha = _WithAbsgrad.apply(rasterize, absgrad[order], *inputs)
    return out[0, ..., :3], out[0, ..., 3] if depth else None, alpha[0, ..., 0]


def _rasterize(kernels: Kernels, width: int, height: int, offsets: Tensor, flatten_ids: Tensor,
               means2d: Tensor, conics: Tensor, features: Tensor, opacities: Tensor,
               backgrounds: Tensor, absgrad: bool = False) -> tuple[Tensor, Tensor]:
    return kernels.rasterize_to_pixels(means2d, conics, features, opacities, width, height,
                                       TILE_SIZE, offsets, flatten_ids, backgrounds=backgrounds,
                                       absgrad=absgrad)


class _WithAbsgrad(torch.autograd.Function):
    """``rasterize(means2d, conics, features, opacities, backgrounds, absgrad=True)`` on
    leaves of its own; the gradient of ``absgrad`` is the ``.absgrad`` that the kernel's
    backward sets on the ``means2d`` leaf it was given.

    The kernel tags the very tensor object it saved, which its node frees once its
    backward has run: holding the leaves here keeps that object for this backward,
    with no reference from the leaves back to this node (no cycle to collect).
    """

    @staticmethod
    def forward(ctx, rasterize, absgrad, *inputs):
        # means2d's leaf always takes a gradient: the kernel's backward must run.
        needs = (True, *ctx.needs_input_grad[3:])
        with torch.enable_grad():
            ctx.leaves = [t.detach().contiguous().requires_grad_(need)
                          for t, need in zip(inputs, needs)]
            ctx.outputs = rasterize(*ctx.leaves, absgrad=True)
        return tuple(output.detach() for output in ctx.outputs)

    @staticmethod
    def backward(ctx, *v_outputs):
        taking = [leaf for leaf in ctx.leaves if leaf.requires_grad]
        grads = iter(torch.autograd.grad(ctx.outputs, taking, v_outputs, allow_unused=True))
        v_inputs = [next(grads) if leaf.requires_grad else None for leaf in ctx.leaves]
        v_absgrad = ctx.leaves[0].absgrad[0]
        ctx.leaves = ctx.outputs = None  # the inner graph is spent
        if not ctx.needs_input_grad[2]:
            v_inputs[0] = None
        return (None, v_absgrad, *v_inputs)


def adam_step(param: Tensor, m: Tensor, v: Tensor, grad: Tensor, scale: float,
              root_bias2: float, beta1: float, beta2: float, eps: float) -> None:
    """``adam_kernels``' step in torch's in-place operations (``lerp_`` is
    m + (1 - beta1) (g - m), the kernels' form)."""
    m.lerp_(grad, 1 - beta1)
    v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    param.addcdiv_(m, v.sqrt().div_(root_bias2).add_(eps), value=scale)


def pixels_as_float(pixels: Tensor, dtype: torch.dtype) -> Tensor:
    """Looked up in a table the host divided: CUDA's division by a number multiplies
    by its reciprocal, a bit off the host's quotient for half the values."""
    return _levels(dtype, pixels.device)[pixels.long()]


@functools.cache
def _levels(dtype: torch.dtype, device: torch.device) -> Tensor:
    """k / 255 for k = 0..255, divided on the host."""
    return (torch.arange(256, dtype=dtype) / 255.0).to(device)


def free_memory(device: torch.device) -> int:
    free, _ = torch.cuda.mem_get_info(device)
    return free


STREAMS = Streams(new=torch.cuda.Stream, current=torch.cuda.current_stream,
                  using=torch.cuda.stream,
                  event=lambda timing: torch.cuda.Event(enable_timing=timing))


def backend(kernels: Callable[[], Kernels] = cuda_kernels) -> Backend:
    """The cuda backend, its renderer's kernels ``kernels()`` (asked for at each use,
    so that gsplat loads when the first view is rendered)."""

    def project_(model: GaussianModel, cameras: list[Camera],
                 seen: Visibility | None) -> Splats:
        return project(model, cameras, kernels())

    def composite_(splats: Splats, background: Tensor, width: int, rows: tuple[int, int],
                   depth: bool) -> tuple[Tensor, Tensor | None, Tensor]:
        return composite(splats.means2d, splats.conics, splats.colors, splats.depths,
                         splats.opacities, splats.radii, splats.keys, background, width, rows,
                         kernels(), splats.absgrad, depth)

    return Backend(
        name="cuda", project=project_, visibility=visibility_torch, candidates=candidates_torch,
        composite=composite_,
        abs_difference_sum=abs_difference_sum_torch, squared_error_sum=squared_error_sum_torch,
        ssim=ssim_torch, add_view_norms=add_view_norms_torch, adam_step=adam_step,
        pixels_as_float=pixels_as_float,
        shares_host_memory=False, gathers_seen_rows=False, free_memory=free_memory,
        synchronize=torch.cuda.synchronize,
        streams=STREAMS)


BACKEND = backend()

"""Stage 2 of the renderer: composite one camera's splats into a band of pixel rows.

``rasterize`` runs the backend of the splats' device (``splatscale.backends``); the
cpu backend's compositing is here: tile binning, then numba kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import torch
from torch import Tensor

from splatscale.backends import Backend, backend_for
from splatscale.render import compositing_kernels
from splatscale.render.binning import TileBins, bin_tiles
from splatscale.render.buffer_pool import INTERSECTION_ROWS
from splatscale.render.splats import Splats

DEPTH_EPS = 1e-10


@dataclass
class RenderOutput:
    """A rendered band: rows ``[rows[0], rows[1])`` of the image."""

    rgb: Tensor     # [h, W, 3]
    alpha: Tensor   # [h, W]
    # [h, W] expected depth of the visible surface, 0 where empty; None unless asked for
    depth: Tensor | None
    rows: tuple[int, int]


def _numpy(t: Tensor) -> np.ndarray:
    return t.detach().contiguous().numpy()


def balanced_tile_order(work: np.ndarray, n_threads: int) -> np.ndarray:
    """Tiles in an order whose n_threads contiguous chunks carry equal work.

    numba's prange hands each thread one contiguous chunk, and tiles differ in
    work by orders of magnitude; dealing the tiles, heaviest first, to the
    threads in snake order balances the chunks.
    """
    order = np.argsort(-work, kind="stable")
    n_threads = max(1, min(n_threads, len(order)))
    padded = np.full(-(-len(order) // n_threads) * n_threads, -1)
    padded[: len(order)] = order
    rounds = padded.reshape(-1, n_threads)
    rounds[1::2] = rounds[1::2, ::-1]
    chunks = rounds.T.reshape(-1)
    return chunks[chunks >= 0]


def _kernel_inputs(means2d: Tensor, conics: Tensor, colors: Tensor, depths: Tensor,
                   opacities: Tensor, background: Tensor, bins: TileBins, width: int,
                   rows: tuple[int, int]) -> tuple[Tensor, list]:
    """The packed splats (``compositing_kernels.pack``, lent by ``INTERSECTION_ROWS``)
    and the arguments the forward and backward kernels share, in their order: first
    those splats."""
    splat_ids, offsets = _numpy(bins.splat_ids), _numpy(bins.offsets)
    tile_order = balanced_tile_order(np.diff(offsets), numba.get_num_threads())
    packed = _pack(_numpy(bins.blocks), splat_ids, offsets, tile_order, means2d, conics, colors,
                   depths, opacities)
    return packed, [packed.numpy(), _numpy(background), offsets, tile_order, bins.tiles_x,
                    bins.tile_row0, width, rows[0], rows[1]]


def _pack(blocks: np.ndarray, splat_ids: np.ndarray, offsets: np.ndarray,
          tile_order: np.ndarray, means2d: Tensor, conics: Tensor, colors: Tensor,
          depths: Tensor, opacities: Tensor) -> Tensor:
    """The splats packed by intersection into a buffer of ``INTERSECTION_ROWS``, with
    each intersection's block mask ``blocks``."""
    # From torch, not numpy, so that torch's profiler counts it (bench/memory.py).
    packed = INTERSECTION_ROWS.lend(len(splat_ids), compositing_kernels.PACKED_WIDTH,
                                    opacities.dtype)
    compositing_kernels.pack(splat_ids, blocks, offsets, tile_order, _numpy(means2d),
                             _numpy(conics), _numpy(opacities), _numpy(colors), _numpy(depths),
                             packed.numpy())
    return packed


class _Composite(torch.autograd.Function):
    """Front-to-back alpha compositing of depth-sorted splats (numba kernels).

    ``absgrad`` (or None) takes no part in the image: the gradient its backward
    returns is, per splat, the sum over the band's pixels of the absolute per-pixel
    gradient of ``means2d`` (x and y apart), computed only when it requires grad.
    Without ``depth`` the depth sum is None, and ``depths`` gets no gradient.
    The packed splats go back to ``INTERSECTION_ROWS`` after the forward when no
    backward will follow (``backward_follows`` False), else after the backward.
    """

    @staticmethod
    def forward(ctx, means2d: Tensor, conics: Tensor, colors: Tensor, depths: Tensor,
                opacities: Tensor, background: Tensor, absgrad: Tensor | None, bins: TileBins,
                width: int, rows: tuple[int, int], depth: bool, backward_follows: bool):
        dtype, height = means2d.dtype, rows[1] - rows[0]
        rgb = torch.empty((height, width, 3), dtype=dtype)
        depth_sum = torch.empty((height, width), dtype=dtype) if depth else None
        final_T = torch.empty((height, width), dtype=dtype)
        last = torch.empty((height, width), dtype=torch.int32)
        narrowed = np.zeros(len(bins.splat_ids), np.uint8)
        packed, inputs = _kernel_inputs(means2d, conics, colors, depths, opacities, background,
                                        bins, width, rows)
        compositing_kernels.forward(*inputs, rgb.numpy(),
                                    None if depth_sum is None else depth_sum.numpy(),
                                    final_T.numpy(), last.numpy(), narrowed)
        if not backward_follows:
            INTERSECTION_ROWS.give_back(packed)
            return rgb, depth_sum, 1.0 - final_T
        # The backward kernel takes the same inputs: the packed splats, whose block masks
        # the forward narrowed to the blocks each splat changed (``narrowed`` keeps them
        # for a second backward through a graph kept for it).
        ctx.save_for_backward(means2d, conics, colors, depths, opacities, background, final_T,
                              last)
        ctx.packed, ctx.inputs, ctx.narrowed = packed, inputs, narrowed
        ctx.splat_ids = bins.splat_ids
        return rgb, depth_sum, 1.0 - final_T

    @staticmethod
    def backward(ctx, v_rgb: Tensor, v_depth_sum: Tensor | None, v_alpha: Tensor):
        means2d, conics, colors, depths, opacities, background, final_T, last = (
            ctx.saved_tensors)
        k = compositing_kernels
        absgrad = ctx.needs_input_grad[6]
        splat_ids = _numpy(ctx.splat_ids)
        if ctx.packed is None:  # a second backward: the splats packed again
            offsets, tile_order = ctx.inputs[2], ctx.inputs[3]
            ctx.packed = _pack(ctx.narrowed, splat_ids, offsets, tile_order, means2d, conics,
                               colors, depths, opacities)
            ctx.inputs[0] = ctx.packed.numpy()
        kernel = k.backward_with_absgrad if absgrad else k.backward
        # Each intersection's gradient row is written over its packed splat: no buffer of
        # every intersection is mapped, faulted in and freed again.
        rows = ctx.inputs[0]
        kernel(*ctx.inputs, _numpy(final_T), _numpy(last), _numpy(v_rgb),
               None if v_depth_sum is None else _numpy(v_depth_sum), _numpy(v_alpha), rows)
        # The rows hold gradients now: a backward after this one (kept graph, or this one
        # raising below) packs the splats again.
        packed, ctx.packed, ctx.inputs[0] = ctx.packed, None, None
        # Each gradient its own contiguous tensor, as the projection's kernels read them
        # (views of one [M, 10] array were copied there); from torch, not numpy, so that
        # torch's profiler counts them (bench/memory.py). The kernel writes every row.
        def gradient(*shape: int) -> Tensor:
            return torch.empty(shape, dtype=means2d.dtype)

        count = means2d.shape[0]
        v_means2d, v_conics, v_colors = gradient(count, 2), gradient(count, 3), gradient(count, 3)
        v_opacities, v_depths = gradient(count), gradient(count)
        v_absgrad = gradient(count if absgrad else 0, 2)
        k.sum_per_splat(splat_ids, rows, v_means2d.numpy(), v_conics.numpy(),
                        v_opacities.numpy(), v_colors.numpy(), v_depths.numpy(),
                        v_absgrad.numpy(), numba.get_num_threads())
        del rows
        INTERSECTION_ROWS.give_back(packed)
        # The background is rarely a parameter: its gradient, a pass over the image, only
        # when asked for.
        v_background = ((v_rgb * final_T[..., None]).sum(dim=(0, 1))
                        if ctx.needs_input_grad[5] else None)
        return (v_means2d, v_conics, v_colors, v_depths if v_depth_sum is not None else None,
                v_opacities, v_background, v_absgrad if absgrad else None, None, None, None,
                None, None)


def composite(means2d: Tensor, conics: Tensor, colors: Tensor, depths: Tensor,
              opacities: Tensor, background: Tensor, bins: TileBins, width: int,
              rows: tuple[int, int], absgrad: Tensor | None = None, depth: bool = False
              ) -> tuple[Tensor, Tensor | None, Tensor]:
    """Composite binned splats into rows ``rows`` of the image.

    Returns rgb [h, W, 3] over ``background``, the alpha-weighted depth sum
    [h, W] (None without ``depth``: not composited) and alpha [h, W]. ``absgrad``
    [M, 2], when given, gets as its gradient each splat's absolute per-pixel
    ``means2d`` gradients summed over the band.
    """
    inputs = (means2d, conics, colors, depths, opacities, background, absgrad)
    backward_follows = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in inputs)
    return _Composite.apply(*inputs, bins, width, rows, depth, backward_follows)


def composite_cpu(splats: Splats, background: Tensor, width: int, rows: tuple[int, int],
                  depth: bool) -> tuple[Tensor, Tensor | None, Tensor]:
    """The cpu backend's ``composite``: ``splats`` binned into tiles, then composited by
    the numba kernels."""
    bins = bin_tiles(splats.means2d, splats.radii, splats.depths, splats.keys, width, rows,
                     splats.conics, splats.opacities)
    return composite(splats.means2d, splats.conics, splats.colors, splats.depths,
                     splats.opacities, background, bins, width, rows, splats.absgrad, depth)


def rasterize(splats: Splats, width: int, height: int, rows: tuple[int, int] | None = None,
              background: Tensor | None = None, backend: Backend | None = None,
              depth: bool = False) -> RenderOutput:
    """Render pixel rows ``[y0, y1)`` (default: all) of one camera's splats.

    The band's pixels and gradients equal those rows of a full render: tiles
    stay on the image's 16x16 grid whatever the band. ``backend`` None: the backend
    of the splats' device. Where ``splats.absgrad`` is not None, after the backward
    pass its gradient holds each splat's absolute per-pixel ``means2d`` gradients,
    summed over the band's pixels. The depth is rendered only with ``depth`` (else
    None): training and viewing read none, and the CPU's kernels run faster without.
    """
    y0, y1 = rows if rows is not None else (0, height)
    if not 0 <= y0 < y1 <= height:
        raise ValueError(f"rows {rows} are not a band of an image {height} pixels high")
    if len(splats.camera_offsets) != 2:
        raise ValueError("rasterize takes the splats of one camera: use Splats.of_camera(i)")
    dtype, device = splats.means2d.dtype, splats.means2d.device
    background = (torch.zeros(3, dtype=dtype, device=device) if background is None
                  else background.to(dtype=dtype, device=device))
    backend = backend or backend_for(device)
    rgb, depth_sum, alpha = backend.composite(splats, background, width, (y0, y1), depth)
    expected_depth = (None if depth_sum is None
                      else depth_sum / torch.clamp_min(alpha, DEPTH_EPS))
    return RenderOutput(rgb, alpha, expected_depth, (y0, y1))

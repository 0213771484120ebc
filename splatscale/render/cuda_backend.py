"""Stage 2 on CUDA: gsplat 1.5.3's tile intersection and compositing kernels.

``rasterize`` (``render/rasterize.py``) sends CUDA tensors here; the result
is the same ``RenderOutput`` the cpu backend returns, with gsplat's
conventions, which the cpu backend follows (``render/conventions.py``).

A band of rows ``[y0, y1)`` is rendered by moving the splats up by ``y0`` and
rendering an image ``y1 - y0`` rows high: a pixel's value depends only on the
splats whose boxes cover it, taken nearest first, not on where the tile grid
falls, so the band equals those rows of a full render. Equal depths (a clone
has its parent's) are ordered by key: the splats go in sorted by key, and the
kernels' sort by depth is stable.

The kernels are reached through a ``Kernels`` object: gsplat's CUDA
functions, or in the tests pure-torch stand-ins (gsplat's own for the tile
intersections; its torch compositing needs CUDA too), which is how this
module's own code (bands, ordering, the depth channel, autograd) is tested
without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from splatscale.errors import SplatscaleError
from splatscale.render.conventions import TILE_SIZE

@dataclass(frozen=True)
class Kernels:
    """gsplat's functions for one camera's splats, unpacked ([1, M, ...])."""

    isect_tiles: Callable
    isect_offset_encode: Callable
    rasterize_to_pixels: Callable


def cuda_kernels() -> Kernels:
    try:
        from gsplat.cuda import _wrapper
    except ImportError as missing:
        raise SplatscaleError(
            "the cuda backend needs gsplat 1.5.3: pip install 'splatscale[cuda]'") from missing
    return Kernels(_wrapper.isect_tiles, _wrapper.isect_offset_encode,
                   _wrapper.rasterize_to_pixels)


def composite(means2d: Tensor, conics: Tensor, colors: Tensor, depths: Tensor,
              opacities: Tensor, radii: Tensor, keys: Tensor, background: Tensor, width: int,
              rows: tuple[int, int], kernels: Kernels) -> tuple[Tensor, Tensor, Tensor]:
    """rgb [h, W, 3] over ``background``, the alpha-weighted depth sum [h, W] and
    alpha [h, W] of rows ``[y0, y1)``, as ``rasterize.composite`` returns them."""
    y0, y1 = rows
    order = torch.argsort(keys)
    shift = torch.tensor([0.0, float(y0)], dtype=means2d.dtype, device=means2d.device)
    tiles_x, tiles_y = -(-width // TILE_SIZE), -(-(y1 - y0) // TILE_SIZE)
    means2d = (means2d[order] - shift)[None]
    radii, depths = radii[order][None], depths[order]
    _, isect_ids, flatten_ids = kernels.isect_tiles(means2d, radii, depths[None], TILE_SIZE,
                                                    tiles_x, tiles_y)
    offsets = kernels.isect_offset_encode(isect_ids, 1, tiles_x, tiles_y)
    features = torch.cat([colors[order], depths[:, None]], dim=1)[None]
    backgrounds = torch.cat([background, background.new_zeros(1)])[None]
    out, alpha = kernels.rasterize_to_pixels(
        means2d, conics[order][None], features, opacities[order][None], width, y1 - y0,
        TILE_SIZE, offsets, flatten_ids, backgrounds=backgrounds)
    return out[0, ..., :3], out[0, ..., 3], alpha[0, ..., 0]

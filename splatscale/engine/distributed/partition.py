"""Cutting a batch's pixel rows into one contiguous range per rank, of equal cost.

The rows of the batch's images, concatenated in batch order, are cut into W
ranges. A row's cost comes from this step's workload: ``a`` per pixel plus
``b`` per tile intersection (``cost_model``), the intersections of a tile row
shared evenly by its pixel rows. Cuts fall on pixel rows, so a band may split a
tile row. Every rank computes the same cut from the same all-reduced workload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from splatscale.data.cameras import Camera
from splatscale.engine.distributed.cost_model import RowCost
from splatscale.render import Splats
from splatscale.render.binning import tile_boxes
from splatscale.render.conventions import TILE_SIZE


@dataclass(frozen=True)
class Band:
    """Rows ``[rows[0], rows[1])`` of the batch's image ``camera``."""

    camera: int
    rows: tuple[int, int]


def tile_rows(camera: Camera) -> int:
    return -(-camera.height // TILE_SIZE)


def tile_row_work(splats: Splats, cameras: Sequence[Camera]) -> Tensor:
    """Tile intersections per (camera, tile row) of these splats, float64 [B, R_max]
    on the splats' device."""
    most = max(tile_rows(c) for c in cameras)
    lo, hi = tile_boxes(splats.means2d, splats.radii)
    device = lo.device
    widths = torch.tensor([-(-c.width // TILE_SIZE) for c in cameras],
                          device=device)[splats.camera_ids]
    heights = torch.tensor([tile_rows(c) for c in cameras], device=device)[splats.camera_ids]
    span_x = (torch.minimum(hi[:, 0], widths) - lo[:, 0].clamp_min(0)).clamp_min(0)
    y_lo = torch.minimum(lo[:, 1].clamp_min(0), heights)
    y_hi = torch.minimum(hi[:, 1].clamp_min(0), heights)
    # A difference array per camera: +span at the first row, -span after the last.
    base = splats.camera_ids * (most + 1)
    steps = torch.zeros(len(cameras) * (most + 1), dtype=torch.float64, device=device)
    steps.index_add_(0, base + y_lo, span_x.to(torch.float64))
    steps.index_add_(0, base + y_hi, -span_x.to(torch.float64))
    return steps.view(len(cameras), most + 1).cumsum(dim=1)[:, :most].contiguous()


def row_workload(work: Tensor, cameras: Sequence[Camera]) -> tuple[Tensor, Tensor]:
    """Pixels and tile intersections of every pixel row of the batch, concatenated in
    batch order (float64 [N] each)."""
    pixels, intersections = [], []
    for c, camera in enumerate(cameras):
        tile = torch.arange(camera.height) // TILE_SIZE
        rows_in_tile = torch.clamp_max(camera.height - tile * TILE_SIZE, TILE_SIZE)
        intersections.append(work[c, tile] / rows_in_tile)
        pixels.append(torch.full((camera.height,), float(camera.width), dtype=torch.float64))
    return torch.cat(pixels), torch.cat(intersections)


def row_costs(work: Tensor, cameras: Sequence[Camera], cost: RowCost = RowCost()) -> Tensor:
    """Cost of every pixel row of the batch, concatenated in batch order."""
    pixels, intersections = row_workload(work, cameras)
    return cost.pixel * pixels + cost.intersection * intersections


def row_offsets(cameras: Sequence[Camera]) -> list[int]:
    """Where each image's rows start in the concatenated rows, and where they end."""
    starts = [0]
    for camera in cameras:
        starts.append(starts[-1] + camera.height)
    return starts


def cut(costs: Tensor, world: int) -> list[int]:
    """W + 1 boundaries in the concatenated rows: range k is [b[k], b[k + 1])."""
    cumulative = torch.cumsum(costs.to(torch.float64), 0)
    targets = cumulative[-1] * torch.arange(1, world, dtype=torch.float64) / world
    inner = torch.searchsorted(cumulative, targets, right=True).tolist()
    return [0, *inner, len(costs)]


def bands_per_rank(boundaries: list[int], cameras: Sequence[Camera]) -> list[list[Band]]:
    """The cut's ranges as bands of images: at most one band per image per rank."""
    starts = row_offsets(cameras)
    bands = []
    for lo, hi in zip(boundaries[:-1], boundaries[1:]):
        bands.append([Band(c, (max(lo, start) - start, min(hi, end) - start))
                      for c, (start, end) in enumerate(zip(starts[:-1], starts[1:]))
                      if max(lo, start) < min(hi, end)])
    return bands


def partition(work: Tensor, cameras: Sequence[Camera], world: int,
              cost: RowCost | None = RowCost()) -> list[list[Band]]:
    """Bands of every rank: rows of equal ``cost``, or of equal count when it is None."""
    if cost is None:
        costs = torch.ones(sum(c.height for c in cameras), dtype=torch.float64)
    else:
        costs = row_costs(work, cameras, cost)
    return bands_per_rank(cut(costs, world), cameras)

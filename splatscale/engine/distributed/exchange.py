"""The sparse exchange: each projected splat goes only to the ranks that render it.

A rank renders its bands widened by ``HALO`` rows (SSIM's window reads them);
a splat is needed there when its box meets those rows: outside its box a
splat's alpha is below 1/255, which compositing skips, so leaving it out of
a band it does not reach changes no pixel and no gradient. Payloads move with
``all_to_all_single`` and split sizes (the one collective that takes unequal
sizes on both gloo and NCCL); the float payload's backward sends the gradients
back to the ranks that own the Gaussians.
"""

from __future__ import annotations

import torch
from torch import Tensor

from splatscale.data.cameras import Camera
from splatscale.engine.distributed import collectives
from splatscale.engine.distributed.partition import Band, row_offsets, row_workload
from splatscale.render import Splats
from splatscale.step.view_loss import HALO

# What travels per splat: these float columns (with gradient; ``absgrad`` where the
# splats carry it), then radii, key, camera.
FLOAT_COLUMNS = {"means2d": 2, "conics": 3, "colors": 3, "depths": 1, "opacities": 1}
ABSGRAD_COLUMNS = {"absgrad": 2}


def pack(splats: Splats) -> tuple[Tensor, Tensor]:
    """The splats as rows: floats [M, 10] or [M, 12] (differentiable) and ints [M, 4]."""
    floats = torch.cat([getattr(splats, name).reshape(len(splats), -1)
                        for name in _float_columns(splats.absgrad is not None)], dim=1)
    ints = torch.cat([splats.radii.to(torch.int64), splats.keys[:, None],
                      splats.camera_ids[:, None]], dim=1)
    return floats, ints


def unpack(floats: Tensor, ints: Tensor, camera_index: int, camera: Camera) -> Splats:
    """The received rows of one camera of the batch, as one camera's Splats."""
    mine = (ints[:, 3] == camera_index).nonzero()[:, 0]
    names = _float_columns(floats.shape[1] > sum(FLOAT_COLUMNS.values()))
    columns = dict(zip(names, floats.index_select(0, mine).split(list(names.values()), dim=1)))
    splats = Splats(torch.zeros(len(mine), dtype=torch.int64, device=mine.device), mine,
                    columns["means2d"], columns["conics"], columns["depths"][:, 0],
                    ints[mine, :2].to(torch.int32), columns["colors"],
                    columns["opacities"][:, 0], ints[mine, 2], [0, len(mine)], [camera])
    splats.absgrad = columns.get("absgrad")
    return splats


def _float_columns(absgrad: bool) -> dict[str, int]:
    return {**FLOAT_COLUMNS, **ABSGRAD_COLUMNS} if absgrad else FLOAT_COLUMNS


def render_rows(band: Band, camera: Camera, halos: int = 1) -> tuple[int, int]:
    """The rows a rank renders for ``band``: the band and ``halos`` halos, inside the
    image."""
    return (max(0, band.rows[0] - halos * HALO),
            min(camera.height, band.rows[1] + halos * HALO))


def rendered_workload(work: Tensor, bands: list[Band], cameras: list[Camera],
                      halos: int = 1) -> tuple[float, float]:
    """Pixels and tile intersections a rank renders for ``bands``, halos included."""
    pixels, intersections = row_workload(work, cameras)
    starts = row_offsets(cameras)
    parts = [torch.arange(*render_rows(band, cameras[band.camera], halos))
             + starts[band.camera] for band in bands]
    rows = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)
    return float(pixels[rows].sum()), float(intersections[rows].sum())


def route(splats: Splats, bands: list[list[Band]], cameras: list[Camera],
          halos: int = 1) -> tuple[Tensor, list[int]]:
    """(indices of the splats to send, grouped by destination rank; counts per rank),
    for bands rendered with ``halos`` halos."""
    centre = splats.means2d.detach()[:, 1]
    radius = splats.radii[:, 1].to(centre.dtype)
    offsets = splats.camera_offsets  # splats are camera-major: a band tests its camera's
    indices, counts = [], []
    for rank_bands in bands:
        chosen = []
        for band in rank_bands:
            y0, y1 = render_rows(band, cameras[band.camera], halos)
            lo, hi = offsets[band.camera], offsets[band.camera + 1]
            # Pixel centres y + 0.5 of rows [y0, y1) against the box [centre -+ radius].
            hit = ((centre[lo:hi] - radius[lo:hi] <= y1 - 0.5)
                   & (centre[lo:hi] + radius[lo:hi] >= y0 + 0.5))
            chosen.append(hit.nonzero()[:, 0] + lo)
        rows = (torch.cat(chosen) if chosen
                else torch.zeros(0, dtype=torch.int64, device=centre.device))
        indices.append(rows)
        counts.append(len(rows))
    return torch.cat(indices), counts


def exchange_counts(send_counts: list[int]) -> list[int]:
    received = torch.zeros(len(send_counts), dtype=torch.int64)
    collectives.all_to_all_single(received, torch.tensor(send_counts, dtype=torch.int64))
    return received.tolist()


def all_to_all(rows: Tensor, send_counts: list[int], recv_counts: list[int]) -> Tensor:
    """Rows ``[sum(send_counts), ...]`` out, ``[sum(recv_counts), ...]`` in (no gradient)."""
    received = rows.new_empty((sum(recv_counts), *rows.shape[1:]))
    collectives.all_to_all_single(received, rows.contiguous(), recv_counts, send_counts)
    return received


class _AllToAllWithGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows: Tensor, send_counts: list[int], recv_counts: list[int]) -> Tensor:
        ctx.counts = send_counts, recv_counts
        return all_to_all(rows, send_counts, recv_counts)

    @staticmethod
    def backward(ctx, grad: Tensor):
        send_counts, recv_counts = ctx.counts
        return all_to_all(grad, recv_counts, send_counts), None, None


def all_to_all_differentiable(rows: Tensor, send_counts: list[int],
                              recv_counts: list[int]) -> Tensor:
    """``all_to_all`` whose backward returns each row's gradient to its sender."""
    return _AllToAllWithGradient.apply(rows, send_counts, recv_counts)

"""How a step is computed by ranks (Grendel): each rank owns a shard of the Gaussians
(its rows part) and renders a share of every batch's pixel rows.

``ManyRanks`` is the step part of an engine whose rows are one rank's shard (with
``ResidentRows`` or ``OffloadedRows``; ``engine/factory.py``). One step, on
every rank of the process group:

1. project the rows the shard's working set gives into the batch's B cameras;
2. histogram the splats' tile intersections per (camera, tile row); one
   ``all_reduce`` gives the whole workload, and every rank cuts the batch's
   rows into the same W ranges of equal cost (``partition``), the cost per
   pixel and per intersection fitted to the ranks' measured times
   (``cost_model``) unless fixed;
3. send each splat to the ranks whose bands (plus SSIM's halo) it touches
   (``exchange``);
4. render the own bands with their halo and take the loss of the own rows
   (``step/view_loss.py``, the single process' own path), divided by the whole
   image's size: the ranks' losses add up to the single process' loss, and
   ``backward`` returns every gradient to the Gaussian's owner;
5. the strategy's statistics and edits, and Adam, act on the shard alone (the
   code of one process): keys make them independent of where a Gaussian is
   stored, so the shards together equal the single process; after an edit
   replaced rows the shards are evened out (``rebalance``).
"""

from __future__ import annotations

import math
import time
from typing import Callable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from splatscale.data.cameras import Camera
from splatscale.engine import StepResult, TrainView
from splatscale.engine.distributed import collectives
from splatscale.engine.distributed.exchange import (all_to_all, all_to_all_differentiable,
                                                    exchange_counts, pack, render_rows,
                                                    rendered_workload, route, unpack)
from splatscale.engine.distributed.cost_model import FittedRowCost, RowCost
from splatscale.engine.distributed.partition import Band, partition, tile_row_work
from splatscale.engine.device_images import DeviceImages
from splatscale.engine.rows import Rows
from splatscale.engine.seen import tell, watch
from splatscale.model.gaussians import GaussianModel
from splatscale.backends import Backend, backend_for
from splatscale.render import RenderOutput, Splats, project, rasterize
from splatscale.render.dense_gradients import reusing
from splatscale.step import appearance
from splatscale.step.loss import psnr_of
from splatscale.step.selection import Number
from splatscale.step.view_loss import band_loss, masked_in_values
from splatscale.step.observer import Observer

# Shards are rebalanced after an edit that replaced rows, when the largest exceeds the
# smallest by this.
MAX_IMBALANCE = 1.1


def stacked_gradients(transforms: list[Tensor], grads: Sequence[Tensor | None]) -> Tensor:
    """The colour transforms' gradients, [T, 3, 4] float64 on the host (zero for one
    no own pixel reached)."""
    stacked = torch.zeros(len(transforms), 3, 4, dtype=torch.float64)
    for k, grad in enumerate(grads):
        if grad is not None:
            stacked[k] = grad
    return stacked


class ManyRanks:
    """The forward pass shared by all ranks, over each rank's shard."""

    def __init__(self, background: Tensor, ssim_weight: float = 0.2, balance: str = "cost",
                 fixed_cost: RowCost | None = None,
                 max_imbalance: float = MAX_IMBALANCE, device: str = "cpu",
                 backend: Backend | None = None) -> None:
        """``balance``: ``cost`` cuts rows of equal estimated cost, with ``fixed_cost``
        or else with coefficients fitted as the run goes; ``uniform`` equal row counts.
        Shards are rebalanced when the largest exceeds the smallest by ``max_imbalance``.
        ``device`` renders (with ``backend``, None: the device's); the partition's
        bookkeeping stays on the host."""
        self.background = background.to(torch.device(device))
        self.backend = backend or backend_for(device)
        self.targets = DeviceImages(torch.device(device), backend=self.backend)
        self.ssim_weight = ssim_weight
        self.balance = balance
        self.fixed_cost = fixed_cost
        self.fitted_cost = FittedRowCost()
        self.max_imbalance = max_imbalance
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def forward_backward(self, rows: Rows, batch: list[TrainView],
                         observer: Observer | None) -> StepResult:
        cameras = [view.camera for view in batch]
        working = rows.working_set(cameras)
        splats = project(working.model, cameras, working.visibility, self.backend)
        watch(splats, observer)
        # A per-pixel statistic needs each pixel's gradient whole (``band_loss``).
        halos = 2 if observer is not None and observer.absgrad else 1
        work = tile_row_work(splats, cameras).cpu()
        collectives.all_reduce(work)
        bands = partition(work, cameras, self.world, self.row_cost())
        received, received_ints = self._exchange(splats, bands, cameras, halos)

        targets = [self.targets.rows(batch[band.camera],
                                     *render_rows(band, cameras[band.camera], halos),
                                     like=received) for band in bands[self.rank]]
        values = self._counted_values(batch, bands[self.rank], targets, halos)
        began = self._clock()
        loss, squared_errors = self._own_loss(batch, bands[self.rank], targets, values,
                                              received, received_ints, halos)
        # The own bands' backward first, timed: the rest waits for the other ranks.
        transforms = [view.appearance for view in batch if view.appearance is not None]
        received_grad, *transform_grads = torch.autograd.grad(loss, [received, *transforms],
                                                              allow_unused=True)
        seconds = self._clock() - began
        with reusing(rows.spare_gradients()):
            received.backward(received_grad)
        rows.gradients_taken(working)
        tell(observer, rows, working, splats)
        reports = torch.zeros(self.world, 3, dtype=torch.float64)
        reports[self.rank] = torch.tensor(
            [*rendered_workload(work, bands[self.rank], cameras, halos), seconds],
            dtype=torch.float64)
        # The transforms' gradients ride on the sum: every rank holds the same transforms.
        summed_transforms = stacked_gradients(transforms, transform_grads)
        totals = torch.cat([loss.detach().to("cpu", torch.float64)[None], squared_errors,
                            reports.view(-1), summed_transforms.view(-1)])
        collectives.all_reduce(totals)
        reported = 1 + len(batch) + 3 * self.world
        self.fitted_cost.add(totals[1 + len(batch):reported].view(self.world, 3))
        for transform, grad in zip(transforms, totals[reported:].view(-1, 3, 4)):
            transform.grad = grad
        psnrs = [psnr_of(float(totals[1 + c]), values[c]) for c in range(len(batch))]
        return StepResult(float(totals[0]), sum(psnrs) / len(psnrs),
                          {**working.measured, "bands": bands, "render_seconds": seconds})

    def _clock(self) -> float:
        """Seconds, once the device has done what was asked of it (a GPU runs behind
        the host)."""
        device = self.background.device
        backend_for(device).synchronize(device)  # the device's own, whatever renders
        return time.perf_counter()

    def _counted_values(self, batch: list[TrainView], bands: list[Band],
                        targets: list[Tensor], halos: int) -> list[int]:
        """The values each view's loss counts (``masked_in_values``): 3 per pixel, or
        per masked-in pixel of a view with a mask, summed over every rank's own rows
        (``targets``: this rank's bands' rendered rows), so that each rank divides its
        share by the whole image's count."""
        values = [3 * view.camera.width * view.camera.height for view in batch]
        if not any(view.masked for view in batch):
            return values
        counts = torch.zeros(len(batch), dtype=torch.int64)
        for band, target in zip(bands, targets):
            y0, _ = render_rows(band, batch[band.camera].camera, halos)
            counts[band.camera] += masked_in_values(target, (band.rows[0] - y0,
                                                             band.rows[1] - y0))
        collectives.all_reduce(counts)
        return [int(count) if view.masked else whole
                for count, view, whole in zip(counts, batch, values)]

    def _own_loss(self, batch: list[TrainView], bands: list[Band], targets: list[Tensor],
                  values: list[int], floats: Tensor, ints: Tensor,
                  halos: int) -> tuple[Tensor, Tensor]:
        """This rank's share of the batch's loss, and its squared error per image."""
        # Every rank's loss must reach the exchange, or its backward collective would hang.
        loss = 0.0 * floats.sum()
        squared_errors = torch.zeros(len(batch), dtype=torch.float64)
        for band, target in zip(bands, targets):
            share, error = self._band_loss(band, batch[band.camera], target,
                                           values[band.camera], floats, ints, halos)
            loss = loss + share
            squared_errors[band.camera] += error
        return loss / len(batch), squared_errors

    def row_cost(self) -> RowCost | None:
        """The cost the partition equalises; None for equal row counts."""
        if self.balance == "uniform":
            return None
        return self.fixed_cost or self.fitted_cost.current

    def _exchange(self, splats: Splats, bands: list[list[Band]], cameras: list[Camera],
                  halos: int = 1) -> tuple[Tensor, Tensor]:
        """The splats this rank renders: float columns (with gradient) and int columns."""
        send, send_counts = route(splats, bands, cameras, halos)
        recv_counts = exchange_counts(send_counts)
        floats, ints = pack(splats)
        return (all_to_all_differentiable(floats.index_select(0, send), send_counts,
                                          recv_counts),
                all_to_all(ints.index_select(0, send), send_counts, recv_counts))

    def _band_loss(self, band: Band, view: TrainView, target: Tensor, values: int,
                   floats: Tensor, ints: Tensor, halos: int) -> tuple[Tensor, float]:
        """The band's share of its image's loss (of ``values`` counted values), against
        ``target`` (the band's rendered rows), and its rows' summed squared error."""
        camera = view.camera
        y0, y1 = render_rows(band, camera, halos)
        out = rasterize(unpack(floats, ints, band.camera, camera), camera.width,
                        camera.height, rows=(y0, y1), background=self.background,
                        backend=self.backend)
        own = (band.rows[0] - y0, band.rows[1] - y0)
        return band_loss(appearance.apply(out.rgb, view.appearance), target, own, values,
                         self.ssim_weight, whole_pixels=halos == 2)

    def rebalance(self, rows: Rows) -> None:
        """Move rows between ranks, every per-row tensor with them, so that the shards
        are an even split of the whole, kept in rank order (when the largest exceeds
        the smallest by ``max_imbalance``)."""
        count = len(rows.row_set)
        sizes = torch.zeros(self.world, dtype=torch.int64)
        sizes[self.rank] = count
        collectives.all_reduce(sizes)
        if int(sizes.max()) <= self.max_imbalance * int(sizes.min()):
            return
        total, start = int(sizes.sum()), int(sizes[:self.rank].sum())
        bounds = torch.tensor([total * r // self.world for r in range(1, self.world)])
        owners = torch.searchsorted(bounds, torch.arange(start, start + count), right=True)
        send = torch.bincount(owners, minlength=self.world).tolist()
        recv = exchange_counts(send)
        rows.row_set.map_rows(lambda name, t: all_to_all(t, send, recv))  # in order

    def read_ahead(self, read: Callable[[], None]) -> None:
        """Nothing: each rank reads only the rows it renders, when it renders them."""

    def any_rank(self, flag: bool) -> bool:
        agreed = torch.tensor([int(flag)])
        collectives.all_reduce(agreed, collectives.MAX)
        return bool(agreed)

    def total(self, value: Number) -> Number:
        """``value`` summed over the ranks (floats in float64)."""
        summed = torch.tensor([value], dtype=torch.float64 if isinstance(value, float)
                              else torch.int64)
        collectives.all_reduce(summed)
        return type(value)(summed.item())

    def model_parts(self, shard: GaussianModel) -> Iterator[GaussianModel]:
        """Rank 0 yields the shards in rank order, each received when its turn comes."""
        if self.rank != 0:
            rows = torch.cat([t.reshape(len(shard), math.prod(t.shape[1:]))
                              for t in shard.parameters().values()], 1)
            collectives.send(torch.tensor([len(shard)]), 0)
            collectives.send(rows.contiguous(), 0)
            return
        yield shard
        widths = [math.prod(t.shape[1:]) for t in shard.parameters().values()]
        for source in range(1, self.world):
            count = torch.zeros(1, dtype=torch.int64)
            collectives.receive(count, source)
            rows = torch.empty(int(count), sum(widths), dtype=shard.means.dtype)
            collectives.receive(rows, source)
            columns = rows.split(widths, dim=1)
            yield GaussianModel(**{name: column.reshape(len(rows), *t.shape[1:])
                                   for (name, t), column
                                   in zip(shard.parameters().items(), columns)},
                                sh_degree=shard.sh_degree, antialiased=shard.antialiased)

    @torch.no_grad()
    def render(self, rows: Rows, camera: Camera) -> RenderOutput:
        """The whole view on every rank, each rank rendering its rows of it (rows
        current)."""
        working = rows.working_set([camera])
        splats = project(working.model, [camera], working.visibility, self.backend)
        work = tile_row_work(splats, [camera]).cpu()
        collectives.all_reduce(work)
        bands = partition(work, [camera], self.world, self.row_cost())
        floats, ints = self._exchange(splats, bands, [camera])
        image = torch.zeros(camera.height, camera.width, 4, dtype=working.model.means.dtype)
        for band in bands[self.rank]:
            out = rasterize(unpack(floats, ints, 0, camera), camera.width, camera.height,
                            rows=band.rows, background=self.background, backend=self.backend)
            image[band.rows[0]:band.rows[1]] = torch.cat([out.rgb, out.alpha[..., None]], dim=-1)
        collectives.all_reduce(image)  # each row comes from one rank, zeros from the others
        return RenderOutput(image[..., :3], image[..., 3], None, (0, camera.height))

    def shard(self) -> tuple[int, int]:
        return self.rank, self.world


"""How a step is computed in one process: every view of the batch rendered whole.

``OneProcess`` is the step part of an engine alone on its device (with
``ResidentRows``: ``local_engine``; with ``OffloadedRows``: ``offload_engine``).
It renders from the rows' working set, takes the loss of each view, runs the
backward pass and hands the gradients back to the rows.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch import Tensor

from splatscale.data.cameras import Camera
from splatscale.engine import StepResult, TrainView
from splatscale.engine.device_images import DeviceImages
from splatscale.engine.rows import Rows
from splatscale.model.gaussians import GaussianModel
from splatscale.render import Backend, RenderOutput, Splats, project, rasterize
from splatscale.render.projection import Visibility
from splatscale.step import densify
from splatscale.step.loss import photometric_loss, psnr


class OneProcess:
    def __init__(self, background: Tensor, ssim_weight: float = 0.2, device: str = "cpu",
                 backend: Backend | None = None) -> None:
        """``backend`` None: the device's."""
        self.background = background.to(torch.device(device))
        self.ssim_weight = ssim_weight
        self.backend = backend
        self.targets = DeviceImages(torch.device(device))

    def forward_backward(self, rows: Rows, batch: list[TrainView],
                         track_stats: bool) -> StepResult:
        working = rows.working_set([view.camera for view in batch])
        splats, loss, mean_psnr = self.loss_backward(working.model, batch, working.seen)
        # Before anything waits for the backward pass: on a GPU the rows work beside it.
        rows.gradients_taken(working)
        if track_stats:
            track(rows.stats, splats, batch,
                  working.rows[splats.gaussian_ids.to(working.rows.device)])
        result = StepResult(loss.item(), mean_psnr)
        result.diagnostics.update(working.measured)
        return result

    def loss_backward(self, model: GaussianModel, batch: list[TrainView],
                      seen: Visibility | None = None) -> tuple[Splats, Tensor, float]:
        """Render ``batch`` from ``model``, its loss averaged over the views, backward
        (queued: on a GPU it may still run); the loss and the views' mean PSNR."""
        splats = project(model, [view.camera for view in batch], seen, self.backend)
        splats.means2d.retain_grad()
        loss, psnrs = 0.0, []
        for i, view in enumerate(batch):
            out = rasterize(splats.of_camera(i), view.camera.width, view.camera.height,
                            background=self.background, backend=self.backend)
            target = self.targets.target(view)
            loss = loss + photometric_loss(out.rgb, target, self.ssim_weight)
            psnrs.append(psnr(out.rgb.detach(), target))
        loss = loss / len(batch)
        loss.backward()
        return splats, loss.detach(), sum(psnrs) / len(psnrs)

    @torch.no_grad()
    def render(self, rows: Rows, camera: Camera) -> RenderOutput:
        """On the device, from the rows the camera sees (rows current)."""
        working = rows.working_set([camera])
        return rasterize(project(working.model, [camera], working.seen,
                                 self.backend).of_camera(0),
                         camera.width, camera.height, background=self.background,
                         backend=self.backend)

    def densified(self, rows: Rows) -> None:
        """Nothing to even out with one process."""

    def total(self, value: int | float) -> int | float:
        return value

    def any_rank(self, flag: bool) -> bool:
        return flag

    def model_parts(self, part: GaussianModel) -> Iterator[GaussianModel]:
        yield part

    def shard(self) -> tuple[int, int]:
        return 0, 1


def track(stats: densify.DensifyStats, splats: Splats, batch: list[TrainView],
          rows: Tensor) -> None:
    """Add the views' view-space gradient norms to ``stats`` of ``rows`` (the master
    rows of the splats)."""
    if splats.means2d.grad is None:  # nothing was visible
        return
    for i, view in enumerate(batch):
        lo, hi = splats.camera_offsets[i], splats.camera_offsets[i + 1]
        norms = densify.view_space_grad_norms(splats.means2d.grad[lo:hi], view.camera.width,
                                              view.camera.height, len(batch))
        stats.add(rows[lo:hi], norms.to(rows.device))

"""How a step is computed in one process: every view of the batch rendered whole.

``OneProcess`` is the step part of an engine alone on its device (with
``ResidentRows`` or ``OffloadedRows``; ``engine/factory.py``). It renders from
the rows' working set, takes each view's loss as one band of all its rows
(``step/view_loss.py``), runs the backward pass and hands the gradients back to
the rows.
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch
from torch import Tensor

from splatscale.data.cameras import Camera
from splatscale.engine import StepResult, TrainView
from splatscale.engine.device_images import DeviceImages
from splatscale.engine.rows import Rows
from splatscale.engine.seen import tell, watch
from splatscale.model.gaussians import GaussianModel
from splatscale.backends import Backend, backend_for
from splatscale.render import RenderOutput, project, rasterize
from splatscale.render.dense_gradients import reusing
from splatscale.step import appearance
from splatscale.step.loss import psnr_of
from splatscale.step.selection import Number
from splatscale.step.view_loss import band_loss, masked_in_values
from splatscale.step.observer import Observer


class OneProcess:
    def __init__(self, background: Tensor, ssim_weight: float = 0.2, device: str = "cpu",
                 backend: Backend | None = None) -> None:
        """``backend`` None: the device's."""
        self.background = background.to(torch.device(device))
        self.ssim_weight = ssim_weight
        self.backend = backend or backend_for(device)
        self.targets = DeviceImages(torch.device(device), backend=self.backend)

    def forward_backward(self, rows: Rows, batch: list[TrainView],
                         observer: Observer | None) -> StepResult:
        """Render ``batch``, its loss averaged over the views, backward (queued: on a
        GPU it may still run while the rows take the gradients)."""
        working = rows.working_set([view.camera for view in batch])
        splats = project(working.model, [view.camera for view in batch], working.visibility,
                         self.backend)
        watch(splats, observer)
        shares, psnrs = [], []
        for i, view in enumerate(batch):
            camera = view.camera
            out = rasterize(splats.of_camera(i), camera.width, camera.height,
                            background=self.background, backend=self.backend)
            target = self.targets.target(view)
            elements = masked_in_values(target)
            view_loss, error = band_loss(appearance.apply(out.rgb, view.appearance), target,
                                         (0, camera.height), elements, self.ssim_weight)
            shares.append(view_loss)
            psnrs.append(psnr_of(error, elements))
        loss = sum(shares[1:], shares[0]) / len(batch)
        with reusing(rows.spare_gradients()):
            loss.backward()
        rows.gradients_taken(working)
        tell(observer, rows, working, splats)
        result = StepResult(loss.item(), sum(psnrs) / len(psnrs))
        result.diagnostics.update(working.measured)
        return result

    @torch.no_grad()
    def render(self, rows: Rows, camera: Camera) -> RenderOutput:
        """On the device, from the rows the camera sees (rows current)."""
        working = rows.working_set([camera])
        return rasterize(project(working.model, [camera], working.visibility,
                                 self.backend).of_camera(0),
                         camera.width, camera.height, background=self.background,
                         backend=self.backend)

    def read_ahead(self, read: Callable[[], None]) -> None:
        """Every view is rendered whole: its image is read whole, now."""
        read()

    def rebalance(self, rows: Rows) -> None:
        """Nothing to even out with one process."""

    def total(self, value: Number) -> Number:
        return value

    def any_rank(self, flag: bool) -> bool:
        return flag

    def model_parts(self, part: GaussianModel) -> Iterator[GaussianModel]:
        yield part

    def shard(self) -> tuple[int, int]:
        return 0, 1

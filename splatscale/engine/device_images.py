"""Training images on the engine's device: each uploaded once, kept while they fit."""

from __future__ import annotations

import torch
from torch import Tensor

from splatscale.backends import Backend, backend_for
from splatscale.engine import TrainView

BUDGET_SHARE = 0.25  # of the device memory free when the first image arrives


class DeviceImages:
    """The targets of training views on ``device``, whose backend is ``backend`` (None:
    the device's). Where the device is host memory they are the views' own tensors;
    elsewhere an image is uploaded the first time its view comes, as its uint8 pixels
    where the view was read from them (a quarter of the float bytes), and kept, by
    camera name, until the kept images would pass ``budget`` bytes (by default a
    quarter of the device memory free then); later ones are uploaded at each use."""

    def __init__(self, device: torch.device, budget: int | None = None,
                 backend: Backend | None = None) -> None:
        self.device = device
        self.backend = backend or backend_for(device)
        self.budget = budget
        self.kept: dict[str, Tensor] = {}
        self.kept_bytes = 0

    def target(self, view: TrainView) -> Tensor:
        if self.backend.shares_host_memory:
            return view.target
        name = view.camera.name
        image = self.kept.get(name)
        if image is None:
            pixels = view.pixels()
            image = (pixels if pixels is not None else view.target).to(self.device,
                                                                        non_blocking=True)
            if name and self.kept_bytes + image.nbytes <= self._budget():
                self.kept[name] = image
                self.kept_bytes += image.nbytes
        if image.dtype == torch.uint8:
            return self.backend.pixels_as_float(image, torch.float32)
        return image

    def rows(self, view: TrainView, y0: int, y1: int, like: Tensor) -> Tensor:
        """Rows ``[y0, y1)`` of ``view``'s target on the device in ``like``'s dtype (a
        rank's band). Where the device is host memory, or the image cannot be kept,
        only those rows are read; otherwise the image is kept whole, as ``target``
        keeps it, for the bands of the steps to come."""
        camera = view.camera
        pixel_bytes = (4 if view.masked else 3) * camera.width * camera.height
        if self.backend.shares_host_memory or (
                camera.name not in self.kept
                and self.kept_bytes + pixel_bytes > self._budget()):
            return view.target_rows(y0, y1, like)
        return self.target(view)[y0:y1].to(like.dtype)

    def _budget(self) -> int:
        if self.budget is None:
            self.budget = int(self.backend.free_memory(self.device) * BUDGET_SHARE)
        return self.budget

"""Which Gaussians a batch may see, decided on the device from lagging geometry.

The device keeps each Gaussian's means, log-scales and quaternions as they
were when the row was last written; the row's true values (dense Adam's)
may have moved since, by at most ``reach`` per coordinate of the means and of
the log-scales (``DeferredAdam.reach``). ``candidates`` keeps every Gaussian
that could pass ``project``'s visibility test for some values within that
reach (``render/drift.py`` holds the bound and why it holds), by the device's
backend; the exact test then runs on the true values of the candidates alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from torch import Tensor

from splatscale.data.cameras import Camera
from splatscale.backends import backend_for


@dataclass
class DeviceGeometry:
    """What the device keeps of every Gaussian: 40 bytes of geometry in float32 and
    the step the row was last written at."""

    means: Tensor        # [N, 3]
    log_scales: Tensor   # [N, 3]
    quats: Tensor        # [N, 4]
    updated_at: Tensor   # [N] int32

    def nbytes_per_gaussian(self) -> int:
        return sum(t[0].nbytes for t in (self.means, self.log_scales, self.quats,
                                         self.updated_at))


def candidates(means: Tensor, log_scales: Tensor, reach_means: Tensor, reach_scales: Tensor,
               cameras: Sequence[Camera]) -> Tensor:
    """Bool [N]: Gaussians that may be visible in some camera of the batch."""
    return backend_for(means.device).candidates(means, log_scales, reach_means, reach_scales,
                                                cameras)

"""The engine on one device: every row resident there, every view rendered whole.

The device is the CPU (the cpu backend's numba kernels) or a CUDA GPU (gsplat's
kernels, Adam and densification as torch operations on device tensors).
Checkpoints and exported models are CPU tensors whatever the device, so runs
resume on either.
"""

from __future__ import annotations

from torch import Tensor

from splatscale.engine.engine import ComposedEngine
from splatscale.engine.one_process import OneProcess
from splatscale.engine.rows import ResidentRows
from splatscale.model.gaussians import GaussianModel
from splatscale.render import Backend


def local_engine(model: GaussianModel, batch_size: int, background: Tensor,
                 ssim_weight: float = 0.2, device: str = "cpu",
                 backend: Backend | None = None) -> ComposedEngine:
    """``device`` renders and holds everything; ``backend`` None: the device's."""
    return ComposedEngine(ResidentRows(model, batch_size, device),
                  OneProcess(background, ssim_weight, device, backend))

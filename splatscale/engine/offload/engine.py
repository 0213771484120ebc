"""The offload engine (GS-Scale): the rows in host memory (``OffloadedRows``), every
view rendered whole on the device (``OneProcess``)."""

from __future__ import annotations

from torch import Tensor

from splatscale.engine.engine import ComposedEngine
from splatscale.engine.offload.rows import OffloadedRows
from splatscale.engine.one_process import OneProcess
from splatscale.model.gaussians import GaussianModel
from splatscale.render import Backend


def offload_engine(model: GaussianModel, batch_size: int, background: Tensor,
                   ssim_weight: float = 0.2, device: str = "cpu",
                   forwarding: bool | None = None, backend: Backend | None = None,
                   lookahead: bool | None = None) -> ComposedEngine:
    """``forwarding`` and ``lookahead`` None: on when ``device`` is not the host's CPU."""
    return ComposedEngine(OffloadedRows(model, batch_size, device, forwarding, lookahead),
                  OneProcess(background, ssim_weight, device, backend))

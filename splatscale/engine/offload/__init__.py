"""GS-Scale's offload engine: the Gaussians and their optimiser state in host memory
(``rows``), culling on the device from lagging geometry (``culling``), a host Adam
that defers untouched rows (``host_adam``), the host update overlapping the next
step (``pipeline``), the engine made of it (``engine``)."""

from splatscale.engine.offload.engine import offload_engine

__all__ = ["offload_engine"]

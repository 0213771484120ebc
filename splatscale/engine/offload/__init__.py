"""GS-Scale's offload engine: the Gaussians and their optimiser state in host memory,
culling on the device from lagging geometry (``culling``), a host Adam that defers
untouched rows (``host_adam``), the host update overlapping the next step
(``pipeline``), one step in ``engine``."""

from splatscale.engine.offload.engine import OffloadEngine

__all__ = ["OffloadEngine"]

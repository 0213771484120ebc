"""Both at once: every rank of the distributed engine offloads its own shard.

The distributed engine's step renders from ``_working_set`` and hands its
gradients to ``_gradients_taken``; with the offload engine next in line those
are the cull, the forwarded values and the deferred host Adam, on the rank's
shard. Densification, rebalancing, checkpoints and export catch the shard up
first, as each engine does alone.
"""

from __future__ import annotations

from splatscale.engine.distributed import DistributedEngine
from splatscale.engine.offload.engine import OffloadEngine


class OffloadedShardEngine(DistributedEngine, OffloadEngine):
    """``DistributedEngine`` whose shard lives in host memory as ``OffloadEngine`` keeps it."""

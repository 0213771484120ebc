"""Grendel's distributed engine: Gaussians sharded over ranks, each batch's pixel rows
partitioned over ranks by estimated cost (``partition``, ``cost_model``), splats
sent only where they are rendered (``exchange``), one step per rank in ``engine``."""

from splatscale.engine.distributed import group
from splatscale.engine.distributed.engine import DistributedEngine, shard_of

__all__ = ["DistributedEngine", "group", "shard_of"]

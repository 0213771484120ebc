"""Grendel's distributed engine: Gaussians sharded over ranks, each batch's pixel rows
partitioned over ranks by estimated cost (``partition``, ``cost_model``), splats
sent only where they are rendered (``exchange``), a step computed by the ranks
together (``compute``), the engine made of it (``engine``)."""

from splatscale.engine.distributed import group
from splatscale.engine.distributed.engine import distributed_engine, shard_of

__all__ = ["distributed_engine", "group", "shard_of"]

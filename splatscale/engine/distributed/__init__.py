"""Grendel's step over ranks: each batch's pixel rows partitioned over the ranks by
estimated cost (``partition``, ``cost_model``), splats sent only where they are
rendered (``exchange``, over ``collectives``), the step computed by the ranks
together (``compute``)."""

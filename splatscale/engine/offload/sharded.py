"""Both at once: every rank of the distributed engine offloads its own shard
(``OffloadedRows`` under ``Ranks``)."""

from __future__ import annotations

from torch import Tensor

from splatscale.engine.distributed.compute import MAX_IMBALANCE, Ranks
from splatscale.engine.distributed.cost_model import RowCost
from splatscale.engine.engine import ComposedEngine
from splatscale.engine.offload.rows import OffloadedRows
from splatscale.model.gaussians import GaussianModel


def offloaded_shard_engine(shard: GaussianModel, batch_size: int, background: Tensor,
                           ssim_weight: float = 0.2, balance: str = "cost",
                           fixed_cost: RowCost | None = None,
                           max_imbalance: float = MAX_IMBALANCE, device: str = "cpu",
                           forwarding: bool | None = None,
                           lookahead: bool | None = None) -> ComposedEngine:
    """This rank's engine over its ``shard``, kept in host memory (arguments as
    ``distributed_engine``'s and ``offload_engine``'s)."""
    return ComposedEngine(OffloadedRows(shard, batch_size, device, forwarding, lookahead),
                          Ranks(background, ssim_weight, balance, fixed_cost, max_imbalance,
                                device))

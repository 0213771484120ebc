"""The distributed engine (Grendel): this rank's shard resident (``ResidentRows``),
each step computed with the other ranks (``Ranks``)."""

from __future__ import annotations

from torch import Tensor

from splatscale.engine.distributed.compute import MAX_IMBALANCE, Ranks
from splatscale.engine.distributed.cost_model import RowCost
from splatscale.engine.engine import ComposedEngine
from splatscale.engine.rows import ResidentRows
from splatscale.engine.state import shard_rows
from splatscale.model.gaussians import GaussianModel


def shard_of(model: GaussianModel, rank: int, world: int) -> GaussianModel:
    """Rank ``rank``'s even share of ``model``'s rows, copied."""
    rows = shard_rows(len(model), rank, world)
    return GaussianModel(**{n: t.detach()[rows].clone() for n, t in model.parameters().items()},
                         sh_degree=model.sh_degree, keys=model.keys[rows].clone())


def distributed_engine(shard: GaussianModel, batch_size: int, background: Tensor,
                       ssim_weight: float = 0.2, balance: str = "cost",
                       fixed_cost: RowCost | None = None,
                       max_imbalance: float = MAX_IMBALANCE,
                       device: str = "cpu") -> ComposedEngine:
    """This rank's engine over its ``shard``, held and rendered on ``device``;
    ``balance`` and ``fixed_cost`` as ``Ranks`` takes them, shards evened out past
    ``max_imbalance``."""
    return ComposedEngine(ResidentRows(shard, batch_size, device),
                          Ranks(background, ssim_weight, balance, fixed_cost, max_imbalance,
                                device))

"""The one way to make an engine: where its rows live, and how its steps are computed.

``make_engine`` composes a ``Rows`` part (``ResidentRows``, or with ``offload``
GS-Scale's ``OffloadedRows``) with a ``Compute`` part (``OneProcess``, or with
``ranks`` Grendel's ``ManyRanks``): four engines from two choices, each made of
option objects, so a new option is a field of one of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from splatscale.engine.composed import ComposedEngine
from splatscale.engine.distributed.compute import MAX_IMBALANCE, ManyRanks
from splatscale.engine.distributed.cost_model import RowCost
from splatscale.engine.offload.rows import OffloadedRows
from splatscale.engine.one_process import OneProcess
from splatscale.engine.rows import ResidentRows
from splatscale.engine.state import shard_rows
from splatscale.model.gaussians import GaussianModel
from splatscale.backends import Backend, backend_for


@dataclass(frozen=True)
class OffloadOptions:
    """The rows in host memory (GS-Scale). ``forwarding``: the host update of a step
    runs beside the device's next step; ``lookahead``: the next batch's rows are
    sent while this step's backward pass runs. None: on when the device is not the
    host's CPU (on a CPU the two share the cores)."""

    forwarding: bool | None = None
    lookahead: bool | None = None


@dataclass(frozen=True)
class RankOptions:
    """The step computed by the ranks of the process group (Grendel). ``balance``:
    ``cost`` cuts each batch's rows into equal estimated cost (with ``fixed_cost``,
    or with coefficients fitted as the run goes), ``uniform`` into equal row counts;
    the shards are evened out when the largest exceeds the smallest by
    ``max_imbalance``."""

    balance: str = "cost"
    fixed_cost: RowCost | None = None
    max_imbalance: float = MAX_IMBALANCE


def make_engine(model: GaussianModel, batch_size: int, background: Tensor,
                ssim_weight: float = 0.2, device: str = "cpu",
                offload: OffloadOptions | None = None, ranks: RankOptions | None = None,
                backend: Backend | None = None) -> ComposedEngine:
    """An engine over ``model`` (with ``ranks``, this rank's shard: ``shard_of``) that
    renders on ``device`` with ``backend`` (None: the device's, chosen here once);
    checkpoints and exported models are CPU tensors whatever the device, so runs
    resume on any."""
    backend = backend or backend_for(device)
    rows = (ResidentRows(model, batch_size, device, backend) if offload is None
            else OffloadedRows(model, batch_size, device, offload.forwarding,
                               offload.lookahead))
    compute = (OneProcess(background, ssim_weight, device, backend) if ranks is None
               else ManyRanks(background, ssim_weight, ranks.balance, ranks.fixed_cost,
                              ranks.max_imbalance, device, backend))
    return ComposedEngine(rows, compute)


def shard_of(model: GaussianModel, rank: int, world: int) -> GaussianModel:
    """Rank ``rank``'s even share of ``model``'s rows, copied."""
    return model.rows(shard_rows(len(model), rank, world))

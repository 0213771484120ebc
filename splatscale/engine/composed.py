"""The engine: where the rows live, composed with how a step is computed.

A ``ComposedEngine`` is two parts, each with a contract of its own:

- ``rows`` (``engine/rows.py``'s ``Rows``): where the row set (the Gaussians,
  their Adam moments, the strategy's per-row state) lives, and how a step gets
  the rows it renders from and updates them. ``ResidentRows`` keeps everything
  on the compute device; ``OffloadedRows`` (GS-Scale) keeps it in host memory.
- ``compute`` (``Compute`` below): how one step's forward and backward pass
  run over those rows. ``OneProcess`` renders every view whole; ``ManyRanks``
  (Grendel) cuts each batch's pixel rows over the ranks and exchanges the
  splats each one needs.

The four combinations are instances of this one class, not subclasses, made
by ``factory.make_engine`` from its options:

=====================  =================  ==============
options                rows               compute
=====================  =================  ==============
none                   ``ResidentRows``   ``OneProcess``
``offload``            ``OffloadedRows``  ``OneProcess``
``ranks``              ``ResidentRows``   ``ManyRanks``
both                   ``OffloadedRows``  ``ManyRanks``
=====================  =================  ==============

One step, as the Trainer calls it (the strategies' order, ``strategy/base.py``)::

    expect(next, lrs)        rows.expect(next, lrs): the next batch's cameras and this
                               step's learning rates, where known (a hint)
    forward_backward(batch, observer, regularisers)
                             compute.forward_backward(rows, batch, observer):
                               rows.working_set(cameras) -> render, loss, backward
                               -> rows.gradients_taken(working) -> observer.observe;
                               then rows.add_gradient(regularisers' gradient)
    edit_rows(edit)          rows.bring_current(); edit(rows.row_set, compute.total);
                               if rows moved: compute.rebalance(rows), each rank's rows
                               in space's order (step/spatial_order.py);
                               rows.rows_edited()
    optimizer_step(lrs)      rows.step(lrs)

A strategy's edits (densification, the opacity reset, MCMC's relocation and
noise) are of the rows the next gradient is taken of, so the groups they
replaced are not stepped with the gradient taken before them
(``RowSet.take_edited``).

Everything else (evaluation, export, the NaN guard, checkpoints) brings the
rows current first, and then reads them through ``compute``, which sums over
ranks where there are several.
"""

from __future__ import annotations

from typing import Callable, Iterator, Protocol, TypeVar

from splatscale.data.cameras import Camera
from splatscale.engine import StepResult, TrainView
from splatscale.engine.rows import Rows
from splatscale.engine.state import EngineState
from splatscale.model.gaussians import GaussianModel, sh_rest
from splatscale.render import RenderOutput
from splatscale.step.row_set import RowSet
from splatscale.step.selection import Number, Total
from splatscale.step.sh_bands import hold_sh_bands
from splatscale.step.spatial_order import spatial_order
from splatscale.step.observer import GradientTerm, Observer

Result = TypeVar("Result")


class Compute(Protocol):
    """How a step is computed over a ``Rows`` part. With several ranks every call
    is collective: each rank makes it, in the same order."""

    def forward_backward(self, rows: Rows, batch: list[TrainView],
                         observer: Observer | None) -> StepResult:
        """Render ``batch`` from ``rows.working_set``, take the loss averaged over its
        views, run the backward pass, hand the gradients to ``rows.gradients_taken``,
        and tell ``observer`` what the step saw. Post: the rows hold this step's
        gradients."""
        ...

    def render(self, rows: Rows, camera: Camera) -> RenderOutput:
        """Pre: the rows are current. The whole view (on every rank)."""
        ...

    def read_ahead(self, read: Callable[[], None]) -> None:
        """``read()`` where the next batch's images are read whole; else nothing."""
        ...

    def rebalance(self, rows: Rows) -> None:
        """Pre: an edit replaced the rows. Rows may move (between ranks)."""
        ...

    def total(self, value: Number) -> Number:
        """``value`` summed over the ranks."""
        ...

    def any_rank(self, flag: bool) -> bool: ...

    def model_parts(self, part: GaussianModel) -> Iterator[GaussianModel]:
        """The model in consecutive parts, this process' ``part`` among them, on the
        process that writes; the others send theirs and yield nothing."""
        ...

    def shard(self) -> tuple[int, int]:
        """(rank, world) of the rows this process holds; (0, 1): all."""
        ...


class ComposedEngine:
    """``rows`` and ``compute`` together implement the engine contract
    (``splatscale.engine.Engine``)."""

    def __init__(self, rows: Rows, compute: Compute) -> None:
        self.rows = rows
        self.compute = compute

    # The master rows, for tests and tools that inspect them.
    @property
    def row_set(self) -> RowSet:
        return self.rows.row_set

    @property
    def model(self) -> GaussianModel:
        return self.rows.row_set.model

    def expect(self, cameras: list[Camera], learning_rates: dict[str, float]) -> None:
        self.rows.expect(cameras, learning_rates)

    def read_ahead(self, read: Callable[[], None]) -> None:
        self.compute.read_ahead(read)

    def forward_backward(self, batch: list[TrainView], observer: Observer | None = None,
                         regularisers: GradientTerm | None = None) -> StepResult:
        self.rows.row_set.take_edited()  # earlier edits are history for this gradient
        result = self.compute.forward_backward(self.rows, batch, observer)
        if regularisers is not None:
            count = self.compute.total(len(self.rows.row_set))
            self.rows.add_gradient(lambda params: regularisers.gradients(params, count))
        return result

    def edit_rows(self, edit: Callable[[RowSet, Total], Result]) -> Result:
        rows = self.rows
        assert not rows.row_set.replaced, "rows were replaced outside edit_rows"
        rows.bring_current()
        result = edit(rows.row_set, self.compute.total)
        # Collective from here on: every rank moves rows if any replaced some.
        replaced = self.compute.any_rank(rows.row_set.take_replaced())
        if replaced:
            self.compute.rebalance(rows)
            rows.row_set.replace(spatial_order(rows.row_set.model.means))
            rows.row_set.take_replaced()
        rows.rows_edited(replaced)
        return result

    def optimizer_step(self, learning_rates: dict[str, float]) -> None:
        self.rows.step(learning_rates)

    def set_sh_degree(self, degree: int) -> None:
        # Every rank holds the same bands, so every rank edits here or none does.
        if self.rows.row_set.params["shN"].shape[1] != sh_rest(degree):
            self.edit_rows(lambda row_set, total: hold_sh_bands(row_set, degree, total))
        self.rows.row_set.model.sh_degree = degree

    def render(self, camera: Camera) -> RenderOutput:
        self.rows.bring_current()
        return self.compute.render(self.rows, camera)

    def num_gaussians(self) -> int:
        return self.compute.total(len(self.rows.row_set))

    def model_parts(self) -> Iterator[GaussianModel]:
        self.rows.bring_current()
        return self.compute.model_parts(self.rows.row_set.model.detach().to(device="cpu"))

    def non_finite(self) -> int:
        self.rows.bring_current()
        return self.compute.total(len(self.rows.row_set.model.non_finite_rows()))

    def state_dict(self) -> EngineState:
        """The engine's state as CPU tensors, copied."""
        self.rows.bring_current()
        return self.rows.state_dict()

    def load_state_dict(self, state: EngineState) -> None:
        self.rows.load_state_dict(state)

    def shard(self) -> tuple[int, int]:
        return self.compute.shard()

    def any_rank(self, flag: bool) -> bool:
        return self.compute.any_rank(flag)

    def close(self) -> None:
        self.rows.close()

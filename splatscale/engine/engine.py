"""The engine: where the rows live, composed with how a step is computed.

A ``ComposedEngine`` is two parts, each with a contract of its own:

- ``rows`` (``engine/rows.py``'s ``Rows``): where the Gaussians, their Adam
  state and densification statistics live, and how a step gets the rows it
  renders from and updates them. ``ResidentRows`` keeps everything on the
  compute device; ``OffloadedRows`` (GS-Scale) keeps it in host memory.
- ``compute`` (``Compute`` below): how one step's forward and backward pass
  run over those rows. ``OneProcess`` renders every view whole; ``Ranks``
  (Grendel) cuts each batch's pixel rows over the ranks and exchanges the
  splats each one needs.

The four combinations are instances of this one class, not subclasses:

==========================  =================  ==============
made by                     rows               compute
==========================  =================  ==============
``local_engine``            ``ResidentRows``   ``OneProcess``
``offload_engine``          ``OffloadedRows``  ``OneProcess``
``distributed_engine``      ``ResidentRows``   ``Ranks``
``offloaded_shard_engine``  ``OffloadedRows``  ``Ranks``
==========================  =================  ==============

One step, as the Trainer calls it with the 3DGS strategy (3DGS's order)::

    expect(next, lrs)        rows.expect(next, lrs): the next batch's cameras and this
                               step's learning rates, where known (a hint)
    forward_backward(batch)  compute.forward_backward(rows, batch):
                               rows.working_set(cameras) -> render, loss, backward
                               -> rows.gradients_taken(working), statistics
    densify_and_prune(...)   rows.bring_current(); densify(rows.model, rows.optimizer,
                               rows.stats); compute.densified(rows); rows.rows_replaced()
    reset_opacity()          rows.bring_current(); reset_opacity(rows.model, rows.optimizer)
    optimizer_step(lrs)      rows.step(lrs)

and with the MCMC strategy (gsplat's order: refinement after Adam)::

    forward_backward(batch, regularisers)
                             as above, then rows.add_gradient(regularisers' gradient)
    optimizer_step(lrs)      rows.step(lrs)
    relocate_and_add(...)    rows.bring_current(); mcmc.relocate, mcmc.add;
                               compute.densified(rows); rows.rows_replaced()
    inject_noise(...)        rows.bring_current(); means moved; rows.rows_replaced()

The edits a step makes (densification, reset, noise) are of the rows the next
gradient is taken of, so ``forward_backward`` starts by forgetting earlier ones
(``GaussianAdam.new_gradients``).

Everything else (evaluation, export, the NaN guard, checkpoints) brings the
rows current first, and then reads them through ``compute``, which sums over
ranks where there are several.
"""

from __future__ import annotations

from typing import Iterator, Protocol

from splatscale.data.cameras import Camera
from splatscale.engine import StepResult, TrainView
from splatscale.engine.rows import Rows, zero_stats
from splatscale.engine.state import EngineState
from splatscale.model.gaussians import GaussianModel
from splatscale.render import RenderOutput
from splatscale.step import densify, mcmc
from splatscale.step.optimizer import GaussianAdam


class Compute(Protocol):
    """How a step is computed over a ``Rows`` part. With several ranks every call
    is collective: each rank makes it, in the same order."""

    def forward_backward(self, rows: Rows, batch: list[TrainView],
                         track_stats: bool) -> StepResult:
        """Render ``batch`` from ``rows.working_set``, take the loss averaged over its
        views, run the backward pass, add the view-space gradient norms to
        ``rows.stats`` with ``track_stats``, and hand the gradients to
        ``rows.gradients_taken``. Post: the rows hold this step's gradients."""
        ...

    def render(self, rows: Rows, camera: Camera) -> RenderOutput:
        """Pre: the rows are current. The whole view (on every rank)."""
        ...

    def densified(self, rows: Rows) -> None:
        """Pre: densification replaced the rows. Rows may move (between ranks)."""
        ...

    def total(self, value: int | float) -> int | float:
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
        self.densify_events = 0

    # The master rows, for tests and tools that inspect them.
    @property
    def model(self) -> GaussianModel:
        return self.rows.model

    @property
    def optimizer(self) -> GaussianAdam:
        return self.rows.optimizer

    @property
    def stats(self) -> densify.DensifyStats:
        return self.rows.stats

    def expect(self, cameras: list[Camera], learning_rates: dict[str, float]) -> None:
        self.rows.expect(cameras, learning_rates)

    def forward_backward(self, batch: list[TrainView], track_stats: bool,
                         regularisers: mcmc.Regularisers | None = None) -> StepResult:
        self.rows.optimizer.new_gradients()
        result = self.compute.forward_backward(self.rows, batch, track_stats)
        if regularisers is not None:
            count = self.compute.total(len(self.rows.model))
            self.rows.add_gradient(lambda params: regularisers.gradients(params, count))
        return result

    def densify_and_prune(self, grad_threshold: float, percent_dense: float, extent: float,
                          min_opacity: float, prune_large: bool,
                          max_gaussians: int | None = None) -> dict[str, int]:
        rows = self.rows
        rows.bring_current()
        rows.stats, counts = densify.densify_and_prune(rows.model, rows.optimizer, rows.stats,
                                               grad_threshold, percent_dense, extent,
                                               min_opacity, prune_large, self.densify_events,
                                               max_gaussians, self.compute.total)
        self.densify_events += 1
        self._rows_replaced()
        return {name: self.compute.total(count) for name, count in counts.items()}

    def relocate_and_add(self, max_gaussians: int, min_opacity: float) -> dict[str, int]:
        rows = self.rows
        rows.bring_current()
        event, total = self.densify_events, self.compute.total
        moved = mcmc.relocate(rows.model, rows.optimizer, min_opacity, event, total)
        added = mcmc.add(rows.model, rows.optimizer, max_gaussians, min_opacity, event + 1,
                         total)
        self.densify_events += 2
        rows.stats = zero_stats(rows.model)
        self._rows_replaced()
        return {"relocated": moved, "added": added}

    def inject_noise(self, scale: float, step: int) -> None:
        rows = self.rows
        rows.bring_current()
        moves = mcmc.noise(rows.model, scale, step)
        rows.optimizer.edit(lambda name, means: means + moves, lambda name, moment: moment,
                            ["means"])
        rows.model.set_parameters(rows.optimizer.params)
        rows.rows_replaced()

    def _rows_replaced(self) -> None:
        self.compute.densified(self.rows)
        self.rows.rows_replaced()

    def reset_opacity(self) -> None:
        self.rows.bring_current()
        densify.reset_opacity(self.rows.model, self.rows.optimizer)

    def optimizer_step(self, learning_rates: dict[str, float]) -> None:
        self.rows.step(learning_rates)

    def set_sh_degree(self, degree: int) -> None:
        self.rows.model.sh_degree = degree

    def render(self, camera: Camera) -> RenderOutput:
        self.rows.bring_current()
        return self.compute.render(self.rows, camera)

    def num_gaussians(self) -> int:
        return self.compute.total(len(self.rows.model))

    def model_parts(self) -> Iterator[GaussianModel]:
        self.rows.bring_current()
        return self.compute.model_parts(self.rows.model.detach().to(device="cpu"))

    def non_finite(self) -> int:
        self.rows.bring_current()
        return self.compute.total(len(self.rows.model.non_finite_rows()))

    def state_dict(self) -> EngineState:
        """The engine's state as CPU tensors, copied."""
        self.rows.bring_current()
        return {**self.rows.state_dict(), "densify_events": self.densify_events}

    def load_state_dict(self, state: EngineState) -> None:
        self.rows.load_state_dict(state)
        self.densify_events = state["densify_events"]

    def shard(self) -> tuple[int, int]:
        return self.compute.shard()

    def any_rank(self, flag: bool) -> bool:
        return self.compute.any_rank(flag)

    def close(self) -> None:
        self.rows.close()

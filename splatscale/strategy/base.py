"""What every strategy is: its contract with the Trainer and the engine (an
``Observer`` of what each step saw, ``step/observer.py``), and the settings all
strategies share.

A strategy decides when and how training changes the set of Gaussians. The
Trainer calls it at fixed points of each step, with the images seen before and
after the step's batch (schedules count images, so they hold for any batch
size)::

    observer = strategy if strategy.observes(after) else None
    result = engine.forward_backward(batch, observer, strategy.regularisers)
    strategy.before_adam(engine, before, after)   # 3DGS: densify, reset opacity
    engine.optimizer_step(learning_rates)
    strategy.after_adam(engine, before, after, means_lr)   # MCMC: relocate, add, noise

Its edits reach the rows through one seam, ``engine.edit_rows(edit)``: the
engine brings every row current, calls ``edit(row_set, total)`` on each rank's
``RowSet`` (``total`` sums a number over the ranks, for budgets and top-k),
then evens the shards out and refreshes what it derived from the rows. A
strategy's operations are plain functions of a ``RowSet``: they are tested
without an engine. Its per-row state (3DGS's gradient statistics) lives in
``row_set.state`` and travels with the rows wherever they go.

On the run's last batch a strategy does nothing: no step is left to recover.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, TypeVar


from splatscale.step.observer import GradientTerm, Observer
from splatscale.step.row_set import RowSet
from splatscale.step.selection import Total

Result = TypeVar("Result")


class EditsRows(Protocol):
    """The engine's seam for strategies."""

    def edit_rows(self, edit: Callable[[RowSet, Total], Result]) -> Result:
        """``edit(row_set, total)`` on every rank's current rows; its result (this
        rank's). Collective."""
        ...


class Strategy(Observer, Protocol):
    @property
    def regularisers(self) -> GradientTerm | None:
        """A term of the loss over every Gaussian, or None."""
        ...

    max_gaussians: int | None  # None: no budget
    initial_opacity: float
    initial_scale: float  # times the 3 nearest neighbours' distance
    edits_every_step: bool  # whether every step changes the Gaussians beside Adam

    def observes(self, after: int) -> bool:
        """Whether the step ending after image ``after`` is observed."""
        ...

    def before_adam(self, engine: EditsRows, before: int, after: int) -> dict[str, int]:
        """How many Gaussians each change made, over all ranks (empty: none was due)."""
        ...

    def after_adam(self, engine: EditsRows, before: int, after: int,
                   means_lr: float) -> dict[str, int]:
        """As ``before_adam``."""
        ...


@dataclass
class RefineSettings:
    """When every strategy refines the set, counted in images seen."""

    # Which strategy changes the set of Gaussians: "3dgs" (``default``) or "mcmc".
    strategy: str = "3dgs"
    densify_from: int = 500
    densify_until: int | None = None  # the strategy's own default_refine_until
    densify_interval: int = 100
    prune_opacity: float = 0.005
    max_gaussians: int | None = None  # 3dgs: no budget; mcmc: its own cap


def totals(counts: dict[str, int], total: Total) -> dict[str, int]:
    """``counts`` of one rank's rows, each summed over the ranks."""
    return {name: int(total(count)) for name, count in counts.items()}

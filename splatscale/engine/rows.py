"""Where the rows live: the ``Rows`` contract, and ``ResidentRows`` (all on one device).

A ``Rows`` part holds the Gaussians of an engine (all of them, or its rank's
shard): the master ``model``, its ``optimizer`` (the owner of the Adam state)
and the densification ``stats``, with the same row order. The step part of
the engine (``compute``) asks it for what a batch renders from and hands the
gradients back; everything else (densification, the opacity reset, moves
between ranks, checkpoints, export) acts on ``model``, ``optimizer`` and
``stats`` directly, after ``bring_current``.

The offloaded rows (``offload/rows.py``) keep the same master arrays in host
memory, with the device holding their geometry and each step's working set.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch
from torch import Tensor

from splatscale.data.cameras import Camera
from splatscale.engine.state import EngineState
from splatscale.model.gaussians import GaussianModel
from splatscale.render.projection import Visibility
from splatscale.step import densify
from splatscale.step.optimizer import GaussianAdam


@dataclass
class WorkingSet:
    """What a step renders from: master rows ``rows`` as ``model`` (leaves with
    gradient, on the compute device), their visibility where already known, and
    what gathering them measured (for the step's ``StepResult.diagnostics``)."""

    rows: Tensor
    model: GaussianModel
    seen: Visibility | None = None
    measured: dict[str, int] = field(default_factory=dict)


class Rows(Protocol):
    """Where an engine's Gaussians live.

    ``model``, ``optimizer`` and ``stats`` are the master rows; they are current
    (hold what dense training has) after ``bring_current``, and may be edited
    then. Whoever replaces their rows (densification, moves between ranks) calls
    ``rows_replaced`` after.
    """

    model: GaussianModel
    optimizer: GaussianAdam
    stats: densify.DensifyStats
    device: torch.device

    def working_set(self, cameras: list[Camera]) -> WorkingSet:
        """The rows ``cameras`` may see, as leaves with gradient on the device.
        Post: ``working.rows`` index ``model``; rendering ``working.model`` gives
        what rendering every current row gives."""
        ...

    def gradients_taken(self, working: WorkingSet) -> None:
        """Pre: the backward pass has been queued (on a GPU it may still run):
        ``working.model``'s gradients will be the step's. They are kept for ``step``."""
        ...

    def expect(self, cameras: list[Camera], learning_rates: dict[str, float]) -> None:
        """The next ``working_set`` after this step's will be of ``cameras``, and this
        step's ``step`` will take ``learning_rates``: its rows may be got ready early.
        A hint: a step that goes otherwise, or an edit of the rows, voids it."""
        ...

    def add_gradient(self, term: Callable[[dict[str, Tensor]], dict[str, Tensor]]) -> None:
        """Pre: ``gradients_taken``. Add ``term(parameters)``, a gradient of every row
        (of the groups it names) from their values at this step, to the step's."""
        ...

    def step(self, learning_rates: dict[str, float]) -> None:
        """Adam with the step's gradients (groups edited since then are not stepped)."""
        ...

    def bring_current(self) -> None:
        """Post: ``model``, ``optimizer`` and ``stats`` are current."""
        ...

    def rows_replaced(self) -> None:
        """Pre: the master rows were replaced (new tensors, new count)."""
        ...

    def state_dict(self) -> EngineState: ...

    def load_state_dict(self, state: EngineState) -> None: ...

    def close(self) -> None:
        """End the threads that work beside the steps (``Engine.close``)."""
        ...


class ResidentRows:
    """Every row, its Adam state and statistics on ``device``: always current."""

    def __init__(self, model: GaussianModel, batch_size: int, device: str = "cpu") -> None:
        self.device = torch.device(device)
        self.model = model.to(device=self.device).requires_grad_(True)
        self.optimizer = GaussianAdam(self.model.parameters(), batch_size)
        self.stats = zero_stats(self.model)

    def working_set(self, cameras: list[Camera]) -> WorkingSet:
        return WorkingSet(torch.arange(len(self.model), device=self.device), self.model)

    def gradients_taken(self, working: WorkingSet) -> None:
        """The gradients stay on the model's tensors."""

    def expect(self, cameras: list[Camera], learning_rates: dict[str, float]) -> None:
        """Every row is on the device already."""

    def add_gradient(self, term: Callable[[dict[str, Tensor]], dict[str, Tensor]]) -> None:
        params = self.model.parameters()
        for name, grad in term(params).items():
            param = params[name]
            param.grad = grad if param.grad is None else param.grad + grad

    def step(self, learning_rates: dict[str, float]) -> None:
        self.optimizer.step(learning_rates)
        self.optimizer.zero_grad()

    def bring_current(self) -> None:
        """Resident rows are always current."""

    def rows_replaced(self) -> None:
        """Nothing is derived from the rows here."""

    def state_dict(self) -> EngineState:
        return rows_state(self)

    def load_state_dict(self, state: EngineState) -> None:
        load_rows_state(self, state)

    def close(self) -> None:
        """Nothing works beside the steps."""


def zero_stats(model: GaussianModel) -> densify.DensifyStats:
    return densify.DensifyStats.zeros(len(model), model.means.dtype, model.means.device)


def rows_state(rows: Rows) -> EngineState:
    """The master rows' part of the engine state, as CPU copies (rows current)."""
    def saved(t: Tensor) -> Tensor:
        return t.detach().to("cpu", copy=True)
    optimizer = rows.optimizer.state_dict()
    return {"model": {n: saved(t) for n, t in rows.model.parameters().items()},
            "sh_degree": rows.model.sh_degree,
            "optimizer": dict(optimizer, **{kind: {n: saved(t) for n, t in
                                                   optimizer[kind].items()}
                                            for kind in ("exp_avg", "exp_avg_sq")}),
            "stats": {"grad_sum": saved(rows.stats.grad_sum), "count": saved(rows.stats.count)},
            "keys": saved(rows.model.keys)}


def load_rows_state(rows: Rows, state: EngineState, home: torch.device | None = None) -> None:
    """Take ``state``'s rows as the master rows, stored on ``home`` (the rows'
    device by default)."""
    home = rows.device if home is None else home
    rows.model = GaussianModel(**{n: t.to(home, copy=True) for n, t in state["model"].items()},
                               sh_degree=state["sh_degree"],
                               keys=state["keys"].to(home, copy=True)).requires_grad_(True)
    optimizer = state["optimizer"]
    rows.optimizer.load_state_dict(dict(optimizer, **{
        kind: {n: t.to(home) for n, t in optimizer[kind].items()}
        for kind in ("exp_avg", "exp_avg_sq")}), rows.model.parameters())
    rows.stats = densify.DensifyStats(state["stats"]["grad_sum"].to(home, copy=True),
                                      state["stats"]["count"].to(home, copy=True))

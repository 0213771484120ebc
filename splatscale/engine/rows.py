"""Where the rows live: the ``Rows`` contract, and ``ResidentRows`` (all on one device).

A ``Rows`` part holds the row set of an engine (``step/row_set.py``: all the
Gaussians, or its rank's shard, with their Adam moments and the strategy's
per-row state) and the ``GaussianAdam`` that steps it. The step part of the
engine (``compute``) asks it for what a batch renders from and hands the
gradients back; everything else (the strategy's edits, moves between ranks,
checkpoints, export) acts on ``row_set`` directly, after ``bring_current``.

The offloaded rows (``offload/rows.py``) keep the same row set in host memory,
with the device holding its geometry and each step's working set.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch
from torch import Tensor

from splatscale.backends import Backend, backend_for
from splatscale.data.cameras import Camera
from splatscale.engine.state import EngineState
from splatscale.model.gaussians import GaussianModel
from splatscale.render.projection import Visibility
from splatscale.step.optimizer import GaussianAdam
from splatscale.step.row_set import MOMENTS, RowSet


@dataclass
class WorkingSet:
    """What a step renders from: master rows ``rows`` as ``model`` (leaves with
    gradient, on the compute device), their visibility where already known, and
    what gathering them measured (for the step's ``StepResult.diagnostics``)."""

    rows: Tensor
    model: GaussianModel
    visibility: Visibility | None = None
    measured: dict[str, int] = field(default_factory=dict)


class Rows(Protocol):
    """Where an engine's Gaussians live.

    ``row_set`` holds the master rows; they are current (hold what dense training
    has) after ``bring_current``, and may be edited then. Whoever edits them calls
    ``rows_edited`` after.
    """

    row_set: RowSet
    optimizer: GaussianAdam
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

    def gradients(self) -> dict[str, Tensor]:
        """Pre: ``gradients_taken``. The step's gradient of every row of the groups that
        have one, dense: zero for the rows no view saw; the rows' until ``step``,
        which may write in them after. A group the step has no gradient for (SH's
        higher bands at degree 0) is absent, or zero: Adam steps both alike."""
        ...

    def spare_gradients(self) -> list[Tensor]:
        """Buffers the next backward pass may write its gradients into
        (``render/dense_gradients.py``): nobody else's, whatever is in them."""
        ...

    def expect(self, cameras: list[Camera], learning_rates: dict[str, float]) -> None:
        """The next ``working_set`` after this step's will be of ``cameras``, and this
        step's ``step`` will take ``learning_rates``: its rows may be got ready early.
        A hint: a step that goes otherwise, or an edit of the rows, voids it."""
        ...

    def add_gradient(self, term: Callable[[dict[str, Tensor]], dict[str, Tensor]]) -> None:
        """Pre: ``gradients_taken``. Add ``term(parameters)``, a gradient of every row
        (of the groups it names) from their values at this step, to the step's. The
        tensors ``term`` returns become the rows' (a later step may write in them)."""
        ...

    def step(self, learning_rates: dict[str, float]) -> None:
        """Adam with the step's gradients (groups edited since then are not stepped)."""
        ...

    def bring_current(self) -> None:
        """Post: every row of ``row_set`` is current."""
        ...

    def rows_edited(self, replaced: bool) -> None:
        """Pre: the row set was edited after ``bring_current``: its rows ``replaced``
        (added, removed or moved), or only values of them changed."""
        ...

    def state_dict(self) -> EngineState: ...

    def load_state_dict(self, state: EngineState) -> None: ...

    def close(self) -> None:
        """End the threads that work beside the steps (``Engine.close``)."""
        ...


# A step renders from its seen rows, gathered, when they are at most this share (below
# it the gather costs less than a whole-model gradient saves: docs/benchmarks.md).
GATHER_SHARE = 0.2


class ResidentRows:
    """Every row on ``device``: always current.

    Where the backend ``gathers_seen_rows`` (the CPU's) and a batch sees at most
    ``GATHER_SHARE`` of the rows, a step renders from those rows alone, gathered:
    the backward pass makes their gradients only, and Adam's dense step reads them
    from gradient buffers of every row kept between steps (zero but for the rows a
    step writes, which it zeroes again after), so no step allocates, faults in or
    fills a gradient of the whole model. Otherwise the whole model is rendered
    (and the kept buffers, once made, stay beside its gradient). Either way it is
    the same step, bit for bit. On the CPU a whole-model step's gradients are kept
    after Adam, for the next backward to write in (``spare_gradients``)."""

    def __init__(self, model: GaussianModel, batch_size: int, device: str = "cpu",
                 backend: Backend | None = None) -> None:
        """``backend`` renders and steps Adam (None: the device's)."""
        self.device = torch.device(device)
        self.backend = backend or backend_for(self.device)
        self.row_set = RowSet(model.to(device=self.device))
        self.optimizer = GaussianAdam(GaussianModel.PARAMETERS, batch_size, backend)
        self.taken: WorkingSet | None = None  # gathered rows whose gradients ``step`` takes
        self.zero_grads: dict[str, Tensor] = {}  # by group, zero between steps
        self.spares: list[Tensor] = []  # the last whole-model step's gradients, stepped

    def working_set(self, cameras: list[Camera]) -> WorkingSet:
        model = self.row_set.model
        if not self.backend.gathers_seen_rows:
            return WorkingSet(torch.arange(len(model), device=self.device), model)
        with torch.no_grad():
            seen = self.backend.visibility(model, cameras)
            in_sight = seen.visible.any(dim=0)
            # Counted first: most steps render the whole model, and need no list of rows.
            if int(in_sight.count_nonzero()) > GATHER_SHARE * len(model):
                return WorkingSet(torch.arange(len(model), device=self.device), model, seen)
            kept = in_sight.nonzero()[:, 0]
            values = {n: t.detach().index_select(0, kept) for n, t in model.parameters().items()}
            gathered = GaussianModel(**values, sh_degree=model.sh_degree,
                                     keys=model.keys.index_select(0, kept),
                                     antialiased=model.antialiased)
        return WorkingSet(kept, gathered.requires_grad_(True), seen.of_gaussians(kept))

    def gradients_taken(self, working: WorkingSet) -> None:
        """The gradients stay on the working set's tensors (the model's, when whole)."""
        self.taken = working if working.model is not self.row_set.model else None

    def gradients(self) -> dict[str, Tensor]:
        if self.taken is None:
            return {name: p.grad for name, p in self.row_set.params.items()
                    if p.grad is not None}
        return {name: torch.zeros_like(self.row_set.params[name].detach()).index_copy_(
                    0, self.taken.rows, p.grad)
                for name, p in self.taken.model.parameters().items() if p.grad is not None}

    def expect(self, cameras: list[Camera], learning_rates: dict[str, float]) -> None:
        """Every row is on the device already."""

    def add_gradient(self, term: Callable[[dict[str, Tensor]], dict[str, Tensor]]) -> None:
        """``term``'s gradient is of every row: the gathered rows' become a dense one."""
        params = self.row_set.params
        if self.taken is not None:
            for name, grad in self.gradients().items():
                params[name].grad = grad
            self.taken = None
        for name, grad in term(params).items():
            param = params[name]
            param.grad = grad if param.grad is None else param.grad + grad

    def spare_gradients(self) -> list[Tensor]:
        spares, self.spares = self.spares, []
        return spares

    def step(self, learning_rates: dict[str, float]) -> None:
        taken, self.taken = self.taken, None
        if taken is None:
            grads = [p.grad for p in self.row_set.params.values() if p.grad is not None]
            self.optimizer.step(self.row_set, learning_rates, self.row_set.take_edited())
            # The CPU's are mapped afresh each step, else; a GPU's allocator keeps memory.
            self.spares = grads if self.device.type == "cpu" else []
            return
        lent = self._lend_gradients(taken)
        try:
            self.optimizer.step(self.row_set, learning_rates, self.row_set.take_edited())
        finally:
            for name in lent:
                self.zero_grads[name].index_fill_(0, taken.rows, 0)

    def _lend_gradients(self, taken: WorkingSet) -> list[str]:
        """The gathered rows' gradients written into the kept buffers, as the groups'
        dense gradients; the groups lent."""
        lent = []
        for name, param in self.row_set.params.items():
            grad = taken.model.parameters()[name].grad
            if grad is None:
                continue
            kept = self.zero_grads.get(name)
            if kept is None or kept.shape != param.shape or kept.dtype != param.dtype:
                self.zero_grads[name] = torch.zeros_like(param.detach())
            param.grad = self.zero_grads[name].index_copy_(0, taken.rows, grad)
            lent.append(name)
        return lent

    def bring_current(self) -> None:
        """Resident rows are always current."""

    def rows_edited(self, replaced: bool) -> None:
        """Where rows were ``replaced``, the gathered rows' gradients belong to rows
        that are gone: no group is stepped with them."""
        if replaced:
            self.taken = None
            self.spares = []

    def state_dict(self) -> EngineState:
        return rows_state(self)

    def load_state_dict(self, state: EngineState) -> None:
        load_rows_state(self, state)
        self.taken = None
        self.spares = []

    def close(self) -> None:
        """Nothing works beside the steps."""


def rows_state(rows: Rows) -> EngineState:
    """The master rows' part of the engine state, as CPU copies (rows current)."""
    def saved(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
        return {n: t.detach().to("cpu", copy=True) for n, t in tensors.items()}
    row_set = rows.row_set
    optimizer = dict(rows.optimizer.state_dict(),
                     **{kind: saved(row_set.moments[kind]) for kind in MOMENTS})
    return {"model": saved(row_set.params), "sh_degree": row_set.model.sh_degree,
            "optimizer": optimizer, "stats": saved(row_set.state),
            "keys": row_set.model.keys.to("cpu", copy=True), "densify_events": row_set.events}


def load_rows_state(rows: Rows, state: EngineState, home: torch.device | None = None) -> None:
    """Take ``state``'s rows as the master rows, stored on ``home`` (the rows'
    device by default). How they render (``GaussianModel.antialiased``) is the run's,
    which the rows already have: the state holds numbers only."""
    home = rows.device if home is None else home

    def placed(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
        return {n: t.to(home, copy=True) for n, t in tensors.items()}
    model = GaussianModel(**placed(state["model"]), sh_degree=state["sh_degree"],
                          keys=state["keys"].to(home, copy=True),
                          antialiased=rows.row_set.model.antialiased)
    rows.row_set = RowSet(model, {kind: placed(state["optimizer"][kind]) for kind in MOMENTS},
                          placed(state["stats"]), state["densify_events"])
    rows.optimizer.load_state_dict(state["optimizer"])

"""OffloadedRows (GS-Scale): every Gaussian and all optimiser state in host memory.

The device keeps 44 bytes per Gaussian (``DeviceGeometry``) and one step's
working set. A step's rows:

1. culled on the device: the Gaussians the batch may see, from the lagging
   geometry and how far each row can have drifted since it was written
   (``culling.candidates``);
2. the candidates' current values, as dense Adam has them now (``DeferredAdam``
   replays the steps a row missed, and the in-flight update is forwarded):
   their geometry and opacity first, for ``project``'s exact test on the
   device, then, while the device tests, their other parameters, sent too;
3. the visible rows, taken on the device, where the engine's compute part
   renders them, takes the loss and runs the backward pass;
4. the gradients come back; the host Adam updates the visible rows and the
   rows about to fall ``MAX_SKIPPED_STEPS`` behind, in a worker thread while the
   device starts the next step (``pipeline``), or at once without forwarding.

Told the next batch (``expect``), the rows look a step ahead (``lookahead``):
step 1 culls the next batch too, and before the gradients come back the
values of its candidates that this step leaves alone are computed and sent;
the next step computes only the rest.

The master row set has the resident rows' layout, so the strategy's edits,
checkpoints and export run the same code on it once every row has caught up
(``bring_current``); a checkpoint moves freely between offloaded and resident
rows.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable, Sequence

import torch
from torch import Tensor

from splatscale.data.cameras import Camera
from splatscale.engine.offload.culling import DeviceGeometry, candidates
from splatscale.engine.offload.host_adam import Allocate, DeferredAdam, host_memory
from splatscale.engine.offload.lookahead import Ahead, Expected, ValueSources
from splatscale.engine.offload.forwarding import Update, UpdatePipeline
from splatscale.engine.offload.transfers import InFlight, Transfers
from splatscale.engine.rows import WorkingSet, load_rows_state, rows_state
from splatscale.engine.state import EngineState
from splatscale.model.gaussians import GaussianModel
from splatscale.render.projection import visibility
from splatscale.step.optimizer import GaussianAdam
from splatscale.step.row_set import RowSet

GEOMETRY = ("means", "log_scales", "quats")
EXACT_TEST = (*GEOMETRY, "opacity_logits")  # what project's visibility test reads
REST = tuple(name for name in GaussianModel.PARAMETERS if name not in EXACT_TEST)


class OffloadedRows:
    def __init__(self, model: GaussianModel, batch_size: int, device: str = "cpu",
                 forwarding: bool | None = None, lookahead: bool | None = None) -> None:
        """``forwarding`` and ``lookahead`` None: on when the device is not the host's
        CPU. On a CPU the host and the device are the same cores, so overlapping their
        work only adds contention."""
        self.device = torch.device(device)
        self.transfers = Transfers(self.device)
        self.row_set = RowSet(model.to(device="cpu"))
        self.optimizer = GaussianAdam(GaussianModel.PARAMETERS, batch_size)
        on_device = not self.transfers.backend.shares_host_memory
        self.pipeline = UpdatePipeline(on_device if forwarding is None else forwarding)
        self.lookahead = on_device if lookahead is None else lookahead
        self.expected: Expected | None = None
        self.ahead: Ahead | None = None
        self.host_adam = DeferredAdam(self.optimizer, self.row_set, len(self.row_set))
        self.geometry = self._device_geometry()
        self.pending: Update | None = None  # this step's gradients, until ``step``

    def _device_geometry(self) -> DeviceGeometry:
        """The device's copy of the master geometry; every row current."""
        model = self.row_set.model
        means, log_scales, quats = (getattr(model, n).detach().to(self.device, copy=True)
                                    for n in GEOMETRY)
        return DeviceGeometry(means, log_scales, quats,
                              torch.full((len(model),), self.host_adam.step_count,
                                         dtype=torch.int32, device=self.device))

    # -- one step ----------------------------------------------------------------------

    def working_set(self, cameras: list[Camera]) -> WorkingSet:
        """The visible rows, on the device their current values (with gradient), and
        their visibility: the cull (or the one made a step early, ``lookahead``), the
        forwarded values, the exact test. The candidates' other values are computed on
        the host and copied up while the device tests them (the cull keeps few the
        test drops)."""
        ahead, self.ahead = self.ahead, None
        ahead = ahead if ahead is not None and ahead.serves(cameras) else None
        rows = ahead.candidates if ahead is not None else self.candidates(cameras)
        sources = ValueSources(rows, ahead, self.transfers.upload)
        sent = self._send(sources.fresh_rows, EXACT_TEST).ready()
        tested = sources.taken(sent)
        antialiased = self.row_set.model.antialiased  # the exact test is the model's
        seen = visibility(SimpleNamespace(**tested, antialiased=antialiased), cameras)
        rest = self._send(sources.fresh_rows, REST)
        self.ahead = self._look_ahead()  # its cull queued behind the test
        kept = seen.visible.any(dim=0).nonzero()[:, 0]
        rest_sent = rest.ready()
        values = {**{n: t[kept] for n, t in tested.items()}, **sources.taken(rest_sent, kept)}
        kept_rows = kept.cpu()
        sent_bytes = sum(t.nbytes for part in (sent, rest_sent) for n, t in part.items()
                         if n != "keys")
        measured = {"host_to_device_bytes": sent_bytes,
                    "candidates": len(rows), "visible": len(kept),
                    "sent_a_step_early": int(sources.early[kept_rows].sum())}
        model = GaussianModel(**values, sh_degree=self.row_set.model.sh_degree,
                              antialiased=antialiased)
        return WorkingSet(rows[kept_rows], model.requires_grad_(True), seen.of_gaussians(kept),
                          measured)

    def _send(self, rows: Tensor, names: Sequence[str]) -> InFlight:
        """Groups ``names`` of ``rows`` (and, with the exact test's, their keys) computed
        into staging buffers and sent."""
        values = self.current(rows, names, self.transfers.staging)
        if "means" in names:
            values["keys"] = self.row_set.model.keys[rows]
        return self.transfers.send(values)

    def candidates(self, cameras: list[Camera], adam: DeferredAdam | None = None) -> Tensor:
        """Rows the batch may see, by the device's lagging geometry and how far ``adam``
        (by default the host Adam; or a forecast of it) says each can have moved."""
        adam = adam or self.host_adam
        since = self.geometry.updated_at.cpu().to(torch.int64)
        maybe = candidates(self.geometry.means, self.geometry.log_scales,
                           self.transfers.upload(adam.reach("means", since)),
                           self.transfers.upload(adam.reach("log_scales", since)),
                           cameras)
        return maybe.nonzero()[:, 0].cpu()

    def expect(self, cameras: list[Camera], learning_rates: dict[str, float]) -> None:
        if self.lookahead:
            self.expected = Expected(cameras, learning_rates)

    def _look_ahead(self) -> Ahead | None:
        """The expected next step's candidates, culled now."""
        expected, self.expected = self.expected, None
        if expected is None:
            return None
        forecast = self.host_adam.forecast(expected.learning_rates)
        return Ahead(expected.cameras, forecast,
                     self.candidates(expected.cameras, forecast.adam))

    def gradients_taken(self, working: WorkingSet) -> None:
        grads = self.transfers.download({n: p.grad if p.grad is not None else torch.zeros_like(p)
                                         for n, p in working.model.parameters().items()})
        if self.ahead is not None:
            self._send_ahead(self.ahead, working.rows)
        self.pending = Update(working.rows, grads.ready())

    def spare_gradients(self) -> list[Tensor]:
        """None: the working set's gradients are downloaded to the host, where Adam is."""
        return []

    def gradients(self) -> dict[str, Tensor]:
        update = self.pending
        assert update is not None, "gradients follow gradients_taken"
        count = len(self.row_set)
        return {name: grad.new_zeros((count, *grad.shape[1:])).index_copy_(0, update.rows, grad)
                for name, grad in update.grads.items()}

    def _send_ahead(self, ahead: Ahead, seen: Tensor) -> None:
        """While the device runs the backward pass: the next step's candidates that
        this step does not see, as they will be after it, sent."""
        self._settle()  # the forecast replays from the rows the step before updated
        rows = ahead.candidates[~torch.isin(ahead.candidates, seen)]
        values = ahead.forecast.adam.advance(rows, staging=self.transfers.staging).params
        values["keys"] = self.row_set.model.keys[rows]
        ahead.sent, ahead.values = rows, self.transfers.send(values)

    def current(self, rows: Tensor, names: Sequence[str] | None = None,
                staging: Allocate = host_memory) -> dict[str, Tensor]:
        """``rows`` of groups ``names`` (None: all) as dense training has them now, in
        ``staging``'s tensors; the master arrays untouched."""
        params = self.row_set.model.parameters()
        like = {name: params[name] for name in (params if names is None else names)}
        return self.host_adam.advance(rows, self.pipeline.gradients_for(rows, like), names,
                                      staging).params

    def step(self, learning_rates: dict[str, float]) -> None:
        self._settle()
        update, self.pending = self.pending, None
        groups = set(GaussianModel.PARAMETERS) - self.row_set.take_edited()
        self.host_adam.log_step(learning_rates, groups if update is not None else set())
        if self.ahead is not None:
            self.ahead.confirmed = self.host_adam.foresaw(self.ahead.forecast)
        if update is None:
            return
        update = self._with_overdue(update)
        if self.pipeline.forwarding:
            self.pipeline.submit(update, self.host_adam.advance)
        else:
            self.host_adam.update(update.rows, update.grads)
            self._refresh_geometry(update.rows)

    def add_gradient(self, term: Callable[[dict[str, Tensor]], dict[str, Tensor]]) -> None:
        """A gradient of every row: the step updates every row (none is deferred, and
        none is known a step early)."""
        self.ahead = None
        every = torch.arange(len(self.row_set.model))
        extra, update = term(self.current(every)), self.pending
        assert update is not None, "add_gradient follows gradients_taken"
        grads = {}
        for name, grad in update.grads.items():
            grads[name] = torch.zeros((len(every), *grad.shape[1:]), dtype=grad.dtype)
            grads[name][update.rows] = grad
            if name in extra:
                grads[name] += extra[name]
        self.pending = Update(every, grads)

    def _with_overdue(self, update: Update) -> Update:
        """``update`` and the rows that must not fall further behind (zero gradient)."""
        rows = torch.cat([update.rows, self.host_adam.overdue()]).unique()
        position = torch.searchsorted(rows, update.rows)
        grads = {}
        for name, grad in update.grads.items():
            grads[name] = torch.zeros((len(rows), *grad.shape[1:]), dtype=grad.dtype)
            grads[name][position] = grad
        return Update(rows, grads)

    def _refresh_geometry(self, rows: Tensor) -> None:
        """The device's geometry of ``rows``, just made current on the host."""
        on_device = self.transfers.upload(rows)
        for name in GEOMETRY:
            getattr(self.geometry, name).index_copy_(
                0, on_device,
                self.transfers.upload(getattr(self.row_set.model, name).detach()[rows]))
        self.geometry.updated_at[on_device] = self.host_adam.step_count

    def _settle(self) -> None:
        """The in-flight update written to the host arrays and the device geometry."""
        advanced = self.pipeline.settle()
        if advanced is not None:
            self.host_adam.write(advanced)
            self._refresh_geometry(advanced.rows)

    # -- the rest of the contract ----------------------------------------------------------

    def bring_current(self) -> None:
        """Every row current in the master arrays (and the device geometry). The rows
        may be edited next: what was sent a step early is dropped."""
        self.ahead = self.expected = None
        self._settle()
        self._refresh_geometry(self.host_adam.catch_up_all())

    def rows_edited(self, replaced: bool) -> None:
        """Every row is current (``bring_current`` came first). The device's geometry
        is taken again; where rows were ``replaced``, the step's gradients belong to
        rows that are gone, so no group is stepped with them."""
        if replaced:
            self.host_adam.resized(len(self.row_set))
            self.pending = None
        self.geometry = self._device_geometry()

    def state_dict(self) -> EngineState:
        return rows_state(self)

    def load_state_dict(self, state: EngineState) -> None:
        self.ahead = self.expected = None
        self._settle()
        load_rows_state(self, state, home=torch.device("cpu"))
        self.host_adam = DeferredAdam(self.optimizer, self.row_set, len(self.row_set))
        self.geometry = self._device_geometry()

    def close(self) -> None:
        """The forwarding worker ends; an update it was computing is kept for
        ``bring_current`` to write."""
        self.pipeline.close()

    def memory_per_gaussian(self) -> dict[str, int]:
        """Persistent bytes per Gaussian: on the device, and in host memory."""
        host = sum(t[0].nbytes for t in (*self.row_set.tensors().values(),
                                          self.host_adam.updated_at))
        return {"device": self.geometry.nbytes_per_gaussian(), "host": host}

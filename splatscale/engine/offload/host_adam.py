"""Adam in host memory that touches a row only when the row is needed.

Dense Adam (``step/optimizer.py``) moves every row every step: a row with no
gradient still decays its moments and moves by its momentum. Here a row that
a step did not see is left alone and remembers the step it is current at
(``updated_at``); when it is next needed it replays the steps it missed, one
by one with each step's own learning rate and bias correction, in one pass
over the row (``adam_kernels.adam_replay``). These are dense Adam's
operations on zero gradients, eps included, by the very code of the dense
step: no closed form approximates anything, and a deferred row ends bit for
bit where dense Adam would have taken it.

The replay is pure: it reads the master arrays and writes the advanced rows
elsewhere, so the parameter-forwarding pipeline can compute a row's next
values while a worker thread computes the same rows for the master copy.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from splatscale.step.adam_kernels import adam_constants, adam_replay
from splatscale.step.optimizer import AdamRows, GaussianAdam, step_factors

# A row is caught up when it would otherwise fall this many steps behind.
MAX_SKIPPED_STEPS = 15
# |m| / sqrt(v) of any gradient sequence is at most
# (1 - b1) / sqrt(1 - b2) / sqrt(1 - b1^2 / b2) (Cauchy-Schwarz on the two sums).
_SAFETY = 1.001  # float32 moments round; the bound must still hold


class StepLog:
    """What each global step did to one parameter group (index 0: before any step):
    whether it took an Adam step, its -lr / (1 - beta1^t) and sqrt(1 - beta2^t), and
    the running sum of the largest move a step can make per coordinate. Kept in
    arrays that grow by doubling, so a step costs the same at step 30,000 as at 1."""

    def __init__(self) -> None:
        self.count = 1
        self._table = np.zeros((4, 64))  # stepped, scale, root_bias2, reach
        self._table[2, 0] = 1.0

    def append(self, stepped: bool, scale: float, root_bias2: float, move: float) -> None:
        self._write(stepped, scale, root_bias2, move)
        self.count += 1

    def with_next(self, stepped: bool, scale: float, root_bias2: float,
                  move: float) -> StepLog:
        """This log with one step more. The step is written into this log's next
        column, which the next ``append`` overwrites with the step taken: the log
        returned holds until then."""
        self._write(stepped, scale, root_bias2, move)
        ahead = copy.copy(self)
        ahead.count += 1
        return ahead

    def last(self) -> tuple[float, ...]:
        """The latest step's entry."""
        return tuple(self._table[:, self.count - 1].tolist())

    def _write(self, stepped: bool, scale: float, root_bias2: float, move: float) -> None:
        """The entry of step ``count``."""
        if self.count == self._table.shape[1]:
            self._table = np.concatenate([self._table, np.zeros_like(self._table)], axis=1)
        column = self._table[:, self.count]
        column[:] = stepped, scale, root_bias2, self._table[3, self.count - 1] + move

    def arrays(self, dtype: np.dtype) -> tuple[np.ndarray, ...]:
        """The replay kernel's tables: stepped, scale and root_bias2 (in ``dtype``)."""
        stepped, scale, root_bias2 = self._table[:3, :self.count]
        return stepped.astype(np.bool_), scale.astype(dtype), root_bias2.astype(dtype)

    def reach(self) -> Tensor:
        return torch.from_numpy(self._table[3, :self.count])


Allocate = Callable[[tuple[int, ...], torch.dtype], Tensor]


def host_memory(shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    """An empty tensor in ordinary host memory (the default ``Allocate``)."""
    return torch.empty(shape, dtype=dtype)


@dataclass
class Advanced:
    """Rows of every parameter group and their moments after advancing."""

    rows: Tensor
    params: dict[str, Tensor]
    exp_avg: dict[str, Tensor]
    exp_avg_sq: dict[str, Tensor]


@dataclass
class Forecast:
    """A ``DeferredAdam`` as it will be after the next step (``adam``), and each group's
    log entry it foresaw for that step."""

    adam: DeferredAdam
    foreseen: dict[str, tuple[float, ...]]


class DeferredAdam:
    """The host half of the offload engine's optimiser: Adam's bookkeeping (``adam``,
    whose step counts it advances), the rows it steps (``rows``: the row set, whose
    edits it sees as they are made), each row's ``updated_at`` global step, and a
    log of every step's hyperparameters."""

    def __init__(self, adam: GaussianAdam, rows: AdamRows, count: int) -> None:
        self.adam = adam
        self.rows = rows
        self.step_count = 0
        self.updated_at = torch.zeros(count, dtype=torch.int64)
        self.logs = {name: StepLog() for name in adam.steps}
        hyper = adam.decay
        self.ratio_bound = _SAFETY * (1 - hyper.beta1) / math.sqrt(
            (1 - hyper.beta2) * (1 - hyper.beta1 ** 2 / hyper.beta2))

    def log_step(self, learning_rates: dict[str, float], stepped: set[str]) -> None:
        """Count a global step; groups in ``stepped`` take an Adam step in it."""
        self.step_count += 1
        for name, log in self.logs.items():
            took = name in stepped
            t = self.adam.count_step(name) if took else self.adam.steps[name]
            log.append(*self._entry(learning_rates[name], t, took))

    def _entry(self, lr: float, t: int, took: bool) -> tuple[bool, float, float, float]:
        """A step's log entry: its Adam step ``t`` taken with ``lr``, or none."""
        if not took:
            return False, 0.0, 1.0, 0.0
        h = self.adam.hyper(lr)
        scale, root_bias2 = step_factors(h, t)
        return True, scale, root_bias2, h.lr * root_bias2 / (1 - h.beta1 ** t) * self.ratio_bound

    def forecast(self, learning_rates: dict[str, float]) -> Forecast:
        """This optimiser as it will be once the next step is logged, if every group
        steps in it with ``learning_rates``: what it says of a row that step gives no
        gradient (``advance``, ``reach``) holds then. It shares the master arrays and
        ``updated_at``, and holds until the next ``log_step``; ``foresaw`` says whether
        that step went as forecast."""
        ahead = copy.copy(self)
        ahead.step_count += 1
        ahead.logs = {name: log.with_next(*self._entry(learning_rates[name],
                                                       self.adam.steps[name] + 1, True))
                      for name, log in self.logs.items()}
        return Forecast(ahead, {name: log.last() for name, log in ahead.logs.items()})

    def foresaw(self, forecast: Forecast) -> bool:
        """Whether the latest logged step is the one ``forecast`` foresaw."""
        return forecast.adam.step_count == self.step_count and all(
            log.last() == forecast.foreseen[name] for name, log in self.logs.items())

    def reach(self, name: str, since: Tensor) -> Tensor:
        """How far any coordinate of group ``name`` can have moved since steps ``since``."""
        table = self.logs[name].reach()
        return table[-1] - table[since]

    def advance(self, rows: Tensor, grads: dict[str, Tensor] | None = None,
                names: Sequence[str] | None = None, staging: Allocate = host_memory) -> Advanced:
        """Rows ``rows`` of groups ``names`` (None: every group) as dense Adam has
        them after the latest logged step, whose gradient (absent: zero) is ``grads``;
        the master arrays are only read. The new parameter values are written into
        ``staging(shape, dtype)``'s tensors."""
        out = Advanced(rows, {}, {}, {})
        for name in self.rows.params if names is None else names:
            param = self.rows.params[name]
            shape = (len(rows), *param.shape[1:])
            new = [staging(shape, param.dtype), host_memory(shape, param.dtype),
                   host_memory(shape, param.dtype)]
            self._replay(name, rows, grads, new, torch.arange(len(rows)))
            out.params[name], out.exp_avg[name], out.exp_avg_sq[name] = new
        return out

    def update(self, rows: Tensor, grads: dict[str, Tensor] | None = None) -> None:
        """``advance`` written straight into the master arrays: the rows are current."""
        moments = self.rows.moments
        for name, param in self.rows.params.items():
            self._replay(name, rows, grads, [param.detach(), moments["exp_avg"][name],
                                             moments["exp_avg_sq"][name]], rows)
        self.updated_at[rows] = self.step_count

    def _replay(self, name: str, rows: Tensor, grads: dict[str, Tensor] | None,
                out: list[Tensor], targets: Tensor) -> None:
        param = self.rows.params[name]
        moments = self.rows.moments
        width = param[0].numel()
        as_rows = lambda t: t.detach().reshape(len(t), width).numpy()  # noqa: E731 - views
        grad = (grads[name] if grads is not None
                else torch.zeros((len(rows), *param.shape[1:]), dtype=param.dtype))
        master = [as_rows(t) for t in (param, moments["exp_avg"][name],
                                       moments["exp_avg_sq"][name])]
        h, dtype = self.adam.decay, master[0].dtype
        adam_replay(*master, rows.numpy(), self.updated_at[rows].numpy(),
                    as_rows(grad.contiguous()), self.step_count, *self.logs[name].arrays(dtype),
                    adam_constants(h.beta1, h.beta2, h.eps, dtype), *(as_rows(t) for t in out),
                    targets.numpy())

    @torch.no_grad()
    def write(self, advanced: Advanced) -> None:
        """Store advanced rows in the master arrays: they are current now."""
        moments = self.rows.moments
        for name, param in self.rows.params.items():
            param.index_copy_(0, advanced.rows, advanced.params[name])
            moments["exp_avg"][name].index_copy_(0, advanced.rows, advanced.exp_avg[name])
            moments["exp_avg_sq"][name].index_copy_(0, advanced.rows, advanced.exp_avg_sq[name])
        self.updated_at[advanced.rows] = self.step_count

    def overdue(self) -> Tensor:
        """Rows that would fall more than ``MAX_SKIPPED_STEPS`` behind at the next step."""
        return (self.updated_at <= self.step_count - MAX_SKIPPED_STEPS).nonzero()[:, 0]

    def catch_up_all(self) -> Tensor:
        """Every row current; the rows that were behind."""
        behind = (self.updated_at < self.step_count).nonzero()[:, 0]
        self.update(behind)
        return behind

    def resized(self, rows: int) -> None:
        """After an edit that replaced rows (every row caught up first): all current."""
        self.updated_at = torch.full((rows,), self.step_count, dtype=torch.int64)

"""Parameter forwarding: the host update of step t overlaps the device's step t+1.

``submit`` hands step t's rows and gradients to a worker thread, which
computes their new values from the master arrays without writing them.
Meanwhile step t+1 asks for the values its rows will have after that update:
``gradients_for`` gives each row the gradient the worker is applying to it (or
none), and ``DeferredAdam.advance`` computes the same values from the same
inputs, so the device sees what sequential training would show it. Nothing
writes the master arrays while the worker reads them: ``settle`` waits for the
worker and returns the rows for the caller to write. The worker thread starts
with the first ``submit`` and ends with ``close``.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from splatscale.engine.offload.host_adam import Advanced


@dataclass
class Update:
    """Rows a step updates (sorted) and the gradient of each, by parameter group."""

    rows: Tensor
    grads: dict[str, Tensor]


class UpdatePipeline:
    def __init__(self, forwarding: bool) -> None:
        self.forwarding = forwarding
        self.worker = ThreadPoolExecutor(1, "host-adam") if forwarding else None
        self.in_flight: tuple[Update, Future] | None = None

    def submit(self, update: Update, advance: Callable[[Tensor, dict], Advanced]) -> None:
        """Compute ``advance(update)`` in the worker until ``settle``. Pre: forwarding."""
        assert self.worker is not None, "submit is for a pipeline that forwards"
        self.in_flight = update, self.worker.submit(advance, update.rows, update.grads)

    def gradients_for(self, rows: Tensor, like: dict[str, Tensor]) -> dict[str, Tensor] | None:
        """The in-flight step's gradient of each of ``rows`` (zero for rows it does not
        update), for the groups of ``like``; None when nothing is in flight."""
        if self.in_flight is None:
            return None
        update = self.in_flight[0]
        if len(update.rows) == 0:
            return {name: torch.zeros((len(rows), *t.shape[1:]), dtype=t.dtype)
                    for name, t in like.items()}
        position = torch.searchsorted(update.rows, rows).clamp_max(len(update.rows) - 1)
        found = update.rows[position] == rows
        out = {}
        for name in like:
            grad = update.grads[name]
            rows_grad = torch.zeros((len(rows), *like[name].shape[1:]), dtype=grad.dtype)
            rows_grad[found] = grad[position[found]]
            out[name] = rows_grad
        return out

    def settle(self) -> Advanced | None:
        """Wait for the in-flight update; its rows, for the caller to write."""
        if self.in_flight is None:
            return None
        advanced = self.in_flight[1].result()
        self.in_flight = None
        return advanced

    def close(self) -> None:
        """The worker ends once the in-flight update is computed (``settle`` still
        returns it); no update may be submitted after."""
        if self.worker is not None:
            self.worker.shutdown(wait=True)

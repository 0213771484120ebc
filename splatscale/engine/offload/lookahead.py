"""Looking one step ahead: the next batch's rows that this step leaves alone.

A step updates the rows it sees (and, with no gradient, the rows about to fall
behind); the value any other row will have after it is known before the step's
gradients are: dense Adam moves such a row by its momentum alone. So when the
caller says which cameras come next and this step's learning rates
(``Rows.expect``), the offloaded rows cull the next batch at the start of this
step, by the same lagging geometry and a drift bound one step longer
(``DeferredAdam.forecast``); and while the device runs this step's backward
pass, the host computes the values of those candidates that this step does not
see and sends them. The next step takes them if this one went as forecast (the
same learning rates, every group stepped) and its cameras are those expected,
and computes only the rest. Whatever edits the rows in between drops them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from splatscale.data.cameras import Camera
from splatscale.engine.offload.host_adam import Forecast
from splatscale.engine.offload.transfers import InFlight


@dataclass
class Expected:
    """What the caller said of the next step: its cameras, and the learning rates of
    the step under way."""

    cameras: list[Camera]
    learning_rates: dict[str, float]


@dataclass
class Ahead:
    """The next step's candidates, culled a step early, and the values of those the
    step under way does not see, once sent."""

    cameras: list[Camera]
    forecast: Forecast
    candidates: Tensor             # sorted rows
    sent: Tensor | None = None     # the candidates whose values are in flight (sorted)
    values: InFlight | None = None
    confirmed: bool = False        # the step under way was logged as forecast

    def serves(self, cameras: list[Camera]) -> bool:
        """Whether these are the candidates, with values, of a step with ``cameras``."""
        return (self.confirmed and self.values is not None and len(cameras) == len(self.cameras)
                and all(same_view(a, b) for a, b in zip(cameras, self.cameras)))


def same_view(a: Camera, b: Camera) -> bool:
    """Whether ``a`` and ``b`` see the same: one camera, or equal in every field."""
    return a is b or ((a.width, a.height, a.model) == (b.width, b.height, b.model)
                      and torch.equal(a.viewmat, b.viewmat) and torch.equal(a.K, b.K))


class ValueSources:
    """Where the values of a step's candidates come from: sent now (``fresh_rows``)
    and, looking ahead, sent a step early. Which row is where is kept on the host;
    only index tensors go to the device, so that taking rows there does not make the
    host wait for it."""

    def __init__(self, rows: Tensor, ahead: Ahead | None,
                 upload: Callable[[Tensor], Tensor]) -> None:
        self.early = (torch.zeros(len(rows), dtype=torch.bool)
                      if ahead is None or ahead.sent is None else torch.isin(rows, ahead.sent))
        self.fresh_rows = rows[~self.early]
        self._sent_early = None if ahead is None else ahead.values
        self._upload = upload
        self._index = torch.empty(len(rows), dtype=torch.int64)  # each row's, in its part
        self._index[self.early] = torch.arange(len(rows) - len(self.fresh_rows))
        self._index[~self.early] = torch.arange(len(self.fresh_rows))

    def taken(self, fresh: dict[str, Tensor], positions: Tensor | None = None
              ) -> dict[str, Tensor]:
        """Rows ``positions`` (indices into the candidates, on the device; None: all) of
        each group ``fresh`` (the values sent now, on the device) has."""
        if self._sent_early is None:
            return fresh if positions is None else {n: t[positions] for n, t in fresh.items()}
        positions = torch.arange(len(self.early)) if positions is None else positions.cpu()
        early = self.early[positions]
        parts = (early, ~early)
        # For each part, where its rows go and where they are in it: one upload.
        indices = [i for part in parts
                   for i in (part.nonzero()[:, 0], self._index[positions[part]])]
        into_early, of_early, into_fresh, of_fresh = self._upload(torch.cat(indices)).split(
            [len(i) for i in indices])
        sent_early, taken = self._sent_early.ready(), {}
        for name, values in fresh.items():
            rows = values.new_empty((len(positions), *values.shape[1:]))
            rows.index_copy_(0, into_early, sent_early[name].index_select(0, of_early))
            rows.index_copy_(0, into_fresh, values.index_select(0, of_fresh))
            taken[name] = rows
        return taken

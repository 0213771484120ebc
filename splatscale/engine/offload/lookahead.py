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

import torch
from torch import Tensor

from splatscale.data.cameras import Camera
from splatscale.engine.offload.host_adam import DeferredAdam
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
    forecast: DeferredAdam
    candidates: Tensor             # sorted rows
    sent: Tensor | None = None     # the candidates whose values are in flight (sorted)
    values: InFlight | None = None

    def serves(self, cameras: list[Camera]) -> bool:
        """Whether these are the candidates, with values, of a step with ``cameras``."""
        return self.values is not None and len(cameras) == len(self.cameras) and all(
            same_view(a, b) for a, b in zip(cameras, self.cameras))


def same_view(a: Camera, b: Camera) -> bool:
    return a is b or ((a.width, a.height) == (b.width, b.height)
                      and torch.equal(a.viewmat, b.viewmat) and torch.equal(a.K, b.K))


def merged(early: Tensor, sent_early: InFlight, sent: InFlight) -> dict[str, Tensor]:
    """Rows in order, on the device: where ``early`` (bool, on the device) is set from
    ``sent_early``'s, elsewhere from ``sent``'s, each in the order of the rows (every
    group ``sent`` has)."""
    earlier, now = sent_early.ready(), sent.ready()
    whole = {}
    for name, values in now.items():
        rows = values.new_empty((len(early), *values.shape[1:]))
        rows[early] = earlier[name]
        rows[~early] = values
        whole[name] = rows
    return whole

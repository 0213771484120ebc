"""What a step saw of the rows, and the contracts of those a step serves: the record
the engine hands a strategy after each backward pass (``Seen``), the strategy as
its ``Observer``, and a loss term over every Gaussian (``GradientTerm``).

They sit below both the engines, which fill them in, and the strategies, which
read them, so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from torch import Tensor

from splatscale.step.row_set import RowSet


@dataclass
class SeenView:
    """One view of a step, as its backward pass saw the rows: the master row of each
    Gaussian it saw, d loss / d means2d of each (the batch's loss, averaged over its
    views) and, when the observer asked for it, gsplat's ``absgrad``: the sum over
    pixels of that gradient's absolute value, pixel by pixel."""

    rows: Tensor            # [M] int64
    means2d_grad: Tensor    # [M, 2]
    absgrad: Tensor | None  # [M, 2]
    width: int
    height: int


@dataclass
class Seen:
    """What one step saw: its views, in batch order."""

    views: list[SeenView]


class Observer(Protocol):
    """Told what each step saw, to keep per-row state."""

    absgrad: bool  # whether it reads ``SeenView.absgrad`` (the renderer computes it)

    def observe(self, rows: RowSet, seen: Seen) -> None: ...


class GradientTerm(Protocol):
    """A term of the loss over every Gaussian, whose gradient the engine adds."""

    def gradients(self, params: dict[str, Tensor], count: int) -> dict[str, Tensor]:
        """Its gradient with respect to ``params``' rows, of ``count`` Gaussians in all."""
        ...

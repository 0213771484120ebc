"""What a pixel row costs a rank: ``a`` per pixel plus ``b`` per tile intersection.

The partition needs only the ratio of ``a`` to ``b``. Fixed coefficients keep
the cut a function of the workload alone (runs repeat bitwise); fitted ones
follow the machine: every step each rank reports the pixels and intersections
it rendered and the seconds it took, all ranks receive every report, and each
fits the same least-squares line through the last ``WINDOW`` reports.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

# Until enough reports arrive: relative costs measured with bench/render.py on
# a 2-core CPU, in units of one intersection (one splat over one tile, both passes).
DEFAULT_PIXEL_COST = 0.05
DEFAULT_INTERSECTION_COST = 1.0
WINDOW = 64        # reports the fit uses: the latest, so it follows a changing scene
MIN_REPORTS = 8    # fewer leave the coefficients as they are


@dataclass(frozen=True)
class RowCost:
    pixel: float = DEFAULT_PIXEL_COST
    intersection: float = DEFAULT_INTERSECTION_COST


class FittedRowCost:
    """Coefficients fitted to (pixels, intersections, seconds) reports."""

    def __init__(self, start: RowCost = RowCost()) -> None:
        self.current = start
        self.reports: deque[tuple[float, float, float]] = deque(maxlen=WINDOW)

    def add(self, reports: torch.Tensor) -> None:
        """Rows of (pixels, intersections, seconds); a rank that rendered nothing says
        nothing about the coefficients and is left out."""
        self.reports.extend((float(r[0]), float(r[1]), float(r[2])) for r in reports
                            if r[0] > 0 and r[2] > 0)
        if len(self.reports) >= MIN_REPORTS:
            self.current = _fit(torch.tensor(list(self.reports), dtype=torch.float64),
                                self.current)


def _fit(reports: torch.Tensor, previous: RowCost) -> RowCost:
    """Least squares on relative errors (each report divided by its time), so a long
    step does not outweigh the others; a fit that gives a cost below zero is noise
    dominating a badly conditioned window, and the previous coefficients stay."""
    pixels, intersections, seconds = reports.unbind(1)
    design = torch.stack([pixels, intersections], 1) / seconds[:, None]
    solution = torch.linalg.lstsq(design, torch.ones_like(seconds)[:, None]).solution[:, 0]
    pixel, intersection = solution.tolist()
    if pixel <= 0 or intersection <= 0:
        return previous
    return RowCost(pixel, intersection)

"""Schedules counted in images seen, so changing the batch size keeps them."""

from __future__ import annotations

import math


def scaled_images(images: int, factor: float) -> int:
    """A schedule of ``images`` made ``factor`` times as long: at least one image."""
    return max(1, round(images * factor))


def position_lr(image: int, lr_init: float, lr_final: float, max_steps: int) -> float:
    """3DGS's log-linear decay from lr_init to lr_final over ``max_steps`` images."""
    if lr_init == lr_final == 0:
        return 0.0
    t = min(max(image / max_steps, 0.0), 1.0)
    return math.exp((1 - t) * math.log(lr_init) + t * math.log(lr_final))


def crosses(images_before: int, images_after: int, interval: int) -> bool:
    """Whether a multiple of ``interval`` lies in the batch's window (before, after]."""
    return interval > 0 and images_after // interval > images_before // interval


def crossed_multiple(images_before: int, images_after: int, interval: int) -> int | None:
    """The largest multiple of ``interval`` in (before, after], if any."""
    if not crosses(images_before, images_after, interval):
        return None
    return images_after // interval * interval

"""What a step's backward pass saw of the rows, gathered for the strategy's observer."""

from __future__ import annotations

import torch
from torch import Tensor

from splatscale.engine.rows import Rows, WorkingSet
from splatscale.render import Splats
from splatscale.step.observer import Observer, Seen, SeenView


def watch(splats: Splats, observer: Observer | None) -> None:
    """Before the backward pass: keep the gradients ``observer`` reads (the 2D means',
    and with ``observer.absgrad`` their absolute per-pixel sums)."""
    if observer is None:
        return
    splats.means2d.retain_grad()
    if observer.absgrad:
        splats.absgrad = torch.zeros_like(splats.means2d.detach()).requires_grad_(True)


def tell(observer: Observer | None, rows: Rows, working: WorkingSet, splats: Splats) -> None:
    """After the backward pass: ``observer`` observes what each view saw, by master row
    (on every rank, whatever it saw, so that every rank's row set holds the same state)."""
    if observer is None:
        return
    grad = splats.means2d.grad
    if grad is None:  # nothing was visible: nothing was rendered from it
        grad = torch.zeros_like(splats.means2d.detach())
    ids = splats.gaussian_ids.to(working.rows.device)
    # The row set's own model is its master rows in order: no gather.
    master = ids if working.model is rows.row_set.model else working.rows[ids]
    absgrad = _absgrad(splats, grad) if observer.absgrad else None
    views = []
    for i, camera in enumerate(splats.cameras):
        lo, hi = splats.camera_offsets[i], splats.camera_offsets[i + 1]
        views.append(SeenView(master[lo:hi], grad[lo:hi],
                              None if absgrad is None else absgrad[lo:hi],
                              camera.width, camera.height))
    observer.observe(rows.row_set, Seen(views))


def _absgrad(splats: Splats, grad: Tensor) -> Tensor:
    """The splats' absolute per-pixel gradient sums (zero where no pixel reached them)."""
    absgrad = splats.absgrad.grad if splats.absgrad is not None else None
    return absgrad if absgrad is not None else torch.zeros_like(grad)

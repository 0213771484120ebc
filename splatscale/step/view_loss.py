"""The loss of a view, or of a band of its rows: the one path every engine takes.

One process renders each view whole: its band is every row, ``(0, H)``. Ranks
render bands of rows with SSIM's halo around them: each takes the share of the
loss that its own rows carry, divided by the whole image's size, so the ranks'
shares add up to the single process' loss, and its rows' squared error, so
their sums give the view's PSNR.

A per-pixel statistic of the gradient (AbsGS's sum of absolute values) needs
each pixel's gradient whole, in one place: a halo pixel's gradient is split
between the bands that render it. ``whole_pixels`` asks for it: the band is
rendered with twice SSIM's halo, the gradient at each own pixel is the whole
image loss's (every SSIM window that covers it), and the halo's is zero.

A target with a mask (a fourth channel: ``step/loss.py``'s ``photometric_loss``)
counts its masked-in pixels alone, so a band's share is divided by the whole
image's masked-in values (``masked_in_values``): ranks sum their own rows' counts
before any of them forms its share.
"""

from __future__ import annotations

import torch
from torch import Tensor

from splatscale.step.loss import masked_squared_error_sum, photometric_loss, split_mask
from splatscale.step.ssim import RADIUS

HALO = RADIUS  # rows beyond a band that SSIM's window reads


def masked_in_values(target: Tensor, rows: tuple[int, int] | None = None) -> int:
    """The values the loss counts in rows ``[y0, y1)`` of ``target`` (all rows: None):
    3 per pixel, every pixel, or the masked-in pixels of a target with a mask."""
    y0, y1 = rows or (0, target.shape[0])
    _, mask = split_mask(target)
    if mask is None:
        return 3 * (y1 - y0) * target.shape[1]
    return 3 * int(mask[y0:y1].sum())


def band_loss(rgb: Tensor, target: Tensor, own: tuple[int, int], elements: int,
              ssim_weight: float, whole_pixels: bool = False) -> tuple[Tensor, float]:
    """The loss share of rows ``own`` (of the rendered rows ``rgb`` [h, W, 3], whose
    others are halo) in an image of ``elements`` values, against ``target`` (the same
    rows), and the own rows' summed squared error (the image clamped to [0, 1]).
    A target with a mask (a fourth channel, ``photometric_loss``) counts only its
    masked-in pixels: ``elements`` is then the whole image's masked-in values.

    With ``whole_pixels`` (``rgb`` holds ``2 HALO`` rows beyond ``own``, or the
    image's edge), the share's gradient is the whole image loss's at the own rows
    and zero elsewhere; its value is the share's still."""
    loss = photometric_loss(rgb, target, ssim_weight, rows=own, count=elements)
    error = masked_squared_error_sum(rgb.detach()[own[0]:own[1]], target[own[0]:own[1]])
    if whole_pixels:
        reach = (max(0, own[0] - HALO), min(rgb.shape[0], own[1] + HALO))
        covering = photometric_loss(rgb, target, ssim_weight, rows=reach, count=elements)
        grad, = torch.autograd.grad(covering, rgb, retain_graph=True)
        grad[:own[0]] = 0
        grad[own[1]:] = 0
        surrogate = (rgb * grad).sum()
        loss = loss.detach() + (surrogate - surrogate.detach())
    return loss, error

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
"""

from __future__ import annotations

import torch
from torch import Tensor

from splatscale.step.loss import photometric_loss, squared_error_sum
from splatscale.step.ssim import RADIUS

HALO = RADIUS  # rows beyond a band that SSIM's window reads


def band_loss(rgb: Tensor, target: Tensor, own: tuple[int, int], elements: int,
              ssim_weight: float, whole_pixels: bool = False) -> tuple[Tensor, float]:
    """The loss share of rows ``own`` (of the rendered rows ``rgb`` [h, W, 3], whose
    others are halo) in an image of ``elements`` values, against ``target`` (the same
    rows), and the own rows' summed squared error (the image clamped to [0, 1]).

    With ``whole_pixels`` (``rgb`` holds ``2 HALO`` rows beyond ``own``, or the
    image's edge), the share's gradient is the whole image loss's at the own rows
    and zero elsewhere; its value is the share's still."""
    loss = photometric_loss(rgb, target, ssim_weight, rows=own, count=elements)
    error = squared_error_sum(rgb.detach()[own[0]:own[1]], target[own[0]:own[1]])
    if whole_pixels:
        reach = (max(0, own[0] - HALO), min(rgb.shape[0], own[1] + HALO))
        covering = photometric_loss(rgb, target, ssim_weight, rows=reach, count=elements)
        grad, = torch.autograd.grad(covering, rgb, retain_graph=True)
        grad[:own[0]] = 0
        grad[own[1]:] = 0
        surrogate = (rgb * grad).sum()
        loss = loss.detach() + (surrogate - surrogate.detach())
    return loss, error

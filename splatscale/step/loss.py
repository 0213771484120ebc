"""The 3DGS loss, (1 - w) L1 + w (1 - SSIM), and the image metrics."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from splatscale.step.ssim import ssim


def photometric_loss(image: Tensor, target: Tensor, ssim_weight: float = 0.2,
                     rows: tuple[int, int] | None = None, count: int | None = None) -> Tensor:
    """(1 - w) L1 + w (1 - SSIM) of [h, W, 3] images.

    With ``rows`` and ``count``: the share of a band of the image, rows
    [r0, r1) of ``image`` (the rows around them are halo, read by SSIM's window
    only), of a whole image of ``count`` elements: summed over the bands that
    tile an image, these shares are the whole image's loss.
    """
    rows = rows or (0, image.shape[0])
    own = (rows[1] - rows[0]) * image.shape[1] * image.shape[2]
    count = count or own
    l1 = (image[rows[0]:rows[1]] - target[rows[0]:rows[1]]).abs().sum() / count
    # The band's share of the constant 1 in (1 - SSIM) is own / count.
    return (1 - ssim_weight) * l1 + ssim_weight * (own / count - ssim(image, target, rows, count))


def psnr(image: Tensor, target: Tensor) -> float:
    mse = torch.mean((image.clamp(0, 1) - target) ** 2).item()
    return float("inf") if mse == 0 else -10 * math.log10(mse)

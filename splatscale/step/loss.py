"""The 3DGS loss, (1 - w) L1 + w (1 - SSIM), and the image metrics."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from splatscale.step.ssim import ssim


def photometric_loss(image: Tensor, target: Tensor, ssim_weight: float = 0.2) -> Tensor:
    l1 = (image - target).abs().mean()
    return (1 - ssim_weight) * l1 + ssim_weight * (1 - ssim(image, target))


def psnr(image: Tensor, target: Tensor) -> float:
    mse = torch.mean((image.clamp(0, 1) - target) ** 2).item()
    return float("inf") if mse == 0 else -10 * math.log10(mse)

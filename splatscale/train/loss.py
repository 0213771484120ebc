"""The 3DGS loss, (1 - w) L1 + w (1 - SSIM), and the image metrics."""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

SSIM_WINDOW, SSIM_SIGMA = 11, 1.5
SSIM_C1, SSIM_C2 = 0.01 ** 2, 0.03 ** 2


@lru_cache(maxsize=8)
def _window(dtype: torch.dtype, device: str) -> Tensor:
    x = torch.arange(SSIM_WINDOW, dtype=torch.float64) - SSIM_WINDOW // 2
    g = torch.exp(-x * x / (2 * SSIM_SIGMA ** 2))
    g = g / g.sum()
    return (g[:, None] * g[None, :]).to(dtype=dtype, device=device).expand(3, 1, -1, -1)


def ssim_map(image: Tensor, target: Tensor) -> Tensor:
    """Per-pixel SSIM of [h, W, 3] images: 11x11 Gaussian window (sigma 1.5), zero padding."""
    a, b = image.permute(2, 0, 1)[None], target.permute(2, 0, 1)[None]
    window = _window(a.dtype, str(a.device))
    blur = lambda t: F.conv2d(t, window, padding=SSIM_WINDOW // 2, groups=3)  # noqa: E731
    mu_a, mu_b = blur(a), blur(b)
    var_a = blur(a * a) - mu_a * mu_a
    var_b = blur(b * b) - mu_b * mu_b
    cov = blur(a * b) - mu_a * mu_b
    numerator = (2 * mu_a * mu_b + SSIM_C1) * (2 * cov + SSIM_C2)
    denominator = (mu_a * mu_a + mu_b * mu_b + SSIM_C1) * (var_a + var_b + SSIM_C2)
    return (numerator / denominator)[0].permute(1, 2, 0)


def ssim(image: Tensor, target: Tensor) -> Tensor:
    return ssim_map(image, target).mean()


def photometric_loss(image: Tensor, target: Tensor, ssim_weight: float = 0.2) -> Tensor:
    l1 = (image - target).abs().mean()
    return (1 - ssim_weight) * l1 + ssim_weight * (1 - ssim(image, target))


def psnr(image: Tensor, target: Tensor) -> float:
    mse = torch.mean((image.clamp(0, 1) - target) ** 2).item()
    return float("inf") if mse == 0 else -10 * math.log10(mse)

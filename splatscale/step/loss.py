"""The 3DGS loss, (1 - w) L1 + w (1 - SSIM), and the image metrics.

The L1 sum and PSNR's squared error are the backend's (``splatscale.backends``):
on the CPU each is one pass of a numba kernel over the image (the L1 sum with its
gradient's signs) rather than torch's three to four full-image passes; torch's
operations elsewhere.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np
import torch
from torch import Tensor

from splatscale.backends import backend_for
from splatscale.step.ssim import ssim


@nb.njit(parallel=True, cache=True)
def _abs_difference_sum(a, b, signs):  # pragma: no cover - compiled
    """sum |a - b| over [rows, n] arrays, in float64; signs = sign(a - b)."""
    row_sums = np.zeros(a.shape[0])
    for y in nb.prange(a.shape[0]):
        total = 0.0
        for x in range(a.shape[1]):
            d = a[y, x] - b[y, x]
            total += abs(d)
            signs[y, x] = np.sign(d)
        row_sums[y] = total
    return row_sums.sum()


@nb.njit(parallel=True, cache=True)
def _clamped_squared_error_sum(a, b):  # pragma: no cover - compiled
    """sum (clamp(a, 0, 1) - b)^2 over [rows, n] arrays, in float64."""
    row_sums = np.zeros(a.shape[0])
    for y in nb.prange(a.shape[0]):
        total = 0.0
        for x in range(a.shape[1]):
            d = np.float64(min(max(a[y, x], 0.0), 1.0)) - np.float64(b[y, x])
            total += d * d
        row_sums[y] = total
    return row_sums.sum()


def _rows(image: Tensor) -> np.ndarray:
    """[h, W, C] as a numpy [h, W C] array (copied only if not contiguous)."""
    return image.detach().contiguous().numpy().reshape(image.shape[0], -1)


class _CpuAbsDifferenceSum(torch.autograd.Function):
    """sum |image - target|, differentiable in ``image`` (gradient: its signs)."""

    @staticmethod
    def forward(ctx, image: Tensor, target: Tensor) -> Tensor:
        signs = torch.empty(image.shape, dtype=image.dtype)
        total = _abs_difference_sum(_rows(image), _rows(target.to(image.dtype)),
                                    signs.numpy().reshape(image.shape[0], -1))
        ctx.save_for_backward(signs)
        return torch.tensor(total, dtype=image.dtype)

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        (signs,) = ctx.saved_tensors
        return signs * grad_output, None


def abs_difference_sum(image: Tensor, target: Tensor) -> Tensor:
    """sum |image - target|, differentiable in ``image``."""
    return backend_for(image.device).abs_difference_sum(image, target)


def abs_difference_sum_cpu(image: Tensor, target: Tensor) -> Tensor:
    """``abs_difference_sum`` by the numba kernel (CPU tensors)."""
    return _CpuAbsDifferenceSum.apply(image, target)


def abs_difference_sum_torch(image: Tensor, target: Tensor) -> Tensor:
    """``abs_difference_sum`` in torch operations, on any device."""
    return (image - target).abs().sum()


def photometric_loss(image: Tensor, target: Tensor, ssim_weight: float = 0.2,
                     rows: tuple[int, int] | None = None, count: int | None = None) -> Tensor:
    """(1 - w) L1 + w (1 - SSIM) of [h, W, 3] images.

    With ``rows`` and ``count``: the share of a band of the image, rows
    [r0, r1) of ``image`` (the rows around them are halo, read by SSIM's window
    only), of a whole image of ``count`` elements: summed over the bands that
    tile an image, these shares are the whole image's loss.

    A ``target`` of four channels carries a mask in the fourth (1: train, 0: ignore):
    the loss is then taken over the masked-in pixels alone (``count``: the whole
    image's masked-in elements, 3 per pixel; by default the band's own), and what
    the target holds under the mask has no influence on it (``masked_pair``).
    """
    rows = rows or (0, image.shape[0])
    colours, mask = split_mask(target)
    if mask is None:
        own: Tensor | int = (rows[1] - rows[0]) * image.shape[1] * image.shape[2]
    else:
        image, colours = masked_pair(image, colours, mask)
        own = 3 * mask[rows[0]:rows[1]].sum()
    count = count or int(own)
    l1 = abs_difference_sum(image[rows[0]:rows[1]], colours[rows[0]:rows[1]]) / count
    # The band's share of the constant 1 in (1 - SSIM) is own / count.
    return (1 - ssim_weight) * l1 + ssim_weight * (own / count
                                                   - ssim(image, colours, rows, count, mask))


def split_mask(target: Tensor) -> tuple[Tensor, Tensor | None]:
    """A target's colours [h, W, 3] and its mask [h, W] (1 train, 0 ignore), None where
    it has none (three channels)."""
    if target.shape[-1] == 3:
        return target, None
    return target[..., :3], target[..., 3]


def masked_pair(image: Tensor, colours: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """``image`` and ``colours`` where the mask is 1; where it is 0, both the image,
    detached. So an SSIM window that straddles the mask's edge reads the render, not
    the photo, under the mask, the L1 term is zero there, and no gradient flows to a
    masked-out pixel."""
    inside = mask[..., None] > 0
    rendered = image.detach()
    return (torch.where(inside, image, rendered),
            torch.where(inside, colours.to(image.dtype), rendered))


def masked_squared_error_sum(image: Tensor, target: Tensor) -> float:
    """``squared_error_sum`` over the masked-in pixels of a four-channel target (all of
    them for three channels)."""
    colours, mask = split_mask(target)
    if mask is None:
        return squared_error_sum(image, target)
    inside = mask[..., None].to(image.dtype)
    # A masked-out pixel is clamp(0) - 0; a masked-in one is itself (times 1).
    return squared_error_sum(image * inside, colours.to(image.dtype) * inside)


def squared_error_sum(image: Tensor, target: Tensor) -> float:
    """sum (clamp(image, 0, 1) - target)^2, accumulated in float64."""
    return backend_for(image.device).squared_error_sum(image, target)


def squared_error_sum_cpu(image: Tensor, target: Tensor) -> float:
    """``squared_error_sum`` by the numba kernel (CPU tensors)."""
    return float(_clamped_squared_error_sum(_rows(image), _rows(target)))


def squared_error_sum_torch(image: Tensor, target: Tensor) -> float:
    """``squared_error_sum`` in torch operations, on any device."""
    return float(((image.clamp(0, 1) - target).double() ** 2).sum())


def psnr_of(squared_error: float, count: int) -> float:
    """PSNR of a summed squared error over ``count`` elements."""
    mse = squared_error / count
    return float("inf") if mse == 0 else -10 * math.log10(mse)


def psnr(image: Tensor, target: Tensor) -> float:
    """PSNR of ``image`` clamped to [0, 1] against ``target`` (over its masked-in pixels
    where it has a mask: ``photometric_loss``)."""
    _, mask = split_mask(target)
    count = image.numel() if mask is None else 3 * int(mask.sum())
    return psnr_of(masked_squared_error_sum(image, target), count)

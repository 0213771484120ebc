"""SSIM with the 3DGS window: 11x11 Gaussian (sigma 1.5), zero padding of 5.

``ssim_map`` is plain torch (two 1D convolutions: the window is separable).
``ssim`` is the backend's (``splatscale.backends``): torch's on a GPU, and on
the CPU a fused numba kernel that returns the mean and its gradient in one go:
torch's depthwise convolutions and the many full-image elementwise passes
around them are memory-bound and several times slower there. The kernel reads
the [h, W, 3] images as they are, rows of interleaved channels, so neither they
nor the gradient are transposed. The window is symmetric, so the blur is
self-adjoint and the gradient needs only blurs of per-pixel partial derivatives.
"""

from __future__ import annotations

from functools import lru_cache

import numba as nb
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from splatscale.backends import backend_for

WINDOW, SIGMA = 11, 1.5
RADIUS = WINDOW // 2
C1, C2 = 0.01 ** 2, 0.03 ** 2


@lru_cache(maxsize=8)
def gaussian_taps(dtype: torch.dtype) -> Tensor:
    x = torch.arange(WINDOW, dtype=torch.float64) - RADIUS
    g = torch.exp(-x * x / (2 * SIGMA ** 2))
    return (g / g.sum()).to(dtype)


def _blur(images: Tensor) -> Tensor:
    """[C, H, W] blurred by the window (zero padding, same size)."""
    taps = gaussian_taps(images.dtype).to(images.device).expand(images.shape[0], 1, WINDOW)
    x = F.conv2d(images[None], taps[:, :, None, :], padding=(0, RADIUS), groups=images.shape[0])
    return F.conv2d(x, taps[:, :, :, None], padding=(RADIUS, 0), groups=images.shape[0])[0]


def ssim_map(image: Tensor, target: Tensor) -> Tensor:
    """Per-pixel SSIM of [h, W, 3] images."""
    a, b = image.permute(2, 0, 1), target.permute(2, 0, 1)
    mu_a, mu_b, aa, bb, ab = _blur(torch.cat([a, b, a * a, b * b, a * b])).split(3)
    var_a = aa - mu_a * mu_a
    var_b = bb - mu_b * mu_b
    cov = ab - mu_a * mu_b
    numerator = (2 * mu_a * mu_b + C1) * (2 * cov + C2)
    denominator = (mu_a * mu_a + mu_b * mu_b + C1) * (var_a + var_b + C2)
    return (numerator / denominator).permute(1, 2, 0)


@nb.njit(fastmath=True, cache=True)
def _blur_along(source, taps, step, padded, out):  # pragma: no cover - compiled
    """out = taps * source along a row, zero padded; neighbours are ``step`` apart.
    ``padded`` is scratch of RADIUS * step more values on each side."""
    length, margin = source.shape[0], RADIUS * step
    padded[:margin] = 0
    padded[margin + length:] = 0
    # A loop, not a slice assignment: numba compiles that one's shape check with its
    # error message, seconds of a first run's compile.
    for x in range(np.uint64(0), np.uint64(length)):
        padded[np.uint64(margin) + x] = source[x]
    # Each output sums its window in a register (WINDOW is a constant, so the tap loop
    # unrolls and the pixel loop vectorises); unsigned indices keep numba's
    # negative-index wraparound out of the loop.
    for x in range(np.uint64(0), np.uint64(length)):
        total = taps[0] * padded[x]
        for k in range(1, WINDOW):
            total += taps[k] * padded[x + np.uint64(k * step)]
        out[x] = total


BAND = 64  # rows each pass of the fused kernel takes at once


@nb.njit(inline="always")
def _blur_down(ring, y, taps, out):  # pragma: no cover - compiled
    """out[p] = taps * ring[p] down the rows, at row y: the ring holds rows y - RADIUS
    to y + RADIUS (``_ring_slot``)."""
    planes, _, length = ring.shape
    first = np.uint64(_ring_slot(ring, y - RADIUS))
    for p in range(planes):
        for x in range(np.uint64(0), np.uint64(length)):
            total = taps[0] * ring[p, first, x]
            for k in range(1, WINDOW):
                total += taps[k] * ring[p, first + np.uint64(k), x]
            out[p, x] = total


@nb.njit(inline="always")
def _ring_slot(ring, y):  # pragma: no cover - compiled
    """Where row y is in a ring of rows: slot y % slots, where slots is the ring's
    rows short of the last WINDOW - 1, which repeat its first (``_repeat_slot``), so
    that every window of rows lies in consecutive slots."""
    return y % (ring.shape[1] - (WINDOW - 1))


@nb.njit(inline="always")
def _repeat_slot(ring, slot):  # pragma: no cover - compiled
    """The slot's rows copied to its repeat past the ring's end, where it has one
    (in loops: an array assignment took numba seconds longer to compile)."""
    if slot < WINDOW - 1:
        repeat = slot + ring.shape[1] - (WINDOW - 1)
        for p in range(ring.shape[0]):
            for x in range(np.uint64(0), np.uint64(ring.shape[2])):
                ring[p, repeat, x] = ring[p, slot, x]


@nb.njit(inline="always")
def _weighted(weights, y, x, value):  # pragma: no cover - compiled
    """``value`` times the weight of value x of row y; ``value`` itself where there are
    no weights (a branch numba prunes when it compiles for None)."""
    if weights is None:
        return value
    return weights[y, x] * value


# The rows of the fused kernel's three parallel loops are calls, not inlined: numba's
# inlining into a parallel loop took seconds of a first run's compile. They have the
# kernel's flags: fast-math, and numpy's error model, as its loops' own code has (a
# division raises nothing, so no branch keeps a row off the vector units).
@nb.njit(fastmath=True, error_model="numpy")
def _blurred_products(a, b, y, taps, step, ring):  # pragma: no cover - compiled
    """Row y (zero outside the image) of a, b, a a, b b, a b, each blurred along the
    row, into its ring slot."""
    height, length = a.shape
    slot = _ring_slot(ring, y)
    if not 0 <= y < height:
        for p in range(ring.shape[0]):
            for x in range(np.uint64(0), np.uint64(length)):
                ring[p, slot, x] = 0
        _repeat_slot(ring, slot)
        return
    products = np.empty((5, length), a.dtype)
    padded = np.empty(length + 2 * RADIUS * step, a.dtype)
    for x in range(np.uint64(0), np.uint64(length)):
        va, vb = a[y, x], b[y, x]
        products[0, x], products[1, x] = va, vb
        products[2, x], products[3, x], products[4, x] = va * va, vb * vb, va * vb
    for p in range(5):
        _blur_along(products[p], taps, step, padded, ring[p, slot])
    _repeat_slot(ring, slot)


@nb.njit(fastmath=True, error_model="numpy")
def _ssim_row(across, y, taps, step, c1, c2, row0, row1, n, weights,
              partials_across):  # pragma: no cover - compiled
    """Row y's SSIM summed (0 outside rows [row0, row1)), and the partial derivatives
    of its map, blurred along the row, into their ring slot."""
    length = across.shape[2]
    partials = np.zeros((3, length), across.dtype)
    total = across.dtype.type(0)
    if row0 <= y < row1:  # else a halo row (or none): it feeds the blur, but is not counted
        blurred = np.empty((5, length), across.dtype)
        _blur_down(across, y, taps, blurred)
        for x in range(np.uint64(0), np.uint64(length)):
            mu_a, mu_b = blurred[0, x], blurred[1, x]
            e_aa, e_bb, e_ab = blurred[2, x], blurred[3, x], blurred[4, x]
            num1 = 2 * mu_a * mu_b + c1
            num2 = 2 * (e_ab - mu_a * mu_b) + c2
            den1 = mu_a * mu_a + mu_b * mu_b + c1
            den2 = e_aa - mu_a * mu_a + e_bb - mu_b * mu_b + c2
            inv = 1 / (den1 * den2)
            s = num1 * num2 * inv
            total += _weighted(weights, y, x, s)
            partials[0, x] = _weighted(weights, y, x,
                                       (2 * mu_b * (num2 - num1) * inv
                                        - 2 * mu_a * s * (1 / den1 - 1 / den2)) / n)
            partials[1, x] = _weighted(weights, y, x, -s / den2 / n)
            partials[2, x] = _weighted(weights, y, x, 2 * num1 * inv / n)
    padded = np.empty(length + 2 * RADIUS * step, across.dtype)
    slot = _ring_slot(partials_across, y)
    for p in range(3):
        _blur_along(partials[p], taps, step, padded, partials_across[p, slot])
    _repeat_slot(partials_across, slot)
    return total


@nb.njit(fastmath=True, error_model="numpy")
def _gradient_row(a, b, y, taps, partials_across, grad_a):  # pragma: no cover - compiled
    """Row y of the gradient w.r.t. a, from the partials' ring (``_ssim_value_and_grad``)."""
    length = a.shape[1]
    spread = np.empty((3, length), a.dtype)
    _blur_down(partials_across, y, taps, spread)
    for x in range(np.uint64(0), np.uint64(length)):
        grad_a[y, x] = spread[0, x] + 2 * a[y, x] * spread[1, x] + b[y, x] * spread[2, x]


@nb.njit(parallel=True, fastmath=True, cache=True)
def _ssim_value_and_grad(a, b, taps, step, c1, c2, row0, row1, n, weights,
                         grad_a):  # pragma: no cover - compiled
    """SSIM of images a, b [H, W C] (channels interleaved, ``step`` = C) summed over
    rows [row0, row1) and divided by n, and its gradient w.r.t. a (into grad_a). The
    mean is rows (0, H), n = C H W. ``weights`` [H, W C] weighs each value of the map
    in the sum, or is None: every value weighs 1 (numba compiles that case apart, as
    the code without weights).

    With mu = G*a, E_aa = G*(a a), E_ab = G*(a b) (G the window) the map is
    S = (2 mu_a mu_b + c1)(2 (E_ab - mu_a mu_b) + c2) / (D1 D2), and
    d mean(S) / da = G*(dS/dmu_a) + 2 a G*(dS/dE_aa) + b G*(dS/dE_ab), all over
    the element count: five blurred planes forward, three backward. Each blur runs
    along the rows, then down them. The passes move down the image BAND rows at a
    time, each a window behind the one before, so only the rows a window still
    needs are kept, in rings: whole planes of a large image would be fresh memory
    faulted in on every call.
    """
    height, length = a.shape
    row0, row1 = max(row0, 0), min(row1, height)  # the pad rows are no image's
    slots = BAND + 2 * RADIUS + WINDOW - 1
    across = np.empty((5, slots, length), a.dtype)
    partials_across = np.empty((3, slots, length), a.dtype)
    row_sums = np.zeros(height, a.dtype)
    # The first front's products start at the top pad row; the last front's gradient
    # rows reach the image's last.
    for front in range(BAND - RADIUS, height + 2 * RADIUS + BAND, BAND):
        # Blurred products of rows [front - BAND, front), from row -RADIUS (a zero pad).
        for y in nb.prange(front - BAND, min(front, height + RADIUS)):
            _blurred_products(a, b, y, taps, step, across)
        # SSIM of rows a window behind, and their blurred partials (zero pads outside).
        for y in nb.prange(max(front - BAND - RADIUS, -RADIUS),
                           min(front - RADIUS, height + RADIUS)):
            total = _ssim_row(across, y, taps, step, c1, c2, row0, row1, n, weights,
                              partials_across)
            if 0 <= y < height:
                row_sums[y] = total
        # The gradient of rows a window further behind.
        for y in nb.prange(max(front - BAND - 2 * RADIUS, 0), min(front - 2 * RADIUS, height)):
            _gradient_row(a, b, y, taps, partials_across, grad_a)
    return row_sums.sum() / n


class _CpuSsim(torch.autograd.Function):
    @staticmethod
    def forward(ctx, image: Tensor, target: Tensor, rows: tuple[int, int], count: int,
                weights: Tensor | None) -> Tensor:
        height, width, channels = image.shape
        a = image.detach().contiguous()
        b = target.detach().to(a.dtype).contiguous()
        grad = torch.empty_like(a)
        scalar = a.numpy().dtype.type
        per_value = None if weights is None else (
            weights.detach().to(a.dtype)[..., None].expand(a.shape).contiguous().numpy()
            .reshape(height, -1))
        value = _ssim_value_and_grad(
            a.numpy().reshape(height, width * channels), b.numpy().reshape(height, -1),
            gaussian_taps(a.dtype).numpy(), channels, scalar(C1), scalar(C2), rows[0], rows[1],
            scalar(count), per_value, grad.numpy().reshape(height, -1))
        ctx.save_for_backward(grad)
        return torch.tensor(value, dtype=a.dtype)

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        (grad,) = ctx.saved_tensors
        return grad_output * grad, None, None, None, None


def ssim(image: Tensor, target: Tensor, rows: tuple[int, int] | None = None,
         count: int | None = None, weights: Tensor | None = None) -> Tensor:
    """Mean SSIM of [h, W, 3] images, differentiable in ``image``.

    With ``rows`` (r0, r1), the SSIM map summed over those rows only and divided
    by ``count``: a band of an image rendered with halo rows around it (whose
    pixels feed the window but are another band's) contributes its share of the
    whole image's mean, taking ``count`` = the whole image's element count.
    ``weights`` [h, W] weighs each pixel's map values in that sum (a mask: 1 where a
    window's centre counts, 0 where it does not); None: every one weighs 1.
    """
    rows = rows or (0, image.shape[0])
    count = count or (rows[1] - rows[0]) * image.shape[1] * image.shape[2]
    return backend_for(image.device).ssim(image, target, rows, count, weights)


def ssim_cpu(image: Tensor, target: Tensor, rows: tuple[int, int], count: int,
             weights: Tensor | None = None) -> Tensor:
    """``ssim`` by the fused numba kernel (CPU tensors)."""
    return _CpuSsim.apply(image, target, rows, count, weights)


def ssim_torch(image: Tensor, target: Tensor, rows: tuple[int, int], count: int,
               weights: Tensor | None = None) -> Tensor:
    """``ssim`` in torch operations, on any device."""
    values = ssim_map(image, target)[rows[0]:rows[1]]
    if weights is not None:
        values = values * weights[rows[0]:rows[1], :, None].to(values.dtype)
    return values.sum() / count

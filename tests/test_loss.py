"""The 3DGS loss: SSIM against a direct 11x11-window computation, the fused CPU
kernel's value and gradient against autograd through the torch version."""

import math

import pytest
import torch
import torch.nn.functional as F

from splatscale.step.loss import abs_difference_sum, photometric_loss, psnr
from splatscale.step.ssim import BAND, ssim, ssim_cpu, ssim_map, ssim_torch


def direct_ssim_map(a, b):
    """SSIM written from its definition: full 2D Gaussian window, zero padding 5."""
    x = torch.arange(11, dtype=torch.float64) - 5
    g = torch.exp(-x * x / (2 * 1.5 ** 2))
    window = (g[:, None] * g[None, :] / g.sum() ** 2).expand(3, 1, 11, 11)
    blur = lambda t: F.conv2d(t.permute(2, 0, 1)[None], window, padding=5, groups=3)[0]  # noqa: E731
    mu_a, mu_b = blur(a), blur(b)
    var_a, var_b = blur(a * a) - mu_a ** 2, blur(b * b) - mu_b ** 2
    cov = blur(a * b) - mu_a * mu_b
    c1, c2 = 0.01 ** 2, 0.03 ** 2
    s = (((2 * mu_a * mu_b + c1) * (2 * cov + c2))
         / ((mu_a ** 2 + mu_b ** 2 + c1) * (var_a + var_b + c2)))
    return s.permute(1, 2, 0)


def images(h=29, w=41, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(h, w, 3, generator=g, dtype=torch.float64)
    b = (a + 0.2 * torch.randn(h, w, 3, generator=g, dtype=torch.float64)).clamp(0, 1)
    return a, b


def test_ssim_map_matches_the_definition():
    a, b = images()
    torch.testing.assert_close(ssim_map(a, b), direct_ssim_map(a, b), rtol=1e-12, atol=1e-14)


def test_fused_cpu_ssim_value_and_gradient():
    a, b = images(seed=1)
    a.requires_grad_(True)
    reference = direct_ssim_map(a, b).mean()
    (want,) = torch.autograd.grad(reference, a)
    value = ssim(a, b)
    (got,) = torch.autograd.grad(value * 3.0, a)
    torch.testing.assert_close(value, reference.detach(), rtol=1e-12, atol=0)
    torch.testing.assert_close(got, 3.0 * want, rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("height", [1, 6, BAND, BAND + 1, 3 * BAND + 17])
def test_fused_cpu_ssim_of_an_image_of_any_bands(height):
    """Images shorter than the rows the kernel keeps at once, and several times
    those, the sum over rows cut inside (or reaching past) them, with and without
    weights: the fused kernel is torch's."""
    a, b = images(h=height, w=9, seed=5)
    a.requires_grad_(True)
    weights = torch.rand(height, 9, generator=torch.Generator().manual_seed(6),
                         dtype=torch.float64)
    for rows, weighed in (((0, height), None), ((height // 3, height - height // 4), None),
                          ((height // 2, height + 3), weights), ((0, height), weights)):
        values = [kernel(a, b, rows, 1000, weighed) for kernel in (ssim_cpu, ssim_torch)]
        grads = [torch.autograd.grad(value, a)[0] for value in values]
        torch.testing.assert_close(values[0], values[1], rtol=1e-12, atol=1e-300)
        torch.testing.assert_close(grads[0], grads[1], rtol=1e-10, atol=1e-15)


def test_fused_cpu_ssim_float32_close_to_float64():
    a, b = images(seed=2)
    torch.testing.assert_close(ssim(a.float(), b.float()).double(), ssim(a, b), rtol=1e-5, atol=0)


def test_photometric_loss_and_psnr():
    a, b = images(seed=3)
    l1 = (a - b).abs().mean()
    expected = 0.8 * l1 + 0.2 * (1 - direct_ssim_map(a, b).mean())
    torch.testing.assert_close(photometric_loss(a, b), expected, rtol=1e-12, atol=0)
    assert psnr(b, b) == float("inf")
    shifted = a * 1.3 - 0.1  # some values outside [0, 1]: PSNR clamps them
    mse = torch.mean((shifted.clamp(0, 1) - b) ** 2).item()
    assert math.isclose(psnr(shifted, b), -10 * math.log10(mse), rel_tol=1e-12)


def test_fused_cpu_l1_gradient_is_torch_autograds():
    a, b = images(seed=4)
    b[::3] = a[::3]  # equal values: a zero gradient, as torch's abs gives
    a.requires_grad_(True)
    (want,) = torch.autograd.grad(2.0 * (a - b).abs().sum() / a.numel(), a)
    (got,) = torch.autograd.grad(2.0 * abs_difference_sum(a, b) / a.numel(), a)
    assert torch.equal(got, want)
    for rows in [(0, 29), (5, 17)]:  # a band of rows: the rows of the slice only
        torch.testing.assert_close(abs_difference_sum(a[rows[0]:rows[1]], b[rows[0]:rows[1]]),
                                   (a - b)[rows[0]:rows[1]].abs().sum(), rtol=1e-12, atol=0)
    mse = ((a - b) ** 2).mean().item()
    assert abs(psnr(a, b) + 10 * math.log10(mse)) < 1e-9


def test_band_shares_add_up_to_the_whole_image_loss():
    """Bands with 5 halo rows (SSIM's window radius), cut anywhere, each loss divided by
    the whole image's size: their sum is the image's loss, and so is the gradient."""
    a, b = images(h=37, w=23, seed=4)
    a.requires_grad_(True)
    whole = photometric_loss(a, b)
    (want,) = torch.autograd.grad(whole, a)
    count = a.numel()
    for cuts in ([0, 37], [0, 5, 37], [0, 16, 17, 30, 37], [0, 1, 2, 36, 37]):
        total, grad = 0.0, torch.zeros_like(a)
        for y0, y1 in zip(cuts[:-1], cuts[1:]):
            lo, hi = max(0, y0 - 5), min(37, y1 + 5)
            band = a[lo:hi]
            share = photometric_loss(band, b[lo:hi], rows=(y0 - lo, y1 - lo), count=count)
            total = total + share.detach()
            grad += torch.autograd.grad(share, a)[0]
        torch.testing.assert_close(total, whole.detach(), rtol=1e-12, atol=0)
        torch.testing.assert_close(grad, want, rtol=1e-9, atol=1e-15)


def test_band_without_its_halo_is_not_the_image_loss():
    a, b = images(h=37, w=23, seed=4)
    shares = [photometric_loss(a[y0:y1], b[y0:y1], rows=(0, y1 - y0), count=a.numel())
              for y0, y1 in ((0, 16), (16, 37))]
    assert abs(sum(shares) - photometric_loss(a, b)) > 1e-6

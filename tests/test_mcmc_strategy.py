"""MCMC's pieces against independent references: gsplat's relocation kernel written
out as it is, autograd of the regularisers, the draws' distribution, the selection
of the k first rows against a sort."""

from __future__ import annotations

import math

import pytest
import torch

from splatscale.model.gaussians import GaussianModel
from splatscale.step.row_set import RowSet
from splatscale.step.selection import ascending, descending, smallest
from splatscale.strategy.mcmc import MAX_RATIO, Regularisers, draw_counts, noise, relocated
from tests.conftest import random_model

ONE_PROCESS = lambda value: value  # noqa: E731 - the rows of one process are all rows


def gsplat_relocation(opacity: float, scale: float, ratio: int) -> tuple[float, float]:
    """gsplat's ``relocation_kernel`` for one Gaussian, loop for loop, in float64."""
    n = min(max(ratio, 1), MAX_RATIO)
    new_opacity = 1.0 - (1.0 - opacity) ** (1.0 / n)
    denominator = 0.0
    for i in range(1, n + 1):
        for k in range(i):
            denominator += math.comb(i - 1, k) * ((-1) ** k / math.sqrt(k + 1)) \
                * new_opacity ** (k + 1)
    return new_opacity, opacity / denominator * scale


def test_relocation_follows_gsplats_kernel():
    generator = torch.Generator().manual_seed(0)
    opacities = torch.rand(200, generator=generator, dtype=torch.float64) * 0.98 + 0.01
    scales = torch.rand(200, 3, generator=generator, dtype=torch.float64) + 0.1
    ratios = torch.randint(1, 70, (200,), generator=generator)
    shared, new_scales = relocated(opacities, scales, ratios)
    for i in range(200):
        want_opacity, want_scale = gsplat_relocation(float(opacities[i]), float(scales[i, 0]),
                                                     int(ratios[i]))
        assert float(shared[i]) == pytest.approx(want_opacity, rel=1e-12)
        assert float(new_scales[i, 0]) == pytest.approx(want_scale, rel=1e-9)


def test_a_gaussian_drawn_no_times_keeps_its_opacity_and_scale():
    opacities = torch.tensor([0.3, 0.9], dtype=torch.float64)
    scales = torch.tensor([[0.1, 0.2, 0.3], [1.0, 1.0, 2.0]], dtype=torch.float64)
    shared, new_scales = relocated(opacities, scales, torch.tensor([1, 1]))
    torch.testing.assert_close(shared, opacities, rtol=1e-15, atol=0)
    torch.testing.assert_close(new_scales, scales, rtol=1e-13, atol=0)


def test_regularisers_gradient_is_autograds():
    model = random_model(50, seed=3)
    params = {n: t.detach().clone().requires_grad_(True) for n, t in model.parameters().items()}
    regularisers, count = Regularisers(opacity=0.02, scale=0.03), 80
    loss = (regularisers.opacity * torch.sigmoid(params["opacity_logits"]).sum() / count
            + regularisers.scale * torch.exp(params["log_scales"]).sum() / (3 * count))
    loss.backward()
    for name, grad in regularisers.gradients(params, count).items():
        torch.testing.assert_close(grad, params[name].grad, rtol=1e-14, atol=0)


def test_draws_fall_in_proportion_to_the_weights_whatever_the_order():
    generator = torch.Generator().manual_seed(1)
    weights = torch.tensor([0.0, 1.0, 2.0, 4.0, 8.0], dtype=torch.float64).repeat(20)
    keys = torch.randint(-2 ** 62, 2 ** 62, (100,), generator=generator)
    n = 30_000
    counts = draw_counts(weights, keys, n, (7,), ONE_PROCESS)
    assert int(counts.sum()) == n and int(counts[weights == 0].sum()) == 0
    per_weight = torch.stack([counts[weights == w].sum() for w in (1.0, 2.0, 4.0, 8.0)])
    expected = n * torch.tensor([1.0, 2.0, 4.0, 8.0], dtype=torch.float64) / 15
    chi_square = float(((per_weight - expected) ** 2 / expected).sum())
    assert chi_square < 16.3  # 3 degrees of freedom: p = 0.001
    order = torch.randperm(100, generator=generator)
    permuted = draw_counts(weights[order], keys[order], n, (7,), ONE_PROCESS)
    assert torch.equal(permuted, counts[order])
    assert not torch.equal(draw_counts(weights, keys, n, (8,), ONE_PROCESS), counts)


def test_few_draws_among_many_rows():
    keys = torch.arange(1000) * 7919
    counts = draw_counts(torch.rand(1000, dtype=torch.float64) + 0.5, keys, 3, (1,), ONE_PROCESS)
    assert int(counts.sum()) == 3


def test_noise_moves_faint_gaussians_along_their_covariance():
    model = random_model(4, seed=5)
    with torch.no_grad():
        model.opacity_logits[:] = torch.logit(torch.tensor([0.001, 0.004, 0.5, 0.99],
                                                           dtype=torch.float64))
    model = GaussianModel(**model.parameters(), sh_degree=model.sh_degree, keys=model.keys)
    rows = RowSet(model)
    moves = noise(rows, scale=10.0, step=3)
    assert moves[2:].abs().max() < 1e-15  # opaque ones stay
    assert moves[:2].abs().min() > 0
    assert not torch.equal(moves, noise(rows, scale=10.0, step=4))
    # Along the covariance (built here from the quaternion's formula): Sigma^-1 moves /
    # (gate scale) is a standard normal sample.
    q = torch.nn.functional.normalize(model.quats.detach(), dim=-1)
    w, x, y, z = q.unbind(-1)
    r = torch.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
                     2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
                     2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
                    -1).view(-1, 3, 3)
    m = r * model.scales.detach()[:, None, :]
    covariance = m @ m.mT
    gate = torch.sigmoid(100 * (1 - model.opacities.detach() - 0.995))
    z_samples = torch.linalg.solve(covariance[:2], moves[:2]) / (10.0 * gate[:2, None])
    assert z_samples.abs().max() < 6 and z_samples.abs().min() > 0


def test_smallest_is_the_first_k_of_a_sort():
    generator = torch.Generator().manual_seed(2)
    values = torch.randn(500, generator=generator, dtype=torch.float64)
    values[::5] = values[7]  # ties, broken by key
    values[1] = -0.0
    keys = torch.randint(-2 ** 62, 2 ** 62, (500,), generator=generator)
    for k in (0, 1, 37, 250, 499, 500, 600):
        for order, reverse in ((ascending, False), (descending, True)):
            chosen = smallest(order(values), keys, k, ONE_PROCESS)
            ranked = sorted(range(500), key=lambda i: ((-1 if reverse else 1)
                                                       * float(values[i]), int(keys[i])))
            expected = torch.zeros(500, dtype=torch.bool)
            expected[ranked[:k]] = True
            assert torch.equal(chosen, expected), (k, reverse)

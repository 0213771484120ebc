"""The opacity's sigmoid: torch's values, rounded alike wherever an element sits,
with a gradient that stays finite where exp overflows."""

from __future__ import annotations

import pytest
import torch

from splatscale.model.gaussians import sigmoid


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_an_element_rounds_alike_wherever_it_is_stored(dtype):
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(0), dtype=dtype) * 4
    whole = sigmoid(logits)
    for start in range(40):
        for length in (1, 7, 37, 100):
            assert torch.equal(sigmoid(logits[start:start + length]),
                               whole[start:start + length]), (start, length)


def test_its_values_are_torchs_within_rounding():
    logits = torch.linspace(-30, 30, 10_001, dtype=torch.float64)
    torch.testing.assert_close(sigmoid(logits), torch.sigmoid(logits), rtol=1e-15, atol=0)
    single = logits.float()
    torch.testing.assert_close(sigmoid(single), torch.sigmoid(single), rtol=3e-7, atol=0)


def test_its_gradient_matches_finite_differences_and_stays_finite():
    logits = torch.linspace(-8, 8, 17, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(sigmoid, (logits,))
    extreme = torch.tensor([-200.0, -90.0, 0.0, 90.0, 200.0], requires_grad=True)
    values = sigmoid(extreme)
    values.sum().backward()
    assert values.tolist()[::4] == [0.0, 1.0]
    assert torch.isfinite(extreme.grad).all()

"""Rows kept in space's order: Morton codes against a bit-by-bit reference, and every
engine's rows in that order after an edit that replaced them."""

from __future__ import annotations

import pytest
import torch

from splatscale.engine.factory import OffloadOptions, make_engine
from splatscale.step.spatial_order import BITS, CELLS, morton_codes, spatial_order, spread_bits
from tests.conftest import random_model


def interleaved(x: int, y: int, z: int) -> int:
    """Bit i of x, y and z at bits 3i, 3i + 1 and 3i + 2."""
    code = 0
    for bit in range(BITS):
        for axis, value in enumerate((x, y, z)):
            code |= ((value >> bit) & 1) << (3 * bit + axis)
    return code


def test_spread_bits_interleaves_bit_by_bit():
    generator = torch.Generator().manual_seed(0)
    cells = torch.randint(0, CELLS + 1, (200, 3), generator=generator)
    cells[0], cells[1] = 0, CELLS
    codes = spread_bits(cells[:, 0]) | spread_bits(cells[:, 1]) << 1 | spread_bits(cells[:, 2]) << 2
    assert codes.tolist() == [interleaved(*row) for row in cells.tolist()]
    assert codes.min() >= 0


def test_the_corners_of_a_box_follow_the_z_curve():
    corners = torch.tensor([[x, y, z] for z in (0.0, 1.0) for y in (0.0, 1.0) for x in (0.0, 1.0)])
    shuffled = corners[torch.tensor([5, 2, 7, 0, 3, 6, 1, 4])]
    assert torch.equal(shuffled[spatial_order(shuffled)], corners)


def test_non_finite_rows_are_ordered_without_error():
    means = torch.tensor([[1.0, 2.0, 3.0], [float("nan"), 0.0, 0.0], [float("inf"), 1.0, 1.0],
                          [0.0, 0.0, 0.0]])
    codes = morton_codes(means)
    assert codes[3] == 0 and codes[0] == (1 << 3 * BITS) - 1
    assert sorted(spatial_order(means).tolist()) == [0, 1, 2, 3]
    nothing_finite = morton_codes(torch.full((2, 3), float("nan")))
    assert torch.equal(nothing_finite, torch.zeros(2, dtype=torch.int64))


@pytest.mark.parametrize("offload", [None, OffloadOptions()], ids=["resident", "offloaded"])
def test_an_edit_that_replaces_rows_leaves_them_in_space_order(offload):
    model = random_model(300, seed=3, spread=0.8, dtype=torch.float64)
    engine = make_engine(model.detach(), 1, torch.zeros(3, dtype=torch.float64), offload=offload)
    before = {name: tensor.detach().clone() for name, tensor in model.parameters().items()}
    kept = torch.arange(0, len(model), 3)
    engine.edit_rows(lambda rows, total: rows.replace(kept))
    codes = morton_codes(engine.model.means)
    assert bool((codes[1:] >= codes[:-1]).all())
    order = torch.argsort(engine.model.keys)
    assert torch.equal(engine.model.keys[order], model.keys[kept])
    for name, tensor in engine.model.parameters().items():
        assert torch.equal(tensor.detach()[order], before[name][kept]), name

"""The row set: every per-Gaussian tensor edited together, in one order."""

from __future__ import annotations

import pytest
import torch

from splatscale.step.row_set import RowSet
from tests.conftest import random_model


def numbered_rows(count: int = 5) -> RowSet:
    """A row set whose moments and state hold each row's number, to follow the rows."""
    rows = RowSet(random_model(count, seed=3))
    number = torch.arange(count, dtype=torch.float32)
    for kind in rows.moments.values():
        for name, moment in kind.items():
            kind[name] = moment + number.view(-1, *[1] * (moment.dim() - 1))
    rows.state["grad_sum"] = number.clone()
    return rows


def row_numbers(rows: RowSet) -> dict[str, list[float]]:
    """Each per-row tensor's first value per row, by name (keys as numbers)."""
    return {name: t.detach().reshape(len(rows), -1)[:, 0].tolist()
            for name, t in rows.tensors().items() if "/" in name}


def test_replace_keeps_every_per_row_tensor_aligned_and_zeroes_the_new():
    rows = numbered_rows()
    keys = rows.model.keys.clone()
    added = {n: p.detach()[:2].clone() for n, p in rows.params.items()}
    added["keys"] = torch.tensor([100, 101])
    rows.replace(torch.tensor([4, 0, 2]), added)
    assert rows.model.keys.tolist() == [*keys[[4, 0, 2]].tolist(), 100, 101]
    for name, numbers in row_numbers(rows).items():
        assert numbers == [4.0, 0.0, 2.0, 0.0, 0.0], name
    assert rows.take_replaced() and not rows.take_replaced()
    assert rows.take_edited() == set(rows.params) and all(
        p.requires_grad and p.is_leaf for p in rows.params.values())


def test_replace_refuses_a_mask_of_another_length_and_changes_nothing():
    rows = numbered_rows()
    before = row_numbers(rows)
    with pytest.raises(ValueError, match="keep mask of 4 rows for 5"):
        rows.replace(torch.tensor([True, False, True, True]))
    assert row_numbers(rows) == before and not rows.take_replaced()


def test_map_values_edits_named_groups_only():
    rows = numbered_rows()
    before = {n: p.detach().clone() for n, p in rows.params.items()}
    rows.map_values(["means"], lambda name, t: t + 1, lambda name, m: m * 0)
    assert torch.equal(rows.params["means"].detach(), before["means"] + 1)
    assert not rows.moments["exp_avg"]["means"].any()
    assert torch.equal(rows.params["quats"].detach(), before["quats"])
    assert rows.take_edited() == {"means"} and not rows.take_replaced()


def test_map_rows_moves_every_tensor_in_one_order():
    rows = numbered_rows()
    seen = []
    reverse = torch.arange(4, -1, -1)
    rows.map_rows(lambda name, t: seen.append(name) or t[reverse])
    assert seen == list(rows.tensors())
    for name, numbers in row_numbers(rows).items():
        assert numbers == [4.0, 3.0, 2.0, 1.0, 0.0], name
    assert rows.take_replaced()

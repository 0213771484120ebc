"""Densification with 3DGS semantics, row by row with the optimiser state."""

import math

import torch

from splatscale.step.row_set import RowSet
from splatscale.strategy.default import densify_and_prune, reset_opacity
from tests.conftest import random_model


def setup():
    model = random_model(6, seed=0, dtype=torch.float32).requires_grad_(True)
    with torch.no_grad():
        model.log_scales[:] = math.log(0.01)
        model.log_scales[2:4] = math.log(0.5)            # large: split
        model.opacity_logits[:] = 2.0
        model.opacity_logits[5] = -8.0                   # faint: pruned
    rows = RowSet(model)  # its first edit draws event 0
    exp_avg = rows.moments["exp_avg"]
    for name in exp_avg:
        exp_avg[name] += torch.arange(6.0).view(-1, *[1] * (exp_avg[name].dim() - 1))
    # Gaussians 0 and 2 have high view-space gradients, the others low.
    set_stats(rows, torch.tensor([1e-3, 0, 1e-3, 0, 0, 0]), torch.ones(6))
    return model, rows


def set_stats(rows: RowSet, grad_sum: torch.Tensor, count: torch.Tensor) -> None:
    rows.state["grad_sum"], rows.state["count"] = grad_sum, count


def test_clone_split_prune():
    model, rows = setup()
    before = model.detach()
    counts = densify_and_prune(rows, grad_threshold=2e-4, percent_dense=0.1, extent=1.0,
                               min_opacity=0.005, prune_large=False)
    assert counts == {"cloned": 1, "split": 1, "pruned": 1}
    # Kept: 0, 1, 3, 4 (2 split away, 5 pruned); then the clone of 0; then 2's two halves.
    assert len(model) == 4 + 1 + 2
    kept = [0, 1, 3, 4]
    assert torch.equal(model.means[:4].detach(), before.means[kept])
    assert torch.equal(model.means[4].detach(), before.means[0])
    halves = model.log_scales[5:].detach()
    torch.testing.assert_close(halves, before.log_scales[[2, 2]] - math.log(1.6))
    assert not torch.equal(model.means[5], model.means[6])
    assert (model.means[5:].detach() - before.means[2]).norm(dim=1).max() < 3 * 0.5 * 3
    # Adam moments follow their rows; new rows start at zero.
    m = rows.moments["exp_avg"]["means"]
    assert torch.equal(m[:4, 0], torch.tensor([0.0, 1.0, 3.0, 4.0])) and (m[4:] == 0).all()
    assert rows.params["means"] is model.means and model.means.requires_grad
    assert torch.equal(rows.state["grad_sum"], torch.zeros(7))
    assert torch.equal(rows.state["count"], torch.zeros(7))


def test_prune_large_after_first_reset():
    model, rows = setup()
    set_stats(rows, torch.zeros(6), torch.ones(6))
    densify_and_prune(rows, 2e-4, 0.1, extent=1.0, min_opacity=0.005, prune_large=True)
    assert len(model) == 3  # 2 and 3 exceed 0.1 x extent, 5 is faint


def test_opacity_reset_clamps_and_forgets_moments():
    model, rows = setup()
    reset_opacity(rows)
    assert model.opacities.max() <= 0.01 + 1e-7
    assert model.opacities[5] < 0.001, "already fainter: unchanged"
    assert (rows.moments["exp_avg"]["opacity_logits"] == 0).all()
    assert rows.params["opacity_logits"] is model.opacity_logits


def test_opacity_reset_keeps_a_vanished_opacity_finite():
    model, rows = setup()
    with torch.no_grad():
        model.opacity_logits[0] = -200.0  # its opacity rounds to zero
    reset_opacity(rows)
    assert torch.isfinite(model.opacity_logits).all()
    assert 0 < model.opacities[0] < 1e-37


def test_a_budget_densifies_the_largest_gradients_first():
    model, rows = setup()
    before = model.detach()
    # Candidates: 3 (large: a split) above the tie of 0 and 1 (small: clones) above 2.
    set_stats(rows, torch.tensor([3e-3, 3e-3, 1e-3, 5e-3, 0, 0]), torch.ones(6))
    winner = 0 if before.keys[0] < before.keys[1] else 1
    densify_and_prune(rows, grad_threshold=2e-4, percent_dense=0.1, extent=1.0,
                      min_opacity=0.005, prune_large=False, max_gaussians=8)
    # Room for 2: 3 split, the tie's smaller key cloned; then the faint 5 pruned.
    assert len(model) == 7
    means = model.means.detach()

    def copies(i: int) -> int:
        return int((means == before.means[i]).all(dim=1).sum())
    assert copies(3) == 0 and copies(winner) == 2 and copies(1 - winner) == 1
    assert copies(2) == 1


def test_a_budget_already_reached_only_prunes():
    model, rows = setup()
    densify_and_prune(rows, 2e-4, 0.1, extent=1.0, min_opacity=0.005, prune_large=False,
                      max_gaussians=6)
    assert len(model) == 5

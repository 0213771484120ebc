"""Rows hold SH's bands up to the degree in use (step/sh_bands.py): the same training,
bit for bit, as holding all four, and a model of fewer bands is a model."""

from __future__ import annotations

import pytest
import torch

from splatscale.engine.factory import make_engine
from splatscale.model.gaussians import SH_REST, GaussianModel
from splatscale.model.ply import read_ply, write_ply
from splatscale.step.row_set import MOMENTS, RowSet
from splatscale.step.sh_bands import hold_sh_bands
from tests.conftest import densifying_run, densifying_scene, random_model, state_by_key

# Steps of ``densifying_run`` (densification at 3 and 8, an opacity reset at 6) and the
# degree each segment renders with: 0 as a run starts, then a band more each segment.
SEGMENTS = ((range(0, 3), 0), (range(3, 5), 1), (range(5, 9), 2), (range(9, 12), 3))


def unused_bands_zero(model: GaussianModel) -> GaussianModel:
    """``model`` at degree 0 with no coefficient of shN yet, as a run starts."""
    model.shN = torch.zeros_like(model.shN)
    model.sh_degree = 0
    return model


def all_bands(state: dict) -> dict:
    """``state_by_key`` with shN and its moments padded to every band."""
    def padded(t):
        return torch.cat([t, t.new_zeros((len(t), SH_REST - t.shape[1], 3))], dim=1)
    return {n: padded(t) if n.endswith("shN") else t for n, t in state_by_key(state).items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_holding_the_bands_in_use_trains_as_holding_all(dtype):
    """Through clones, splits, pruning and an opacity reset, with the degree rising:
    ``set_sh_degree`` (the bands in use) against the degree set alone (all bands)."""
    views, model = densifying_scene(dtype)
    unused_bands_zero(model)
    states, losses, widths = [], [], []
    for held in (True, False):
        engine = make_engine(model.detach(), 2, torch.zeros(3, dtype=dtype))
        run_losses = []
        for steps, degree in SEGMENTS:
            if held:
                engine.set_sh_degree(degree)
                widths.append(engine.rows.row_set.model.shN.shape[1])
            else:
                engine.rows.row_set.model.sh_degree = degree
            run_losses += densifying_run(engine, views, steps)
        losses.append(run_losses)
        states.append(all_bands(engine.state_dict()))
    assert widths == [0, 3, 8, 15]
    assert losses[0] == losses[1]
    assert states[0].keys() == states[1].keys()
    for name, tensor in states[0].items():
        assert torch.equal(tensor, states[1][name]), name
    assert states[0]["shN"][:, 8:].any()  # the last band, taken on last, trained too


def test_bands_are_dropped_only_where_they_and_their_moments_are_zero():
    rows = RowSet(unused_bands_zero(random_model(20)))
    assert hold_sh_bands(rows, 0) and rows.params["shN"].shape == (20, 0, 3)
    assert hold_sh_bands(rows, 2) and rows.params["shN"].shape == (20, 8, 3)
    assert all(rows.moments[kind]["shN"].shape == (20, 8, 3) for kind in MOMENTS)
    assert not hold_sh_bands(rows, 2)
    with torch.no_grad():
        rows.params["shN"][3, 4, 1] = 0.5  # band 2 in use
    rows.moments["exp_avg_sq"]["shN"][7, 1, 2] = 1e-6  # band 1 stepped once
    assert hold_sh_bands(rows, 1) is False and rows.params["shN"].shape == (20, 8, 3)
    assert hold_sh_bands(rows, 3) and rows.params["shN"].shape == (20, 15, 3)
    assert rows.params["shN"][3, 4, 1] == 0.5 and not rows.params["shN"][:, 8:].any()
    assert rows.moments["exp_avg_sq"]["shN"][7, 1, 2] == 1e-6
    trained = RowSet(random_model(5, sh_degree=1))  # higher bands that are not zero
    assert not hold_sh_bands(trained, 1) and trained.params["shN"].shape == (5, 15, 3)


def test_a_model_holds_the_bands_of_its_degree_or_more(tmp_path):
    model = random_model(6, sh_degree=1)
    for held, degree in ((0, 0), (3, 0), (3, 1), (8, 1), (15, 3)):
        values = {n: t for n, t in model.parameters().items()}
        GaussianModel(**{**values, "shN": values["shN"][:, :held]}, sh_degree=degree)
    for held, degree in ((3, 2), (5, 1), (0, 1)):
        values = {n: t for n, t in model.parameters().items()}
        with pytest.raises(ValueError, match="shN has shape"):
            GaussianModel(**{**values, "shN": values["shN"][:, :held]}, sh_degree=degree)
    # Saved, the bands not held are zero: the PLY of the same model holding all of them.
    fewer = model.rows(slice(None))
    fewer.shN = fewer.shN[:, :3].clone()
    write_ply(fewer, tmp_path / "fewer.ply")
    padded = model.rows(slice(None))
    padded.shN[:, 3:] = 0
    write_ply(padded, tmp_path / "all.ply")
    assert (tmp_path / "fewer.ply").read_bytes() == (tmp_path / "all.ply").read_bytes()
    assert torch.equal(read_ply(tmp_path / "fewer.ply").shN[:, :3], fewer.shN.float())

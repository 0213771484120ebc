"""Rows hold SH's bands up to the degree in use (step/sh_bands.py): the same training,
bit for bit, as holding all four, and a model of fewer bands is a model."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from splatscale.engine.factory import make_engine
from splatscale.model.gaussians import SH_REST, GaussianModel
from splatscale.model.ply import read_ply, write_ply
from splatscale.step.row_set import RowSet
from splatscale.step.sh_bands import hold_sh_bands
from tests.conftest import densifying_run, densifying_scene, random_model, state_by_key
from tests.test_offload import offloaded

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


ENGINES = {"resident": make_engine,
           "offloaded": partial(offloaded, forwarding=True, lookahead=True)}


@pytest.mark.parametrize("engine_kind", ENGINES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_holding_the_bands_in_use_trains_as_holding_all(dtype, engine_kind):
    """Through clones, splits, pruning and an opacity reset, with the degree rising:
    ``set_sh_degree`` (the bands in use) against the degree set alone (all bands); on
    offloaded rows, across updates in flight and rows sent a step early too."""
    views, model = densifying_scene(dtype)
    unused_bands_zero(model)
    states, losses, widths = [], [], []
    for held in (True, False):
        engine = ENGINES[engine_kind](model.detach(), 2, torch.zeros(3, dtype=dtype))
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


def one_process(value):
    return value


def test_bands_are_dropped_only_where_they_and_their_moments_are_zero():
    rows = RowSet(unused_bands_zero(random_model(20)))
    hold_sh_bands(rows, 0, one_process)
    assert rows.params["shN"].shape == (20, 0, 3)
    hold_sh_bands(rows, 2, one_process)
    assert all(t.shape == (20, 8, 3) for t in (rows.params["shN"], rows.moments["exp_avg"]["shN"],
                                               rows.moments["exp_avg_sq"]["shN"]))
    with torch.no_grad():
        rows.params["shN"][3, 1, 1] = 0.5  # band 1, kept: its values stay
    rows.moments["exp_avg"]["shN"][7, 5, 2] = 1e-6  # band 2 stepped once, its values zero
    hold_sh_bands(rows, 1, one_process)
    assert rows.params["shN"].shape == (20, 8, 3)
    rows.moments["exp_avg"]["shN"][7, 5, 2] = 0
    with torch.no_grad():
        rows.params["shN"][9, 4, 0] = -0.25  # band 2's value, its moments zero
    hold_sh_bands(rows, 1, one_process)
    assert rows.params["shN"].shape == (20, 8, 3)
    with torch.no_grad():
        rows.params["shN"][9, 4, 0] = 0
    hold_sh_bands(rows, 1, lambda value: value + 1)  # another rank's band 2 is not zero
    assert rows.params["shN"].shape == (20, 8, 3)
    hold_sh_bands(rows, 1, one_process)
    assert rows.params["shN"].shape == (20, 3, 3) and rows.params["shN"][3, 1, 1] == 0.5
    hold_sh_bands(rows, 3, one_process)
    assert rows.params["shN"].shape == (20, 15, 3) and not rows.params["shN"][:, 3:].any()
    assert rows.params["shN"][3, 1, 1] == 0.5 and rows.moments["exp_avg"]["shN"].shape[1] == 15
    trained = RowSet(random_model(5, sh_degree=1))  # higher bands that are not zero
    hold_sh_bands(trained, 1, one_process)
    assert trained.params["shN"].shape == (5, 15, 3)


def test_a_model_holds_the_bands_of_its_degree_or_more(tmp_path):
    model = random_model(6, sh_degree=1)
    values = model.parameters()
    for held, degree in ((0, 0), (3, 0), (3, 1), (8, 1), (15, 3)):
        GaussianModel(**{**values, "shN": values["shN"][:, :held]}, sh_degree=degree)
    for held, degree in ((3, 2), (5, 1), (0, 1)):
        with pytest.raises(ValueError, match=r"shN has shape .*K one of"):
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

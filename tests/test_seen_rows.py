"""A resident engine that renders and steps Adam from the rows each step saw equals
the engine that renders and steps every row, bit for bit (engine/rows.py)."""

from __future__ import annotations

import math

import pytest
import torch

from splatscale.engine.factory import make_engine
from splatscale.engine.rows import GATHER_SHARE
from splatscale.model.gaussians import GaussianModel
from splatscale.render.projection import visibility
from tests.conftest import (densifying_run, densifying_scene, every_row_backend, mcmc_run,
                            random_model, state_by_key)

RUNS = {"densifying": densifying_run, "mcmc": mcmc_run}


def partly_seen_scene(dtype=torch.float64):
    """``densifying_scene``, its model with 400 Gaussians more above it, where no view
    looks, and 100 in a ring beyond it, each seen by the one view that looks across
    the model at it: a batch sees a fifth of the rows or fewer, each batch others."""
    views, model = densifying_scene(dtype)
    above = random_model(400, seed=13, spread=0.8, dtype=dtype)
    above.means = above.means + torch.tensor([0.0, 8.0, 0.0], dtype=dtype)
    ring = random_model(100, seed=14, spread=0.3, dtype=dtype)
    angles = torch.linspace(0, 2 * math.pi, 101, dtype=dtype)[:100]
    ring.means = ring.means + 6.0 * torch.stack(
        [torch.cos(angles), torch.zeros_like(angles), torch.sin(angles)], dim=1)
    joined = {name: torch.cat([tensor.detach(), getattr(above, name), getattr(ring, name)])
              for name, tensor in model.parameters().items()}
    return views, GaussianModel(**joined, sh_degree=model.sh_degree)


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_stepping_the_seen_rows_equals_stepping_every_row(run, dtype):
    """Through clones, splits, pruning and an opacity reset (3DGS), or relocation,
    growth, noise and regularisers' gradients of every row (MCMC)."""
    views, model = partly_seen_scene(dtype)
    seen = visibility(model, [view.camera for view in views[:2]]).visible.any(dim=0)
    assert 0 < int(seen.sum()) < GATHER_SHARE * len(model)  # a batch's rows are gathered
    states, losses = [], []
    for backend in (None, every_row_backend()):
        engine = make_engine(model.detach(), 2, torch.zeros(3, dtype=dtype),
                             backend=backend)
        gathered = engine.rows.working_set([views[0].camera]).model
        assert (gathered is engine.rows.row_set.model) == (backend is not None)
        losses.append(RUNS[run](engine, views))
        states.append(state_by_key(engine.state_dict()))
    assert losses[0] == losses[1]
    for name, tensor in states[0].items():
        assert torch.equal(tensor, states[1][name]), name


def test_the_gradients_of_the_seen_rows_are_the_dense_gradients():
    """``Rows.gradients``: the step's gradient of every row, zero where unseen."""
    views, model = partly_seen_scene()
    grads = []
    for backend in (None, every_row_backend()):
        engine = make_engine(model.detach(), 2, torch.zeros(3, dtype=torch.float64),
                             backend=backend)
        engine.forward_backward(views[:2])
        grads.append(engine.rows.gradients())
    assert grads[0].keys() == grads[1].keys() == set(model.PARAMETERS)
    for name, grad in grads[0].items():
        assert torch.equal(grad, grads[1][name]), name
        assert grad[:60].any() and grad[460:].any(), name
        assert not grad[60:460].any(), name  # the rows above: none

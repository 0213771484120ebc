"""The CPU kernels' dense gradients written into the last step's gradient buffers
(render/dense_gradients.py): the same training, bit for bit, without a buffer of
every row mapped afresh each step."""

from __future__ import annotations


import pytest
import torch

from splatscale.engine.factory import make_engine
from splatscale.render.dense_gradients import empty_like, reusing
from tests.conftest import (TRAIN_RATES, densifying_run, densifying_scene,
                            every_row_backend, state_by_key)


def test_empty_like_takes_a_fitting_spare_as_it_is_and_only_one():
    fitting = torch.full((5, 3), 7.0)
    others = [torch.full((5, 4), 7.0), torch.full((5, 3), 7.0, dtype=torch.float64),
              torch.full((3, 5), 7.0).t()]  # another shape, dtype, layout
    spares = [*others, fitting]
    with reusing(spares):
        taken = empty_like(torch.empty(5, 3))
        fresh = empty_like(torch.empty(5, 3))
    assert taken.data_ptr() == fitting.data_ptr() and (taken == 7.0).all()
    assert [id(t) for t in spares] == [id(t) for t in others]
    assert fresh.data_ptr() not in [t.data_ptr() for t in [fitting, *others]]
    assert fresh.shape == (5, 3) and fresh.is_contiguous()
    assert empty_like(torch.empty(3, 5).t()).is_contiguous()  # outside: torch's


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_training_in_last_steps_gradients_is_training_in_fresh_ones(dtype):
    """Through clones, splits, pruning and an opacity reset: equal states, and each
    step after the last edit writes its gradients into the buffers of the one before."""
    views, model = densifying_scene(dtype)
    engines = [make_engine(model.detach(), 2, torch.zeros(3, dtype=dtype),
                           backend=every_row_backend()) for _ in range(2)]
    engines[1].rows.spare_gradients = list  # none: fresh buffers, as torch gives
    losses = [densifying_run(engine, views) for engine in engines]
    assert losses[0] == losses[1]
    states = [state_by_key(engine.state_dict()) for engine in engines]
    for name, tensor in states[0].items():
        assert torch.equal(tensor, states[1][name]), name

    rows = engines[0].rows
    buffers = []
    for _ in range(2):
        engines[0].forward_backward(views[:2])
        engines[0].optimizer_step(TRAIN_RATES)
        buffers.append({t.data_ptr() for t in rows.spares if t.shape[1:] == (15, 3)})
    assert len(buffers[0]) == 1 and buffers[0] == buffers[1]  # SH's gradient: reused

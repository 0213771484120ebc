"""Results do not depend on where Gaussians are stored: training a permuted copy of a
model, through clones, splits, pruning and an opacity reset (under a budget or
not), or through MCMC's relocation, growth and noise, gives the same model and
optimiser state as sets of Gaussians (DESIGN: "Order independence")."""

from __future__ import annotations

import pytest
import torch

from splatscale.engine import composed
from splatscale.engine.composed import ComposedEngine
from splatscale.engine.factory import make_engine
from splatscale.step.keyed_random import keyed_hash, keyed_normal, mix
from tests.conftest import (absgrad_run, capped_run, densifying_run, densifying_scene,
                            mcmc_run)

MASK = (1 << 64) - 1


def splitmix_reference(x: int) -> int:
    x &= MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def test_mix_is_splitmix64_in_wrapping_int64():
    values = [0, 1, 12345, -1, -(1 << 63), (1 << 63) - 1, 0x0123456789ABCDEF]
    got = mix(torch.tensor(values, dtype=torch.int64)).tolist()
    assert [g & MASK for g in got] == [splitmix_reference(v) for v in values]


def test_keyed_normal_is_a_standard_normal_per_key():
    keys = torch.arange(200_000)
    samples = keyed_normal(keys, 2, 7)
    assert abs(samples.mean()) < 0.01 and abs(samples.std() - 1) < 0.01
    assert abs(torch.corrcoef(samples.T)[0, 1]) < 0.01
    permuted = torch.randperm(len(keys))
    assert torch.equal(keyed_normal(keys[permuted], 2, 7), samples[permuted])
    assert not torch.equal(keyed_normal(keys, 2, 8), samples), "another event, other samples"
    assert len(set(keyed_hash(keys, 3, 0).tolist())) == len(keys)


def by_key(engine: ComposedEngine) -> dict:
    """Parameters, Adam moments and statistics, rows sorted by key."""
    order = torch.argsort(engine.model.keys)
    state = {"keys": engine.model.keys[order]}
    for name, tensor in engine.model.parameters().items():
        state[name] = tensor.detach()[order]
        state["m_" + name] = engine.row_set.moments["exp_avg"][name][order]
        state["v_" + name] = engine.row_set.moments["exp_avg_sq"][name][order]
    # MCMC keeps no statistics: its rows have none (3DGS's exist once a step was observed).
    for name in ("grad_sum", "count"):
        if name in engine.row_set.state:
            state[name] = engine.row_set.state[name][order]
    return state


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("run", [densifying_run, capped_run, mcmc_run, absgrad_run])
def test_storage_order_does_not_change_training(run, dtype, monkeypatch):
    """Bit for bit, in float32 too: every value of a step is computed alike wherever
    its Gaussian is stored (equal depths blend by key; the kernels' and the
    activations' rounding does not depend on an element's position). Each edit
    stores the rows in a random order of its own, not in space's order, so that the
    two engines' rows stay apart after it."""
    shuffles = torch.Generator().manual_seed(1)
    monkeypatch.setattr(composed, "spatial_order",
                        lambda means: torch.randperm(len(means), generator=shuffles))
    views, model = densifying_scene(dtype)
    order = torch.randperm(len(model), generator=torch.Generator().manual_seed(0))
    engines = [make_engine(m, batch_size=2, background=torch.zeros(3, dtype=dtype))
               for m in (model.detach(), model.rows(order))]
    for engine in engines:
        run(engine, views)

    a, b = by_key(engines[0]), by_key(engines[1])
    assert torch.equal(a["keys"], b["keys"])
    born = ~torch.isin(a["keys"], model.keys)
    assert born.sum() >= 5 and (~born).sum() < len(model), "Gaussians are born and removed"
    for name in a:
        assert torch.equal(a[name], b[name]), name

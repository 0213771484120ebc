"""Results do not depend on where Gaussians are stored: training a permuted copy of a
model, through clones, splits, pruning and an opacity reset, gives the same model
and optimiser state as sets of Gaussians (DESIGN: "Order independence")."""

from __future__ import annotations

import torch

from splatscale.engine import TrainView
from splatscale.engine.local import LocalEngine
from splatscale.model.gaussians import GaussianModel
from splatscale.render import render
from splatscale.step.keyed_random import keyed_hash, keyed_normal, mix
from tests.conftest import orbit_cameras, random_model

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


def permuted(model: GaussianModel, order: torch.Tensor) -> GaussianModel:
    return GaussianModel(**{n: t.detach()[order].clone() for n, t in model.parameters().items()},
                         sh_degree=model.sh_degree, keys=model.keys[order].clone())


def train(model: GaussianModel, views: list[list[TrainView]]) -> LocalEngine:
    engine = LocalEngine(model, batch_size=2, background=torch.zeros(3, dtype=torch.float64))
    rates = {"means": 2e-3, "quats": 1e-3, "log_scales": 5e-3, "opacity_logits": 0.05,
             "sh0": 2.5e-3, "shN": 1.25e-4}
    for step, batch in enumerate(views):
        engine.forward_backward(batch, track_stats=True)
        if step in (3, 7):
            engine.densify_and_prune(grad_threshold=5e-3, percent_dense=0.15, extent=2.0,
                                     min_opacity=0.005, prune_large=step == 7)
        if step == 5:
            engine.reset_opacity()
        engine.optimizer_step(rates)
    return engine


def by_key(engine: LocalEngine) -> dict:
    """Parameters, Adam moments and statistics, rows sorted by key."""
    order = torch.argsort(engine.model.keys)
    state = {"keys": engine.model.keys[order]}
    for name, tensor in engine.model.parameters().items():
        state[name] = tensor.detach()[order]
        state["m_" + name] = engine.optimizer.exp_avg[name][order]
        state["v_" + name] = engine.optimizer.exp_avg_sq[name][order]
    state["grad_sum"], state["count"] = engine.stats.grad_sum[order], engine.stats.count[order]
    return state


def test_storage_order_does_not_change_training():
    cameras = orbit_cameras(4, 40, 30, radius=3.5)
    truth = random_model(150, seed=11, spread=0.8)
    with torch.no_grad():
        targets = [render(truth, c).rgb.clamp(0, 1) for c in cameras]
    views = [TrainView(c, t) for c, t in zip(cameras, targets)]
    batches = [[views[(2 * s) % 4], views[(2 * s + 1) % 4]] for s in range(10)]

    model = random_model(60, seed=12, spread=0.8, log_scale=(-2.5, -1.0))
    order = torch.randperm(len(model), generator=torch.Generator().manual_seed(0))
    plain, shuffled = train(model.detach(), batches), train(permuted(model, order), batches)

    a, b = by_key(plain), by_key(shuffled)
    assert torch.equal(a["keys"], b["keys"])
    born = ~torch.isin(a["keys"], model.keys)
    print(f"{len(model)} Gaussians -> {len(a['keys'])}, {int(born.sum())} born in densification")
    assert born.sum() >= 10 and (~born).sum() < len(model), "clones, splits and prunes happen"
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-12, atol=0, msg=name)

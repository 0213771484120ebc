"""Adam with the batch-size rule and schedules counted in images."""

import math
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor

from splatscale.step.optimizer import GaussianAdam, batch_hyperparameters, step_factors
from splatscale.step.schedule import crossed_multiple, crosses, position_lr


@dataclass
class Rows:
    """What Adam steps, of plain tensors: parameter groups and their two moments."""

    params: dict[str, Tensor]
    moments: dict[str, dict[str, Tensor]]

    @classmethod
    def of(cls, params: dict[str, Tensor]) -> "Rows":
        return cls(params, {kind: {n: torch.zeros_like(p.detach()) for n, p in params.items()}
                            for kind in ("exp_avg", "exp_avg_sq")})


@pytest.mark.parametrize("batch", [1, 4, 16])
def test_batch_hyperparameters(batch):
    h = batch_hyperparameters(2.5e-3, batch)
    assert h.lr == pytest.approx(2.5e-3 * math.sqrt(batch))
    assert h.beta1 == pytest.approx(0.9 ** batch) and h.beta2 == pytest.approx(0.999 ** batch)
    assert h.eps == pytest.approx(1e-15 / math.sqrt(batch))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_batch_of_one_is_torch_adam(dtype):
    """Three groups of different widths and learning rates, stepped in one pass over
    the rows, against torch's Adam group by group."""
    g = torch.Generator().manual_seed(0)
    widths, rates = {"a": 3, "b": 1, "c": 4}, {"a": 0.01, "b": 0.05, "c": 0.002}
    ours = {n: torch.randn(5, w, generator=g, dtype=dtype, requires_grad=True)
            for n, w in widths.items()}
    theirs = {n: p.detach().clone().requires_grad_(True) for n, p in ours.items()}
    optimizer = GaussianAdam(ours, batch_size=1)
    rows = Rows.of(ours)
    reference = torch.optim.Adam([{"params": [theirs[n]], "lr": rates[n]} for n in widths],
                                 betas=(0.9, 0.999), eps=1e-15)
    for _ in range(5):
        for n in widths:
            grad = torch.randn(5, widths[n], generator=g, dtype=dtype)
            ours[n].grad, theirs[n].grad = grad.clone(), grad.clone()
        optimizer.step(rows, rates)
        reference.step()
    tolerance = dict(rtol=1e-12, atol=1e-15) if dtype == torch.float64 else dict(rtol=1e-6,
                                                                                  atol=1e-7)
    for n in widths:
        torch.testing.assert_close(ours[n], theirs[n], **tolerance)


def stepped_with_zeros_for_none(grads: list[dict[str, Tensor | None]]) -> list[Rows]:
    """Two optimisers over the same float32 groups, stepped with ``grads`` step by
    step: one given each gradient absent (None) as it is, the other an explicit zero
    in its place. Returns their rows."""
    g = torch.Generator().manual_seed(1)
    start = {n: torch.randn(6, 3, generator=g) for n in ("a", "b")}
    stepped = []
    for as_zero in (False, True):
        params = {n: t.clone().requires_grad_(True) for n, t in start.items()}
        rows, optimizer = Rows.of(params), GaussianAdam(params)
        for step in grads:
            for n, grad in step.items():
                params[n].grad = (torch.zeros(6, 3) if grad is None and as_zero
                                  else None if grad is None else grad.clone())
            optimizer.step(rows, {"a": 0.01, "b": 0.003})
        assert optimizer.steps == {"a": len(grads), "b": len(grads)}
        stepped.append(rows)
    return stepped


def assert_rows_equal(ours: Rows, theirs: Rows) -> None:
    for n in ours.params:
        assert torch.equal(ours.params[n], theirs.params[n])
        for kind in ours.moments:
            assert torch.equal(ours.moments[kind][n], theirs.moments[kind][n])


def test_a_group_without_a_gradient_steps_as_with_a_zero_one():
    """At rest (zero moments) it keeps its values, and its count goes on for the
    bias correction of its first gradient; after gradients it moves by its momentum."""
    g = torch.Generator().manual_seed(2)
    grad = lambda: torch.randn(6, 3, generator=g)  # noqa: E731
    grads = [{"a": grad(), "b": None}, {"a": grad(), "b": None}, {"a": None, "b": grad()},
             {"a": grad(), "b": None}, {"a": None, "b": None}, {"a": grad(), "b": grad()}]
    ours, theirs = stepped_with_zeros_for_none(grads)
    assert_rows_equal(ours, theirs)


def test_moments_written_by_torch_are_read_again():
    """A group found at rest is not taken to be at rest after its moments change."""
    params = {"a": torch.ones(4, 2, requires_grad=True)}
    rows, optimizer = Rows.of(params), GaussianAdam(params)
    optimizer.step(rows, {"a": 0.1})  # no gradient, at rest: nothing moves
    assert torch.equal(params["a"], torch.ones(4, 2))
    rows.moments["exp_avg"]["a"][0] = 1.0  # in place
    rows.moments["exp_avg_sq"]["a"][0] = 1.0
    optimizer.step(rows, {"a": 0.1})
    assert (params["a"][0] < 1).all() and torch.equal(params["a"][1:], torch.ones(3, 2))
    rows.moments["exp_avg"]["a"] = torch.ones(4, 2)  # replaced
    rows.moments["exp_avg_sq"]["a"] = torch.ones(4, 2)
    optimizer.step(rows, {"a": 0.1})
    assert (params["a"][1:] < 1).all()


@pytest.mark.parametrize("batch", [1, 4, 16])
def test_events_fire_by_images_seen(batch):
    """Over 3000 images every schedule fires the same number of times whatever B, on
    the batch whose image window holds the event's multiple."""
    fired = {100: [], 1000: [], 3000: []}
    for start in range(0, 3000, batch):
        for interval in fired:
            mark = crossed_multiple(start, start + batch, interval)
            if mark is not None:
                assert start < mark <= start + batch
                fired[interval].append(mark)
    assert fired[100] == list(range(100, 3001, 100))
    assert fired[1000] == [1000, 2000, 3000] and fired[3000] == [3000]
    assert not crosses(0, batch, 3000) or batch >= 3000


def test_position_lr_decays_log_linearly_over_images():
    assert position_lr(0, 1.6e-4, 1.6e-6, 30_000) == pytest.approx(1.6e-4)
    assert position_lr(15_000, 1.6e-4, 1.6e-6, 30_000) == pytest.approx(1.6e-5)
    assert position_lr(30_000, 1.6e-4, 1.6e-6, 30_000) == pytest.approx(1.6e-6)
    assert position_lr(90_000, 1.6e-4, 1.6e-6, 30_000) == pytest.approx(1.6e-6)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_torch_step_equals_the_kernel(dtype):
    """Five steps off the CPU (the cuda backend's torch operations) against the cpu
    backend's numba kernel, rows of zero moments and zero gradients among them."""
    from splatscale.backends import backend_named
    g = torch.Generator().manual_seed(2)
    h = batch_hyperparameters(0.01, 4)
    kernel = [torch.randn(300, 3, generator=g, dtype=dtype) for _ in range(2)]
    kernel.insert(2, torch.rand(300, 3, generator=g, dtype=dtype) * 1e-4)  # v >= 0
    kernel[1][::7] = 0.0  # rows that start from zero moments
    kernel[2][::7] = 0.0
    torch_side = [t.clone() for t in kernel]
    for t in range(1, 6):
        grad = torch.randn(300, 3, generator=g, dtype=dtype)
        grad[::5] = 0.0  # unseen rows
        scale, root_bias2 = step_factors(h, t)
        for backend, state in (("cpu", kernel), ("cuda", torch_side)):
            backend_named(backend).adam_step(*(x.view(-1) for x in (*state, grad)), scale,
                                             root_bias2, h.beta1, h.beta2, h.eps)
    tolerance = dict(rtol=1e-12, atol=1e-15) if dtype == torch.float64 else dict(rtol=1e-6,
                                                                                  atol=1e-7)
    for ours, theirs in zip(torch_side, kernel):
        torch.testing.assert_close(ours, theirs, **tolerance)

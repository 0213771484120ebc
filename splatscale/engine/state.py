"""The engine state that checkpoints hold, its schema, and the row operations on it.

An engine's ``state_dict()`` is an ``EngineState`` of the Gaussians it holds (all
of them, or its rank's shard), as CPU tensors. Every per-Gaussian tensor has
one row per Gaussian, in the same order, so a state splits and joins by rows:
a checkpoint saved by W ranks is read by any number of ranks.
"""

from __future__ import annotations

from typing import Callable, TypedDict, cast

import torch
from torch import Tensor

from splatscale.model.gaussians import MAX_SH_DEGREE, GaussianModel
from splatscale.step.row_set import MOMENTS


class EngineState(TypedDict):
    model: dict[str, Tensor]      # GaussianModel.parameters(): means, quats, ... per row
    sh_degree: int                # the SH degree in use
    optimizer: dict               # exp_avg and exp_avg_sq per group (rows), and
                                  # GaussianAdam.state_dict(): steps per group, batch_size
    stats: dict[str, Tensor]      # the strategy's per-row state (RowSet.state), by name
    keys: Tensor                  # [N] int64: each Gaussian's name, whatever its row
    densify_events: int           # event numbers handed out (RowSet.next_event)


def state_problem(state) -> str | None:
    """What makes ``state`` (read from disk) not an ``EngineState``, or None: every
    part present, with its type, and every per-Gaussian tensor of the same rows."""
    if not isinstance(state, dict) or not all(k in state for k in EngineState.__annotations__):
        return "its engine state is incomplete"
    if type(state["sh_degree"]) is not int or not 0 <= state["sh_degree"] <= MAX_SH_DEGREE:
        return f"sh_degree is {state['sh_degree']!r}"
    if type(state["densify_events"]) is not int or state["densify_events"] < 0:
        return f"densify_events is {state['densify_events']!r}"
    try:
        model = GaussianModel(**state["model"], sh_degree=state["sh_degree"], keys=state["keys"])
    except (TypeError, ValueError, AttributeError) as error:
        return f"its Gaussians are malformed ({error})"
    non_finite = len(model.non_finite_rows())
    if non_finite:
        return f"{non_finite} of its Gaussians are NaN or infinite"
    optimizer, shapes = state["optimizer"], {n: t.shape for n, t in model.parameters().items()}
    if not isinstance(optimizer, dict) or not all(
            isinstance(optimizer.get(kind), dict) and set(optimizer[kind]) == set(shapes)
            and all(isinstance(t, Tensor) and t.shape == shapes[n]
                    for n, t in optimizer[kind].items()) for kind in MOMENTS):
        return "its optimiser state does not match its Gaussians"
    steps, batch_size = optimizer.get("steps"), optimizer.get("batch_size")
    if not isinstance(steps, dict) or set(steps) != set(shapes) or not all(
            type(v) is int and v >= 0 for v in steps.values()):
        return "its optimiser's step counts are not one count per parameter"
    if type(batch_size) is not int or batch_size < 1:
        return f"its optimiser's batch_size is {batch_size!r}"
    stats = state["stats"]
    if not isinstance(stats, dict) or not all(
            isinstance(name, str) and isinstance(t, Tensor) and len(t.shape) >= 1
            and t.shape[0] == len(model) for name, t in stats.items()):
        return "its per-Gaussian statistics do not match its Gaussians"
    return None


def state_size(state: EngineState) -> int:
    """How many Gaussians ``state`` holds."""
    return len(state["keys"])


def shard_rows(count: int, rank: int, world: int) -> slice:
    """The rows of rank ``rank`` in an even, contiguous split of ``count`` rows."""
    bounds = [count * r // world for r in range(world + 1)]
    return slice(bounds[rank], bounds[rank + 1])


def _map_rows(state: EngineState, rows: Callable[[list[Tensor]], Tensor],
              others: list[EngineState]) -> EngineState:
    """``state`` with every per-Gaussian tensor replaced by ``rows`` of it and of the
    same tensor in ``others``; the rest (step counts, SH degree) taken from ``state``."""
    states = [state, *others]

    def per_row(*path: str) -> Tensor:
        def at(s: EngineState) -> Tensor:
            value: object = s
            for part in path:
                value = cast(dict, value)[part]
            return cast(Tensor, value)
        return rows([at(s) for s in states])

    optimizer = dict(state["optimizer"])
    for kind in MOMENTS:
        optimizer[kind] = {n: per_row("optimizer", kind, n) for n in state["optimizer"][kind]}
    mapped = dict(state, optimizer=optimizer, keys=per_row("keys"),
                  model={n: per_row("model", n) for n in state["model"]},
                  stats={n: per_row("stats", n) for n in state["stats"]})
    return cast(EngineState, mapped)


def state_rows(state: EngineState, rows: slice) -> EngineState:
    """The part of ``state`` that holds Gaussians ``rows``."""
    return _map_rows(state, lambda tensors: tensors[0][rows].clone(), [])


def concat_states(states: list[EngineState]) -> EngineState:
    """Engine states of consecutive parts of the Gaussians, as one."""
    return _map_rows(states[0], torch.cat, states[1:])

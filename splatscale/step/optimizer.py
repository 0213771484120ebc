"""Adam over the Gaussian parameters, with the batch-size rule.

One group per parameter tensor, as in 3DGS. For a batch of B views (gradients
averaged over the batch) every learning rate is multiplied by sqrt(B), the
betas are raised to the power B and eps is divided by sqrt(B) (Grendel's rule),
so B = 16 trains like B = 1 in 1/16 of the steps.

The arithmetic is a functional core shared by both optimisers: ``step_factors``
gives a step's bias-corrected factors, and a device's ``adam_step`` (on the CPU
``adam_kernels``) applies them. ``GaussianAdam`` steps every row of a row
set at once; the offload engine's ``DeferredAdam`` replays the same steps on the
rows it needs, later. Each owns only its bookkeeping: the moments are rows of
the row set (``step/row_set.py``), edited with the parameters.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import AbstractSet, Iterable, Protocol

import torch
from torch import Tensor

from splatscale.backends import Backend, backend_for

BETAS = (0.9, 0.999)
EPS = 1e-15


@dataclass(frozen=True)
class AdamHyper:
    lr: float
    beta1: float
    beta2: float
    eps: float


def batch_hyperparameters(lr: float, batch_size: int, betas=BETAS, eps: float = EPS) -> AdamHyper:
    """The Adam settings that make a batch of ``batch_size`` views act like that many steps."""
    root = math.sqrt(batch_size)
    return AdamHyper(lr * root, betas[0] ** batch_size, betas[1] ** batch_size, eps / root)


def step_factors(h: AdamHyper, t: int) -> tuple[float, float]:
    """Adam step ``t``'s ``scale = -lr / (1 - beta1^t)`` and ``root_bias2 =
    sqrt(1 - beta2^t)`` (``adam_kernels``' form of torch.optim.Adam's formula)."""
    return -h.lr / (1 - h.beta1 ** t), math.sqrt(1 - h.beta2 ** t)


class AdamRows(Protocol):
    """What Adam steps: parameter groups and their two moments (``RowSet`` is one)."""

    @property
    def params(self) -> dict[str, Tensor]: ...

    moments: dict[str, dict[str, Tensor]]  # "exp_avg" and "exp_avg_sq", by group


class GaussianAdam:
    """Adam's bookkeeping for named groups: each group's step count and the batch
    size (``state_dict``'s schema: ``steps`` and ``batch_size``). ``step`` takes one
    dense step of every row of its groups, with ``backend``'s ``adam_step`` (None: the
    backend of the parameters' device)."""

    def __init__(self, groups: Iterable[str], batch_size: int = 1,
                 backend: Backend | None = None) -> None:
        self.batch_size = batch_size
        self.steps = {name: 0 for name in groups}
        self.backend = backend
        # By group: whether its two moments were zero when last read, and which they were.
        self._rest: dict[str, tuple[bool, list[tuple[weakref.ref, int]]]] = {}

    def hyper(self, lr: float) -> AdamHyper:
        return batch_hyperparameters(lr, self.batch_size)

    @property
    def decay(self) -> AdamHyper:
        """The batch's betas and eps (its learning rate is each step's own)."""
        return self.hyper(0.0)

    def count_step(self, name: str) -> int:
        """Count an Adam step of group ``name``; its number (bias correction's t)."""
        self.steps[name] += 1
        return self.steps[name]

    @torch.no_grad()
    def step(self, rows: AdamRows, learning_rates: dict[str, float],
             skipped: AbstractSet[str] = frozenset()) -> None:
        """One Adam step of every group but ``skipped`` (groups whose tensor was
        replaced after their gradient was taken); gradients cleared. A group without a
        gradient steps as with a zero one: its rows still move by their momentum
        (torch's Adam would skip it)."""
        for name, param in rows.params.items():
            if name in skipped:
                continue
            h = self.hyper(learning_rates[name])
            scale, root_bias2 = step_factors(h, self.count_step(name))
            moments = (rows.moments["exp_avg"][name], rows.moments["exp_avg_sq"][name])
            if param.grad is None and self._at_rest(name, moments):
                continue  # zero moments and a zero gradient: the step changes nothing
            grad = param.grad if param.grad is not None else torch.zeros_like(param)
            self._rest.pop(name, None)  # written below, through numpy: torch cannot tell
            backend = self.backend or backend_for(param.device)
            backend.adam_step(param.detach().view(-1), moments[0].view(-1), moments[1].view(-1),
                              grad.view(-1), scale, root_bias2, h.beta1, h.beta2, h.eps)
        for param in rows.params.values():
            param.grad = None

    def _at_rest(self, name: str, moments: tuple[Tensor, Tensor]) -> bool:
        """Whether both moments of group ``name`` are zero everywhere (as at the start,
        for SH coefficients a run does not use yet). Read once, then known while the
        same tensors stand with no write torch has counted (``_version``) since."""
        known = self._rest.get(name)
        if known is not None and all(ref() is t and version == t._version
                                     for (ref, version), t in zip(known[1], moments)):
            return known[0]
        at_rest = not any(bool(t.any()) for t in moments)
        self._rest[name] = (at_rest, [(weakref.ref(t), t._version) for t in moments])
        return at_rest

    def state_dict(self) -> dict:
        return {"steps": dict(self.steps), "batch_size": self.batch_size}

    def load_state_dict(self, state: dict) -> None:
        self.steps = dict(state["steps"])
        self.batch_size = state["batch_size"]

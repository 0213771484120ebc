"""Adam over the Gaussian parameters, with the batch-size rule.

One group per parameter tensor, as in 3DGS. For a batch of B views (gradients
averaged over the batch) every learning rate is multiplied by sqrt(B), the
betas are raised to the power B and eps is divided by sqrt(B) (Grendel's rule),
so B = 16 trains like B = 1 in 1/16 of the steps.

The state (first and second moments, step count) is plain tensors keyed by
parameter name, edited row by row with the parameters (``GaussianAdam.edit``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
from torch import Tensor

from splatscale.step.adam_kernels import adam_constants, adam_step

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


def adam_step_torch(param: Tensor, m: Tensor, v: Tensor, grad: Tensor, scale: float,
                    root_bias2: float, h: AdamHyper) -> None:
    """``adam_kernels``' step in torch's in-place operations, for tensors off the CPU
    (``lerp_`` is m + (1 - beta1) (g - m), the kernels' form)."""
    m.lerp_(grad, 1 - h.beta1)
    v.mul_(h.beta2).addcmul_(grad, grad, value=1 - h.beta2)
    param.addcdiv_(m, v.sqrt().div_(root_bias2).add_(h.eps), value=scale)


class GaussianAdam:
    """Adam, one group per named parameter; ``step`` is torch.optim.Adam's formula,
    computed by ``adam_kernels`` on the CPU (the offload engine replays skipped steps
    with the same code) and by ``adam_step_torch`` on other devices.

    It owns the parameters' optimiser state, whose schema is ``state_dict``'s:
    ``exp_avg`` and ``exp_avg_sq`` (per group, a tensor shaped as its parameter),
    ``steps`` (per group, the Adam steps it has taken) and ``batch_size``. Rows
    change only through ``edit``, parameter and moments together: densification,
    the opacity reset, moves between ranks and loading a checkpoint. A group
    edited since its gradient was taken is not stepped (the gradient belonged to
    the tensor the edit replaced).
    """

    def __init__(self, params: dict[str, Tensor], batch_size: int = 1) -> None:
        self.params = params
        self.batch_size = batch_size
        self.exp_avg = {n: torch.zeros_like(p) for n, p in params.items()}
        self.exp_avg_sq = {n: torch.zeros_like(p) for n, p in params.items()}
        self.steps = {n: 0 for n in params}
        self.edited: set[str] = set()  # since the last step

    def hyper(self, lr: float) -> AdamHyper:
        return batch_hyperparameters(lr, self.batch_size)

    @property
    def decay(self) -> AdamHyper:
        """The batch's betas and eps (its learning rate is each step's own)."""
        return self.hyper(0.0)

    def edit(self, param: Callable[[str, Tensor], Tensor],
             moment: Callable[[str, Tensor], Tensor], names: Iterable[str] | None = None
             ) -> None:
        """Replace the rows of groups ``names`` (all by default): each parameter ``p``
        becomes ``param(name, p)`` (a new leaf that requires grad) and each moment ``m``
        becomes ``moment(name, m)``."""
        for name in list(self.params) if names is None else names:
            with torch.no_grad():
                self.params[name] = param(name, self.params[name].detach()).requires_grad_(True)
            self.exp_avg[name] = moment(name, self.exp_avg[name])
            self.exp_avg_sq[name] = moment(name, self.exp_avg_sq[name])
            self.edited.add(name)

    def new_gradients(self) -> None:
        """The gradients about to be taken are of the current rows: edits until now
        are history."""
        self.edited.clear()

    def count_step(self, name: str) -> int:
        """Count an Adam step of group ``name``; its number (bias correction's t)."""
        self.steps[name] += 1
        return self.steps[name]

    def next_step_groups(self) -> list[str]:
        """The groups the step being taken updates: those not edited since their
        gradient was taken. The edits are history from here on."""
        groups = [name for name in self.params if name not in self.edited]
        self.edited.clear()
        return groups

    @torch.no_grad()
    def step(self, learning_rates: dict[str, float]) -> None:
        """One Adam step of every parameter that has a gradient: on the CPU by
        ``adam_kernels`` (one pass over each group), elsewhere in torch's operations."""
        for name in self.next_step_groups():
            param = self.params[name]
            if param.grad is None:
                continue
            h = self.hyper(learning_rates[name])
            t = self.count_step(name)
            scale, root_bias2 = -h.lr / (1 - h.beta1 ** t), math.sqrt(1 - h.beta2 ** t)
            flat = [x.detach().view(-1)
                    for x in (param, self.exp_avg[name], self.exp_avg_sq[name], param.grad)]
            if param.device.type != "cpu":
                adam_step_torch(*flat, scale, root_bias2, h)
                continue
            arrays = [x.numpy() for x in flat]
            dtype = arrays[0].dtype.type
            adam_step(*arrays, dtype(scale), dtype(root_bias2),
                      adam_constants(h.beta1, h.beta2, h.eps, arrays[0].dtype))

    def zero_grad(self) -> None:
        for param in self.params.values():
            param.grad = None

    def state_dict(self) -> dict:
        return {"exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq, "steps": self.steps,
                "batch_size": self.batch_size}

    def load_state_dict(self, state: dict, params: dict[str, Tensor]) -> None:
        """Continue from ``state`` (moments copied) with ``params`` as the parameters."""
        self.params = params
        self.exp_avg = {n: t.clone() for n, t in state["exp_avg"].items()}
        self.exp_avg_sq = {n: t.clone() for n, t in state["exp_avg_sq"].items()}
        self.steps = dict(state["steps"])
        self.batch_size = state["batch_size"]
        self.edited = set()

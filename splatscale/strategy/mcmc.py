"""3DGS as Markov-chain Monte Carlo (Kheradmand et al. 2024), as gsplat 1.5.3's
``MCMCStrategy`` and ``strategy/ops.py`` implement it (``MCMC``, its settings and
its operations).

Every ``refine_every`` images: Gaussians whose opacity fell to ``min_opacity``
are relocated onto live ones drawn in proportion to opacity (``relocate``),
then the model grows by 5 % of its count, up to the cap, by the same draw
(``add``). A Gaussian drawn k times and its k copies share its opacity and
scale so that together they render as it did (``relocated``). After every
step the means move by noise shaped by each Gaussian's covariance, gated to
the faint ones (``noise``); the loss carries L1 regularisers on opacity and
scale (``Regularisers``).

The draws are keyed, not streamed, so they do not depend on storage order or
on how the rows are spread over ranks: each Gaussian's weight drives a
Poisson clock whose ticks are hashes of its key and the event, and the n
earliest ticks of all clocks are n independent draws in proportion to the
weights (the merged clocks tick with probability w_i / sum w for Gaussian i).
``selection.smallest`` finds the n earliest over the ranks.

Where this differs from gsplat, and why: a relocated Gaussian's Adam moments
start at zero (gsplat leaves the dead row's old moments in the slot it reuses,
a matter of storage order); new keys and draws are keyed hashes rather than
``torch.multinomial``'s stream; the ratio correction is computed in float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from splatscale.model.gaussians import sigmoid
from splatscale.render.projection import quat_to_rotmat
from splatscale.step.keyed_random import keyed_hash, keyed_normal, keyed_uniform
from splatscale.step.row_set import RowSet
from splatscale.step.selection import Total, ascending, smallest
from splatscale.step.observer import Seen
from splatscale.strategy.base import EditsRows
from splatscale.step.schedule import crossed_multiple

MAX_GAUSSIANS = 1_000_000  # gsplat's cap_max
# gsplat's simple_trainer starts MCMC from opaque, small Gaussians.
INITIAL_OPACITY, INITIAL_SCALE = 0.5, 0.1
GROWTH = 1.05  # the model grows by 5 % at each refinement, up to the cap
MAX_RATIO = 51  # gsplat's table of binomials: n_max
NOISE_GATE = (100.0, 0.995)  # sigmoid(k (1 - opacity - x0)): noise for the faint only
# Words that keep the draws of different purposes apart (events are small numbers).
_DRAW, _NOISE = 1 << 40, 1 << 41
_FLOAT32_EPS = torch.finfo(torch.float32).eps
# C(n, k + 1) for n <= MAX_RATIO, k < MAX_RATIO: exact in float64 (all below 2^53).
_BINOMIALS = torch.tensor([[math.comb(n, k + 1) for k in range(MAX_RATIO)]
                           for n in range(MAX_RATIO + 1)], dtype=torch.float64)


@dataclass(frozen=True)
class Regularisers:
    """``opacity`` x mean(opacity) + ``scale`` x mean(scale), over all Gaussians and
    their three scales (gsplat's ``opacity_reg`` and ``scale_reg``)."""

    opacity: float = 0.01
    scale: float = 0.01

    def gradients(self, params: dict[str, Tensor], count: int) -> dict[str, Tensor]:
        """Their gradient with respect to ``params``' rows, the model having ``count``
        Gaussians in all (over ranks)."""
        opacity = sigmoid(params["opacity_logits"].detach())
        return {"opacity_logits": self.opacity * opacity * (1 - opacity) / count,
                "log_scales": self.scale * torch.exp(params["log_scales"].detach()) / (3 * count)}


@dataclass
class MCMCSettings:
    noise_lr: float = 5e5             # the means' noise, times their learning rate
    opacity_reg: float = 0.01         # L1 on opacity
    scale_reg: float = 0.01           # L1 on scale


class MCMC:
    """gsplat's MCMCStrategy (``settings``: a ``TrainConfig``): relocation and 5 %
    growth to ``max_gaussians`` every ``densify_interval`` images from
    ``densify_from`` to ``refine_until``, the dead being those of opacity at most
    ``prune_opacity``; noise on the means after every step; opacity and scale
    regularisers in the loss."""

    settings = MCMCSettings
    schedules: ClassVar[tuple[str, ...]] = ()  # its settings counted in images
    default_refine_until = 25_000  # images; gsplat's refine_stop_iter
    initial_opacity, initial_scale = INITIAL_OPACITY, INITIAL_SCALE
    edits_every_step = True  # the noise on the means
    absgrad = False

    def __init__(self, settings, extent: float) -> None:
        self.config = settings
        self.max_gaussians = settings.max_gaussians or MAX_GAUSSIANS
        self.regularisers = Regularisers(settings.opacity_reg, settings.scale_reg)

    def observes(self, after: int) -> bool:
        return False

    def observe(self, rows: RowSet, seen: Seen) -> None:
        """MCMC keeps no statistics."""

    def before_adam(self, engine: EditsRows, before: int, after: int) -> dict[str, int]:
        """Nothing: MCMC changes the set after Adam, as gsplat does."""
        return {}

    def after_adam(self, engine: EditsRows, before: int, after: int,
                   means_lr: float) -> dict[str, int]:
        c, changes = self.config, dict[str, int]()
        if after >= c.iterations:
            return changes
        event = crossed_multiple(before, after, c.densify_interval)
        if event is not None and c.densify_from < event < c.refine_until():
            changes = engine.edit_rows(lambda rows, total: {
                "relocated": relocate(rows, c.prune_opacity, total),
                "added": add(rows, self.max_gaussians, c.prune_opacity, total)})
        scale = means_lr * c.noise_lr
        engine.edit_rows(lambda rows, total: move_means(rows, noise(rows, scale, after)))
        return changes


def relocated(opacities: Tensor, scales: Tensor, ratios: Tensor) -> tuple[Tensor, Tensor]:
    """Opacity and scales shared by a Gaussian and its ``ratios - 1`` copies (the paper's
    equation 9): 1 - (1 - o)^(1/n), and the scales times o / sum_{i=1..n} sum_{k<i}
    C(i-1, k) (-1)^k o_new^(k+1) / sqrt(k+1), whose inner sums over i are C(n, k+1).
    Ratios above ``MAX_RATIO`` count as it, as in gsplat."""
    dtype = opacities.dtype
    o = opacities.to(torch.float64)
    n = ratios.clamp(1, MAX_RATIO)
    shared = 1 - (1 - o) ** (1 / n.to(torch.float64))
    k = torch.arange(MAX_RATIO, dtype=torch.float64, device=o.device)
    terms = _BINOMIALS.to(o.device)[n] * torch.where(k % 2 == 0, 1.0, -1.0) / torch.sqrt(k + 1)
    denominator = (terms * shared[:, None] ** (k + 1)).sum(dim=1)
    return shared.to(dtype), (scales.to(torch.float64) * (o / denominator)[:, None]).to(dtype)


def draw_counts(weights: Tensor, keys: Tensor, n: int, words: tuple[int, ...],
                total: Total) -> Tensor:
    """How many of ``n`` draws with replacement, in proportion to ``weights`` over all
    ranks' rows, fall on each row: the n earliest ticks of keyed Poisson clocks."""
    weights = weights.to(torch.float64)
    horizon = 1.5 * n / max(total(float(weights.sum())), 1e-300)
    while True:
        times, rows = _ticks(weights, keys, horizon, words)
        if total(len(times)) >= n:
            break
        horizon *= 2
    first = smallest(ascending(times), keys[rows], n, total)
    return torch.bincount(rows[first], minlength=len(weights))


def _ticks(weights: Tensor, keys: Tensor, horizon: float,
           words: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """Every tick until ``horizon`` of each row's clock (rate: its weight), and its row.
    A row's gaps are hashes of its key, ``words`` and the tick's number."""
    rows = (weights > 0).nonzero()[:, 0]
    clock = torch.zeros(len(rows), dtype=torch.float64, device=weights.device)
    times, owners, tick = [], [], 0
    while len(rows):
        clock = clock - torch.log(keyed_uniform(keys[rows], *words, tick)) / weights[rows]
        due = clock <= horizon
        rows, clock = rows[due], clock[due]
        times.append(clock)
        owners.append(rows)
        tick += 1
    return torch.cat(times), torch.cat(owners)


def _copy_drawn(rows: RowSet, counts: Tensor, event: int, keep: Tensor, min_opacity: float,
                reset_drawn: bool) -> None:
    """Give each drawn row its shared opacity and scale (its moments zeroed with
    ``reset_drawn``), then keep rows ``keep`` and append ``counts[i]`` copies of row i,
    child-major, keyed by the parent's key, ``event`` and the child's number."""
    drawn = counts > 0
    model = rows.model
    shared, scales = relocated(model.opacities.detach()[drawn], model.scales.detach()[drawn],
                               counts[drawn] + 1)
    shared = shared.clamp(min_opacity, 1 - _FLOAT32_EPS)
    new_values = {"opacity_logits": torch.logit(shared), "log_scales": torch.log(scales)}

    def param(name: str, tensor: Tensor) -> Tensor:
        if name in new_values:
            tensor = tensor.clone()
            tensor[drawn] = new_values[name]
        return tensor

    def moment(name: str, tensor: Tensor) -> Tensor:
        if reset_drawn:
            tensor = tensor.clone()
            tensor[drawn] = 0
        return tensor

    rows.map_values(list(model.parameters()), param, moment)
    copies: dict[str, list[Tensor]] = {name: [] for name in (*model.parameters(), "keys")}
    for child in range(int(counts.max()) if len(counts) else 0):
        parents = counts > child
        for name, tensor in model.parameters().items():
            copies[name].append(tensor.detach()[parents])
        copies["keys"].append(keyed_hash(model.keys[parents], event, child))
    rows.replace(keep, {n: torch.cat(t) for n, t in copies.items()} if copies["keys"] else None)


def relocate(rows: RowSet, min_opacity: float, total: Total) -> int:
    """Move the Gaussians of opacity at most ``min_opacity`` onto live ones drawn by
    opacity (gsplat's ``relocate``); how many moved, over all ranks. Collective."""
    event = rows.next_event()
    model = rows.model
    opacity = model.opacities.detach()
    dead = opacity <= min_opacity
    moved = total(int(dead.sum()))
    if moved == 0 or total(int((~dead).sum())) == 0:
        return 0
    counts = draw_counts(torch.where(dead, 0.0, opacity), model.keys, moved, (_DRAW, event),
                         total)
    _copy_drawn(rows, counts, event, ~dead, min_opacity, reset_drawn=True)
    return moved


def add(rows: RowSet, max_gaussians: int, min_opacity: float, total: Total) -> int:
    """Grow the model by 5 % of its count, at most to ``max_gaussians``, with copies of
    Gaussians drawn by opacity (gsplat's ``sample_add``); how many were added.
    Collective."""
    event = rows.next_event()
    model = rows.model
    count = int(total(len(model)))
    added = max(0, min(max_gaussians, int(GROWTH * count)) - count)
    if added == 0:
        return 0
    counts = draw_counts(model.opacities.detach(), model.keys, added, (_DRAW, event), total)
    keep = torch.ones(len(model), dtype=torch.bool, device=model.means.device)
    _copy_drawn(rows, counts, event, keep, min_opacity, reset_drawn=False)
    return added


def noise(rows: RowSet, scale: float, step: int) -> Tensor:
    """Each mean's move after step ``step``: Sigma z sigmoid(100 (1 - opacity - 0.995))
    ``scale``, z standard normal keyed by the Gaussian and the step, Sigma its
    covariance (gsplat's ``inject_noise_to_position``; ``scale`` is the means'
    learning rate times the noise learning rate)."""
    k, x0 = NOISE_GATE
    model = rows.model
    opacity = model.opacities.detach()
    gate = sigmoid(k * (1 - opacity - x0))
    rotations = quat_to_rotmat(model.quats.detach())
    covariance = rotations @ torch.diag_embed(model.scales.detach() ** 2) @ rotations.mT
    z = keyed_normal(model.keys, 3, _NOISE, step).to(opacity.dtype)
    return (covariance @ (z * (gate * scale)[:, None])[..., None])[..., 0]



def move_means(rows: RowSet, moves: Tensor) -> None:
    """Each mean moved by its row of ``moves``; the moments stay."""
    rows.map_values(["means"], lambda name, means: means + moves, lambda name, moment: moment)

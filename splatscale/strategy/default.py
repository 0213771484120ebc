"""3DGS's own strategy: gradient statistics, clone, split, prune and opacity resets.

The schedule (``ThreeDGS``): statistics of the view-space gradient from the
start until ``refine_until``; every ``densify_interval`` images after
``densify_from`` the Gaussians of a large mean gradient are cloned (small ones)
or split (large ones), the faint pruned, within ``max_gaussians`` when set; the
opacities are reset every ``opacity_reset_interval`` images.

With ``absgrad`` (AbsGS, Ye et al. 2024, as gsplat 1.5.3's ``absgrad=True``) the
statistic sums, pixel by pixel, the absolute value of each pixel's gradient, so
gradients of opposite sign in a large Gaussian's pixels no longer cancel: large
Gaussians over fine detail are split. Its threshold is its own
(``absgrad_threshold``, gsplat's recommended ``grow_grad2d`` of 0.0008).

Every operation edits the row set row by row together: kept rows keep their
Adam moments, new rows start at zero. Nothing depends on storage order: a new
Gaussian's key and a split's samples are hashes of its parent's key and the
edit's event number.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from splatscale.backends import backend_for
from splatscale.model.gaussians import sigmoid
from splatscale.render.projection import quat_to_rotmat
from splatscale.step.keyed_random import keyed_hash, keyed_normal
from splatscale.step.row_set import RowSet
from splatscale.step.selection import Total, descending, smallest
from splatscale.step.observer import Seen
from splatscale.strategy.base import EditsRows, totals
from splatscale.step.schedule import crossed_multiple, crosses

SPLIT_INTO = 2
SPLIT_SCALE_DIVISOR = 0.8 * SPLIT_INTO  # 3DGS: scale / (0.8 N)
RESET_OPACITY = 0.01
GRAD_SUM, COUNT = "grad_sum", "count"  # the per-row state: summed norms, views counted


@dataclass
class DefaultSettings:
    densify_grad_threshold: float = 2e-4
    percent_dense: float = 0.01
    opacity_reset_interval: int = 3_000
    absgrad: bool = False               # AbsGS's statistic
    absgrad_threshold: float = 8e-4     # its densify_grad_threshold


class GradientNorms:
    """The statistic as an observer: each view's view-space gradient norms (of the
    absolute per-pixel sums with ``absgrad``) added to the rows it saw."""

    def __init__(self, absgrad: bool = False) -> None:
        self.absgrad = absgrad

    def observe(self, rows: RowSet, seen: Seen) -> None:
        add_gradient_norms(rows, seen, self.absgrad)


class ThreeDGS(GradientNorms):
    """The original schedule (``settings``: a ``TrainConfig``), over a scene of
    ``extent``."""

    settings = DefaultSettings
    schedules = ("opacity_reset_interval",)  # its settings counted in images
    default_refine_until = 15_000  # images; 3DGS's densify_until_iter
    regularisers = None
    initial_opacity, initial_scale = 0.1, 1.0
    edits_every_step = False

    def __init__(self, settings, extent: float) -> None:
        super().__init__(settings.absgrad)
        self.config, self.extent = settings, extent
        self.max_gaussians = settings.max_gaussians

    def observes(self, after: int) -> bool:
        return after < self.config.refine_until()

    def before_adam(self, engine: EditsRows, before: int, after: int) -> dict[str, int]:
        c, changes = self.config, dict[str, int]()
        if not (self.observes(after) and after < c.iterations):
            return changes
        event = crossed_multiple(before, after, c.densify_interval)
        if event is not None and event > c.densify_from:
            threshold = c.absgrad_threshold if self.absgrad else c.densify_grad_threshold
            changes = engine.edit_rows(lambda rows, total: totals(densify_and_prune(
                rows, threshold, c.percent_dense, self.extent, c.prune_opacity,
                event > c.opacity_reset_interval, self.max_gaussians, total), total))
        white_start = c.white_background and before < c.densify_from <= after
        if crosses(before, after, c.opacity_reset_interval) or white_start:
            engine.edit_rows(lambda rows, total: reset_opacity(rows))
            changes["opacity_reset"] = 1
        return changes

    def after_adam(self, engine: EditsRows, before: int, after: int,
                   means_lr: float) -> dict[str, int]:
        """Nothing: 3DGS changes the set before Adam."""
        return {}


def view_space_scale(grads: Tensor, width: int, height: int, batch_size: int) -> Tensor:
    """What turns d loss / d means2d into 3DGS's units (NDC, per view's own loss)."""
    return torch.tensor([width / 2.0, height / 2.0], dtype=grads.dtype,
                        device=grads.device) * batch_size


def add_gradient_norms(rows: RowSet, seen: Seen, absgrad: bool = False) -> None:
    """Add each view's view-space gradient norms (of ``absgrad`` with it) to the
    statistics of the rows it saw (each row at most once a view), by the backend of
    the gradients' device."""
    grad_sum = rows.state_zeros(GRAD_SUM)
    count = rows.state_zeros(COUNT)
    for view in seen.views:
        grad = view.means2d_grad
        if absgrad:
            if view.absgrad is None:
                raise ValueError("add_gradient_norms: the step kept no absgrad to read")
            grad = view.absgrad
        scale = view_space_scale(grad, view.width, view.height, len(seen.views))
        backend_for(grad.device).add_view_norms(grad_sum, count, view.rows, grad, scale)


def copies_of(rows: RowSet, mask: Tensor, event: int, children: int = 1) -> dict[str, Tensor]:
    """The parameters of rows ``mask``, ``children`` copies of each (child-major), with
    new keys: hashes of the parent's key, the event and the child's number."""
    copies = {n: p.detach()[mask].repeat(children, *[1] * (p.dim() - 1))
              for n, p in rows.params.items()}
    parents = rows.model.keys[mask]
    copies["keys"] = torch.cat([keyed_hash(parents, event, child) for child in range(children)])
    return copies


def densify_and_prune(rows: RowSet, grad_threshold: float, percent_dense: float,
                      extent: float, min_opacity: float, prune_large: bool,
                      max_gaussians: int | None = None,
                      total: Total = lambda count: count) -> dict[str, int]:
    """Clone small, split large high-gradient Gaussians; prune faint ones, and with
    ``prune_large`` (after the first opacity reset) those larger than 0.1 x extent.

    3DGS also tests a screen-space radius there, but it zeroes those radii when
    it appends the new Gaussians just before, so that test never removes one;
    it is left out here. The edit's event number seeds the new keys and the
    split samples. With ``max_gaussians``, the model (all ranks' rows: ``total``
    sums a count over them) does not grow past it: of more candidates than
    there is room for, those with the largest gradient are densified, ties by
    key. The statistics start again at zero. Returns how many of this rank's
    rows were cloned, split and pruned.
    """
    event = rows.next_event()
    grads = torch.nan_to_num(rows.state_zeros(GRAD_SUM) / rows.state_zeros(COUNT), nan=0.0)
    chosen = grads >= grad_threshold
    if max_gaussians is not None:
        chosen = within_budget(chosen, grads, rows.model.keys, max_gaussians, total)
    large = rows.model.scales.detach().max(dim=1).values > percent_dense * extent
    clone = chosen & ~large
    split = chosen & large
    device = rows.model.means.device
    everything = torch.ones(len(rows), dtype=torch.bool, device=device)

    # Clone: exact copies, appended.
    rows.replace(everything, copies_of(rows, clone, event))
    split = torch.cat([split, torch.zeros(int(clone.sum()), dtype=torch.bool, device=device)])

    # Split: N samples from each selected Gaussian, scales shrunk; originals removed.
    samples = copies_of(rows, split, event, SPLIT_INTO)
    scales = torch.exp(samples["log_scales"])
    offsets = keyed_normal(samples["keys"], 3, event).to(scales.dtype) * scales
    rotations = quat_to_rotmat(samples["quats"])
    samples["means"] = samples["means"] + (rotations @ offsets[..., None])[..., 0]
    samples["log_scales"] = torch.log(scales / SPLIT_SCALE_DIVISOR)
    rows.replace(~split, samples)

    prune = rows.model.opacities.detach() < min_opacity
    if prune_large:
        prune |= rows.model.scales.detach().max(dim=1).values > 0.1 * extent
    rows.replace(~prune)
    rows.zero_state()
    return {"cloned": int(clone.sum()), "split": int(split.sum()), "pruned": int(prune.sum())}


def within_budget(candidates: Tensor, grads: Tensor, keys: Tensor, max_gaussians: int,
                  total: Total) -> Tensor:
    """The candidates densified without passing ``max_gaussians``: a clone or a split
    adds one Gaussian each, so as many as there is room for, largest gradient first."""
    room = max(0, max_gaussians - int(total(len(keys))))
    if total(int(candidates.sum())) <= room:
        return candidates
    rows = candidates.nonzero()[:, 0]
    chosen = torch.zeros_like(candidates)
    chosen[rows] = smallest(descending(grads[rows]), keys[rows], room, total)
    return chosen


def reset_opacity(rows: RowSet) -> dict[str, int]:
    """Clamp every opacity to at most 0.01 and forget its Adam moments. An opacity
    below the smallest normal number (one that rounds to zero among them) is raised
    to it: its logit stays finite."""
    def clamped(name: str, logits: Tensor) -> Tensor:
        smallest = torch.finfo(logits.dtype).tiny
        opacity = torch.clamp(sigmoid(logits), smallest, RESET_OPACITY)
        return torch.log(opacity / (1 - opacity))

    rows.map_values(["opacity_logits"], clamped, lambda name, moment: torch.zeros_like(moment))
    return {}

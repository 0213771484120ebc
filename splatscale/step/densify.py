"""Densification with 3DGS semantics: statistics, clone, split, prune, opacity reset.

Every operation edits the model's parameters and the optimiser's state row by
row together: kept rows keep their Adam moments, new rows start at zero.
Nothing depends on storage order: a new Gaussian's key and a split's samples
are hashes of its parent's key and the densification event.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from splatscale.model.gaussians import GaussianModel
from splatscale.render.projection import quat_to_rotmat
from splatscale.step.keyed_random import keyed_hash, keyed_normal
from splatscale.step.optimizer import GaussianAdam
from splatscale.step.selection import Total, descending, smallest

SPLIT_INTO = 2
SPLIT_SCALE_DIVISOR = 0.8 * SPLIT_INTO  # 3DGS: scale / (0.8 N)
RESET_OPACITY = 0.01


@dataclass
class DensifyStats:
    """Per Gaussian: summed view-space gradient norms and the number of views counted."""

    grad_sum: Tensor
    count: Tensor

    @classmethod
    def zeros(cls, n: int, dtype=torch.float32, device=None) -> "DensifyStats":
        return cls(torch.zeros(n, dtype=dtype, device=device),
                   torch.zeros(n, dtype=dtype, device=device))

    def add(self, gaussian_ids: Tensor, grad_norms: Tensor) -> None:
        """One view's visible Gaussians (each id at most once)."""
        self.grad_sum.index_add_(0, gaussian_ids, grad_norms.to(self.grad_sum.dtype))
        self.count.index_add_(0, gaussian_ids, torch.ones_like(grad_norms, dtype=self.count.dtype))


def view_space_grad_norms(means2d_grad: Tensor, width: int, height: int,
                          batch_size: int) -> Tensor:
    """Norms of d loss / d means2d in 3DGS's units (NDC, per view's own loss)."""
    scale = torch.tensor([width / 2.0, height / 2.0], dtype=means2d_grad.dtype,
                         device=means2d_grad.device) * batch_size
    return (means2d_grad * scale).norm(dim=-1)


def replace_rows(model: GaussianModel, optimizer: GaussianAdam, rows: Tensor,
                  new: dict[str, Tensor] | None = None) -> None:
    """Keep rows ``rows`` (index or mask), then append ``new`` rows (with their keys),
    whose moments start at zero."""
    keys = model.keys[rows]
    model.keys = keys if new is None else torch.cat([keys, new["keys"]])

    def param(name: str, tensor: Tensor) -> Tensor:
        return tensor[rows] if new is None else torch.cat([tensor[rows], new[name]])

    def moment(name: str, tensor: Tensor) -> Tensor:
        return (tensor[rows] if new is None
                else torch.cat([tensor[rows], torch.zeros_like(new[name])]))

    optimizer.edit(param, moment)
    model.set_parameters(optimizer.params)


def rows_of(model: GaussianModel, mask: Tensor, event: int,
             children: int = 1) -> dict[str, Tensor]:
    """The parameters of rows ``mask``, ``children`` copies of each (child-major), with
    new keys: hashes of the parent's key, the event and the child's number."""
    rows = {n: p.detach()[mask].repeat(children, *[1] * (p.dim() - 1))
            for n, p in model.parameters().items()}
    parents = model.keys[mask]
    rows["keys"] = torch.cat([keyed_hash(parents, event, child) for child in range(children)])
    return rows


def densify_and_prune(model: GaussianModel, optimizer: GaussianAdam, stats: DensifyStats,
                      grad_threshold: float, percent_dense: float, extent: float,
                      min_opacity: float, prune_large: bool, event: int,
                      max_gaussians: int | None = None,
                      total: Total = lambda count: count
                      ) -> tuple[DensifyStats, dict[str, int]]:
    """Clone small, split large high-gradient Gaussians; prune faint ones, and with
    ``prune_large`` (after the first opacity reset) those larger than 0.1 x extent.

    3DGS also tests a screen-space radius there, but it zeroes those radii when
    it appends the new Gaussians just before, so that test never removes one;
    it is left out here. ``event`` numbers this densification: with the keys, it
    seeds the new keys and the split samples. With ``max_gaussians``, the model
    (all ranks' rows: ``total`` sums a count over them) does not grow past it: of
    more candidates than there is room for, those with the largest gradient are
    densified, ties by key. Returns fresh statistics, and how many of this
    process' rows were cloned, split and pruned.
    """
    grads = torch.nan_to_num(stats.grad_sum / stats.count, nan=0.0)
    chosen = grads >= grad_threshold
    if max_gaussians is not None:
        chosen = within_budget(chosen, grads, model.keys, max_gaussians, total)
    large = model.scales.detach().max(dim=1).values > percent_dense * extent
    clone = chosen & ~large
    split = chosen & large
    device = model.means.device
    all_rows = torch.ones(len(model), dtype=torch.bool, device=device)

    # Clone: exact copies, appended.
    cloned = rows_of(model, clone, event)
    replace_rows(model, optimizer, all_rows, cloned)
    split = torch.cat([split, torch.zeros(int(clone.sum()), dtype=torch.bool, device=device)])

    # Split: N samples from each selected Gaussian, scales shrunk; originals removed.
    rows = rows_of(model, split, event, SPLIT_INTO)
    scales = torch.exp(rows["log_scales"])
    samples = keyed_normal(rows["keys"], 3, event).to(scales.dtype) * scales
    rotations = quat_to_rotmat(rows["quats"])
    rows["means"] = rows["means"] + (rotations @ samples[..., None])[..., 0]
    rows["log_scales"] = torch.log(scales / SPLIT_SCALE_DIVISOR)
    replace_rows(model, optimizer, ~split, rows)

    prune = model.opacities.detach() < min_opacity
    if prune_large:
        prune |= model.scales.detach().max(dim=1).values > 0.1 * extent
    replace_rows(model, optimizer, ~prune)
    counts = {"cloned": int(clone.sum()), "split": int(split.sum()), "pruned": int(prune.sum())}
    return DensifyStats.zeros(len(model), stats.grad_sum.dtype, device), counts


def within_budget(candidates: Tensor, grads: Tensor, keys: Tensor, max_gaussians: int,
                  total: Total) -> Tensor:
    """The candidates densified without passing ``max_gaussians``: a clone or a split
    adds one Gaussian each, so as many as there is room for, largest gradient first."""
    room = max(0, max_gaussians - total(len(keys)))
    if total(int(candidates.sum())) <= room:
        return candidates
    rows = candidates.nonzero()[:, 0]
    chosen = torch.zeros_like(candidates)
    chosen[rows] = smallest(descending(grads[rows]), keys[rows], room, total)
    return chosen


def reset_opacity(model: GaussianModel, optimizer: GaussianAdam) -> None:
    """Clamp every opacity to at most 0.01 and forget its Adam moments."""
    def clamped(name: str, logits: Tensor) -> Tensor:
        opacity = torch.clamp_max(torch.sigmoid(logits), RESET_OPACITY)
        return torch.log(opacity / (1 - opacity))

    optimizer.edit(clamped, lambda name, moment: torch.zeros_like(moment), ["opacity_logits"])
    model.set_parameters(optimizer.params)

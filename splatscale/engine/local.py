"""LocalEngine: the whole model, its gradients and optimiser state on one device."""

from __future__ import annotations

import torch

from splatscale.data.cameras import Camera
from splatscale.engine import StepResult, TrainView
from splatscale.model.gaussians import GaussianModel
from splatscale.render import RenderOutput, project, rasterize
from splatscale.step import densify
from splatscale.step.loss import photometric_loss, psnr
from splatscale.step.optimizer import GaussianAdam


class LocalEngine:
    def __init__(self, model: GaussianModel, batch_size: int, background: torch.Tensor,
                 ssim_weight: float = 0.2) -> None:
        self.model = model.requires_grad_(True)
        self.batch_size = batch_size
        self.background = background
        self.ssim_weight = ssim_weight
        self.optimizer = GaussianAdam(self.model.parameters(), batch_size)
        self.stats = densify.DensifyStats.zeros(len(model), model.means.dtype)
        self.densify_events = 0

    def forward_backward(self, batch: list[TrainView], track_stats: bool) -> StepResult:
        cameras = [view.camera for view in batch]
        splats = project(self.model, cameras)
        splats.means2d.retain_grad()
        loss, psnrs = 0.0, []
        for i, view in enumerate(batch):
            out = rasterize(splats.of_camera(i), view.camera.width, view.camera.height,
                            background=self.background)
            loss = loss + photometric_loss(out.rgb, view.target, self.ssim_weight)
            psnrs.append(psnr(out.rgb.detach(), view.target))
        loss = loss / len(batch)
        loss.backward()
        if track_stats:
            self._track(splats, batch)
        return StepResult(loss.item(), sum(psnrs) / len(psnrs))

    def _track(self, splats, batch: list[TrainView]) -> None:
        if splats.means2d.grad is None:  # nothing was visible
            return
        for i, view in enumerate(batch):
            lo, hi = splats.camera_offsets[i], splats.camera_offsets[i + 1]
            norms = densify.view_space_grad_norms(splats.means2d.grad[lo:hi], view.camera.width,
                                                  view.camera.height, len(batch))
            self.stats.add(splats.gaussian_ids[lo:hi], norms)

    def densify_and_prune(self, grad_threshold: float, percent_dense: float, extent: float,
                          min_opacity: float, prune_large: bool) -> None:
        self.stats = densify.densify_and_prune(self.model, self.optimizer, self.stats,
                                               grad_threshold, percent_dense, extent,
                                               min_opacity, prune_large, self.densify_events)
        self.densify_events += 1

    def reset_opacity(self) -> None:
        densify.reset_opacity(self.model, self.optimizer)

    def optimizer_step(self, learning_rates: dict[str, float]) -> None:
        self.optimizer.step(learning_rates)
        self.optimizer.zero_grad()

    def set_sh_degree(self, degree: int) -> None:
        self.model.sh_degree = degree

    @torch.no_grad()
    def render(self, camera: Camera) -> RenderOutput:
        return rasterize(project(self.model, [camera]).of_camera(0), camera.width,
                         camera.height, background=self.background)

    def any_rank(self, flag: bool) -> bool:
        return flag

    def num_gaussians(self) -> int:
        return len(self.model)

    def gather_model(self) -> GaussianModel:
        return self.model.detach()

    def state_dict(self) -> dict:
        return {"model": {n: t.detach().clone() for n, t in self.model.parameters().items()},
                "sh_degree": self.model.sh_degree,
                "optimizer": self.optimizer.state_dict(),
                "stats": {"grad_sum": self.stats.grad_sum, "count": self.stats.count},
                "keys": self.model.keys.clone(), "densify_events": self.densify_events}

    def load_state_dict(self, state: dict) -> None:
        self.model = GaussianModel(**{n: t.clone() for n, t in state["model"].items()},
                                   sh_degree=state["sh_degree"],
                                   keys=state["keys"].clone()).requires_grad_(True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.optimizer.params = self.model.parameters()
        self.stats = densify.DensifyStats(state["stats"]["grad_sum"].clone(),
                                          state["stats"]["count"].clone())
        self.densify_events = state["densify_events"]

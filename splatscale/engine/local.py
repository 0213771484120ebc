"""LocalEngine: the whole model, its gradients and optimiser state on one device.

The device is the CPU (the cpu backend's numba kernels) or a CUDA GPU (gsplat's
kernels, Adam and densification as torch operations on device tensors).
Checkpoints and exported models are CPU tensors whatever the device, so runs
resume on either.
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch
from torch import Tensor

from splatscale.data.cameras import Camera
from splatscale.engine import StepResult, TrainView
from splatscale.engine.device_images import DeviceImages
from splatscale.model.gaussians import GaussianModel
from splatscale.render import Backend, RenderOutput, Splats, project, rasterize
from splatscale.render.projection import Visibility
from splatscale.step import densify
from splatscale.step.loss import photometric_loss, psnr
from splatscale.step.optimizer import GaussianAdam


class LocalEngine:
    def __init__(self, model: GaussianModel, batch_size: int, background: torch.Tensor,
                 ssim_weight: float = 0.2, device: str = "cpu",
                 backend: Backend | None = None) -> None:
        """``device`` renders (and here holds everything); ``backend`` None: the device's."""
        self.device = torch.device(device)
        self.backend = backend
        self.model = self._stored(model).requires_grad_(True)
        self.batch_size = batch_size
        self.background = background.to(self.device)
        self.targets = DeviceImages(self.device)
        self.ssim_weight = ssim_weight
        self.optimizer = GaussianAdam(self.model.parameters(), batch_size)
        self.stats = self._zero_stats()
        self.densify_events = 0

    def _stored(self, model: GaussianModel) -> GaussianModel:
        """``model`` where this engine keeps its master copy: on the device."""
        return model.to(device=self.device)

    def _zero_stats(self) -> densify.DensifyStats:
        return densify.DensifyStats.zeros(len(self.model), self.model.means.dtype,
                                          self.model.means.device)

    def forward_backward(self, batch: list[TrainView], track_stats: bool) -> StepResult:
        rows, working, seen = self._working_set([view.camera for view in batch])
        splats, result = self._loss_backward(working, batch, seen)
        if track_stats:
            self._track(splats, batch, rows[splats.gaussian_ids.to(rows.device)])
        self._gradients_taken(rows, working)
        return result

    # Where an engine keeps its Gaussians: here all on one device, in ``self.model``.
    # The offload engine overrides these four to keep them in host memory.

    def _working_set(self, cameras: list[Camera]
                     ) -> tuple[Tensor, GaussianModel, Visibility | None]:
        """The rows a batch of ``cameras`` renders from, the model of those rows, and
        their visibility if it is known already."""
        return torch.arange(len(self.model), device=self.model.means.device), self.model, None

    def _gradients_taken(self, rows: Tensor, working: GaussianModel) -> None:
        """The working model holds this step's gradients (here: ``self.model`` does)."""

    def _bring_current(self) -> None:
        """Make ``self.model`` and the optimiser state current (here: always)."""

    def _rows_changed(self) -> None:
        """``self.model``'s rows were replaced (moved between ranks)."""

    def _loss_backward(self, model: GaussianModel, batch: list[TrainView],
                       seen: Visibility | None = None) -> tuple[Splats, StepResult]:
        """Render ``batch`` from ``model``, its loss averaged over the views, backward."""
        splats = project(model, [view.camera for view in batch], seen, self.backend)
        splats.means2d.retain_grad()
        loss, psnrs = 0.0, []
        for i, view in enumerate(batch):
            out = rasterize(splats.of_camera(i), view.camera.width, view.camera.height,
                            background=self.background, backend=self.backend)
            target = self.targets.target(view)
            loss = loss + photometric_loss(out.rgb, target, self.ssim_weight)
            psnrs.append(psnr(out.rgb.detach(), target))
        loss = loss / len(batch)
        loss.backward()
        return splats, StepResult(loss.item(), sum(psnrs) / len(psnrs))

    def _track(self, splats: Splats, batch: list[TrainView], rows: Tensor) -> None:
        """Add the views' view-space gradient norms to the statistics of ``rows`` (the
        model rows of the splats)."""
        if splats.means2d.grad is None:  # nothing was visible
            return
        for i, view in enumerate(batch):
            lo, hi = splats.camera_offsets[i], splats.camera_offsets[i + 1]
            norms = densify.view_space_grad_norms(splats.means2d.grad[lo:hi], view.camera.width,
                                                  view.camera.height, len(batch))
            self.stats.add(rows[lo:hi], norms.to(rows.device))

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
        """On the device, from the rows the camera renders from."""
        _, model, seen = self._working_set([camera])
        return rasterize(project(model, [camera], seen, self.backend).of_camera(0),
                         camera.width, camera.height, background=self.background,
                         backend=self.backend)

    def shard(self) -> tuple[int, int]:
        return 0, 1

    def any_rank(self, flag: bool) -> bool:
        return flag

    def num_gaussians(self) -> int:
        return len(self.model)

    def model_parts(self) -> Iterator[GaussianModel]:
        yield self.model.detach().to(device="cpu")

    def non_finite(self) -> int:
        return len(self.model.non_finite_rows())

    def state_dict(self) -> dict:
        """The engine's state as CPU tensors, copied."""
        def saved(t: Tensor) -> Tensor:
            return t.detach().to("cpu", copy=True)
        optimizer = self.optimizer.state_dict()
        return {"model": {n: saved(t) for n, t in self.model.parameters().items()},
                "sh_degree": self.model.sh_degree,
                "optimizer": dict(optimizer, **{kind: {n: saved(t) for n, t in
                                                       optimizer[kind].items()}
                                                for kind in ("exp_avg", "exp_avg_sq")}),
                "stats": {"grad_sum": saved(self.stats.grad_sum),
                          "count": saved(self.stats.count)},
                "keys": saved(self.model.keys), "densify_events": self.densify_events}

    def load_state_dict(self, state: dict) -> None:
        home = self._stored(GaussianModel(**state["model"], sh_degree=state["sh_degree"],
                                          keys=state["keys"]))
        self.model = GaussianModel(**{n: t.clone() for n, t in home.parameters().items()},
                                   sh_degree=home.sh_degree,
                                   keys=home.keys.clone()).requires_grad_(True)
        device = self.model.means.device
        optimizer = state["optimizer"]
        self.optimizer.load_state_dict(dict(optimizer, **{
            kind: {n: t.to(device) for n, t in optimizer[kind].items()}
            for kind in ("exp_avg", "exp_avg_sq")}), self.model.parameters())
        self.stats = densify.DensifyStats(state["stats"]["grad_sum"].to(device, copy=True),
                                          state["stats"]["count"].to(device, copy=True))
        self.densify_events = state["densify_events"]


def _map_rows(state: dict, rows: Callable[[list[Tensor]], Tensor], others: list[dict]) -> dict:
    """``state`` with every per-Gaussian tensor replaced by ``rows`` of it and of the
    same tensor in ``others``; the rest (step counts, SH degree) taken from ``state``."""
    def per_row(get: Callable[[dict], Tensor]) -> Tensor:
        return rows([get(s) for s in [state, *others]])

    optimizer = dict(state["optimizer"])
    for kind in ("exp_avg", "exp_avg_sq"):
        optimizer[kind] = {n: per_row(lambda s, n=n, kind=kind: s["optimizer"][kind][n])
                           for n in state["optimizer"][kind]}
    return dict(state, optimizer=optimizer, keys=per_row(lambda s: s["keys"]),
                model={n: per_row(lambda s, n=n: s["model"][n]) for n in state["model"]},
                stats={n: per_row(lambda s, n=n: s["stats"][n]) for n in state["stats"]})


def state_rows(state: dict, rows: slice) -> dict:
    """The part of an engine state (``LocalEngine.state_dict``) that holds Gaussians ``rows``."""
    return _map_rows(state, lambda tensors: tensors[0][rows].clone(), [])


def concat_states(states: list[dict]) -> dict:
    """Engine states of consecutive parts of the Gaussians, as one."""
    return _map_rows(states[0], torch.cat, states[1:])

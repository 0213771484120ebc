"""Engines: how one training step is executed.

The contract every engine implements (``Engine`` below) splits the work so
that the Trainer never asks which engine it has:

- The **Trainer** owns the schedule: which views form each batch, the
  learning rates of each step, when statistics are gathered, when to densify,
  reset opacities or raise the SH degree, evaluation, logging and checkpoints.
  It passes each batch as target images with their cameras.
- The **engine** owns everything per Gaussian: the parameters, their
  gradients, the optimiser state and the densification statistics, wherever
  they live (one device; sharded over ranks; in host memory). It hands out a
  model only part by part (``model_parts``), for export, never whole on one rank.

One training step is, in this order (3DGS's order):

1. ``forward_backward(batch, track_stats)``: render the batch, loss averaged
   over its views, gradients; with ``track_stats`` add the views' view-space
   gradient norms to the densification statistics. Returns ``StepResult``.
2. optionally ``densify_and_prune(...)`` and/or ``reset_opacity()``;
3. ``optimizer_step(learning_rates)``: Adam with the batch-size rule. A
   parameter group whose rows step 2 replaced is not stepped (its gradient
   belonged to the rows it replaced).

``state_dict``/``load_state_dict`` hold everything needed to continue the run
bit for bit for the engine's ``shard()`` of the Gaussians, as an ``EngineState``
(``engine/state.py``: parameters, Adam state, statistics, keys, densification
count), which checkpoints read and write.
Every method is called by every rank in the same order: with several ranks
they are collective.

Every engine is an ``engine.Engine`` of two parts: where the rows live
(``rows.ResidentRows``, or ``offload.rows.OffloadedRows``: GS-Scale's host store,
culling, deferred CPU Adam, pipelining) and how a step is computed
(``one_process.OneProcess``, or ``distributed.compute.Ranks``: Grendel's pixel
partition, balancer and sparse all-to-all). ``local_engine``,
``offload.offload_engine``, ``distributed.distributed_engine`` and
``offload.sharded.offloaded_shard_engine`` make the four combinations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Protocol

from torch import Tensor

from splatscale.data.cameras import Camera
from splatscale.data.images import pixels_as_float
from splatscale.model.gaussians import GaussianModel
from splatscale.engine.state import EngineState
from splatscale.render import RenderOutput

if TYPE_CHECKING:
    from splatscale.step.mcmc import Regularisers


class TrainView:
    """A view of a batch: its camera and its target image, float32 [H, W, 3] in
    [0, 1]. The target is given, or read from the image's uint8 pixels when an engine
    first asks: ``read(rows)`` reads them whole (``rows`` None) or only the rows
    ``[y0, y1)`` a rank renders, and an engine may take them as they are (a GPU keeps
    a quarter of the bytes)."""

    def __init__(self, camera: Camera, target: Tensor | None = None,
                 read: Callable[[tuple[int, int] | None], Tensor] | None = None) -> None:
        if (target is None) == (read is None):
            raise ValueError("TrainView: give either a target or a way to read it")
        self.camera, self._target, self._read = camera, target, read
        self._pixels: Tensor | None = None

    @property
    def target(self) -> Tensor:
        if self._target is None:
            self._target = pixels_as_float(self.pixels())
        return self._target

    def pixels(self) -> Tensor | None:
        """The uint8 pixels the target is read from; None for a target given as it is."""
        if self._read is not None and self._pixels is None:
            self._pixels = self._read(None)
        return self._pixels

    def target_rows(self, y0: int, y1: int, like: Tensor) -> Tensor:
        """Rows ``[y0, y1)`` of the target on ``like``'s device in its dtype, reading no
        others where it is not yet read (and moving them as pixels)."""
        if self._target is None and self._pixels is None:
            return pixels_as_float(self._read((y0, y1)).to(like.device)).to(like.dtype)
        return self.target[y0:y1].to(like)


@dataclass
class StepResult:
    loss: float
    psnr: float  # mean over the batch's views
    # What the step measured, by engine (as gsplat's rasterization() returns meta):
    # offload "host_to_device_bytes", "candidates", "visible", "sent_a_step_early";
    # distributed "bands"
    # (each rank's rows of each view) and "render_seconds" (this rank's own).
    diagnostics: dict[str, object] = field(default_factory=dict)


class Engine(Protocol):
    def expect(self, cameras: list[Camera], learning_rates: dict[str, float]) -> None:
        """Before ``forward_backward``, when the caller knows them: the cameras of the
        step after this one, and the learning rates of this one's ``optimizer_step``.
        An engine may get that step's Gaussians ready early; nothing depends on it."""
        ...

    def forward_backward(self, batch: list[TrainView], track_stats: bool,
                         regularisers: "Regularisers | None" = None) -> StepResult:
        """With ``regularisers``, their gradient over every Gaussian is added to the
        step's (MCMC)."""
        ...

    def densify_and_prune(self, grad_threshold: float, percent_dense: float, extent: float,
                          min_opacity: float, prune_large: bool,
                          max_gaussians: int | None = None) -> dict[str, int]:
        """3DGS's densification; with ``max_gaussians``, never past that many Gaussians
        over all ranks (``step/densify.py``). How many were cloned, split and pruned."""
        ...

    def reset_opacity(self) -> None: ...

    def optimizer_step(self, learning_rates: dict[str, float]) -> None: ...

    def relocate_and_add(self, max_gaussians: int, min_opacity: float) -> dict[str, int]:
        """MCMC's refinement (``step/mcmc.py``), after ``optimizer_step``: how many
        Gaussians were relocated and added."""
        ...

    def inject_noise(self, scale: float, step: int) -> None:
        """MCMC's noise on the means after ``optimizer_step`` of step ``step``."""
        ...

    def set_sh_degree(self, degree: int) -> None: ...

    def render(self, camera: Camera) -> RenderOutput: ...

    def num_gaussians(self) -> int: ...

    def model_parts(self) -> Iterator[GaussianModel]:
        """The whole model in consecutive parts, on the rank that writes (rank 0); the
        other ranks send theirs while iterating and yield nothing."""
        ...

    def non_finite(self) -> int:
        """How many Gaussians, over all ranks, have a NaN or infinite parameter."""
        ...

    def state_dict(self) -> EngineState: ...

    def load_state_dict(self, state: EngineState) -> None: ...

    def shard(self) -> tuple[int, int]:
        """(rank, world) of the part of the Gaussians this engine holds; (0, 1): all."""
        ...

    def any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` is set on any rank (so all ranks act on one rank's Ctrl-C)."""
        ...

    def close(self) -> None:
        """End the threads the engine runs beside its steps, once their work is done.
        Post: no thread of the engine's is alive; it is not stepped again, but what
        it holds may still be read (``render``, ``model_parts``, ``state_dict``)."""
        ...


__all__ = ["Engine", "StepResult", "TrainView"]

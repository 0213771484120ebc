"""Engines: how one training step is executed.

The contract every engine implements (``Engine`` below) splits the work so
that the Trainer never asks which engine it has:

- The **Trainer** owns the run: which views form each batch, the learning
  rates of each step, evaluation, logging and checkpoints. Its **strategy**
  (``splatscale.strategy``) owns when and how the set of Gaussians changes.
  Each batch is passed as target images with their cameras.
- The **engine** owns everything per Gaussian: the row set (parameters, Adam
  moments, keys, the strategy's per-row state) wherever it lives (one device;
  sharded over ranks; in host memory), and the optimiser. It hands out a model
  only part by part (``model_parts``), for export, never whole on one rank.

One training step is, in this order::

    forward_backward(batch, observer, regularisers)   render, loss, gradients
    strategy.before_adam(engine, ...)                 edit_rows(...): 3DGS
    optimizer_step(learning_rates)                    Adam, the batch-size rule
    strategy.after_adam(engine, ...)                  edit_rows(...): MCMC

``state_dict``/``load_state_dict`` hold everything needed to continue the run
bit for bit for the engine's ``shard()`` of the Gaussians, as an ``EngineState``
(``engine/state.py``), which checkpoints read and write. Every method is called
by every rank in the same order: with several ranks they are collective.

The modules: ``composed`` (the engine: a ``Rows`` part and a ``Compute`` part),
``factory`` (``make_engine``: the one way to make one), ``rows`` (the rows on
the device), ``offload`` (GS-Scale's rows in host memory), ``one_process`` and
``distributed`` (Grendel's compute over ranks), ``seen`` (what a step saw, for
the strategy), ``state`` (the checkpointed state), ``device_images`` (targets
kept on the device).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Protocol, TypeVar

from torch import Tensor

from splatscale.data.cameras import Camera
from splatscale.data.images import pixels_as_float
from splatscale.model.gaussians import GaussianModel
from splatscale.engine.state import EngineState
from splatscale.render import RenderOutput

if TYPE_CHECKING:
    from splatscale.step.row_set import RowSet
    from splatscale.step.selection import Total
    from splatscale.step.observer import GradientTerm, Observer

Result = TypeVar("Result")


class TrainView:
    """A view of a batch: its camera and its target image, float32 [H, W, 3] in
    [0, 1]. The target is given, or read from the image's uint8 pixels when an engine
    first asks: ``read(rows)`` reads them whole (``rows`` None) or only the rows
    ``[y0, y1)`` a rank renders, and an engine may take them as they are (a GPU keeps
    a quarter of the bytes). A target of four channels carries the image's mask in
    the fourth (1: train, 0: ignore; ``step/loss.py``); ``masked`` says so of a view
    that is read, before it is. ``appearance``, where given, is the image's colour
    transform (``step/appearance.py``), a leaf: an engine maps its render by it before
    the loss and leaves the transform's gradient, summed over ranks, in its ``grad``."""

    def __init__(self, camera: Camera, target: Tensor | None = None,
                 read: Callable[[tuple[int, int] | None], Tensor] | None = None,
                 appearance: Tensor | None = None, masked: bool = False) -> None:
        if (target is None) == (read is None):
            raise ValueError("TrainView: give either a target or a way to read it")
        self.camera, self._target, self._read = camera, target, read
        self.masked = masked if target is None else target.shape[-1] == 4
        self.appearance = appearance
        self._pixels: Tensor | None = None

    @property
    def target(self) -> Tensor:
        if self._target is None:
            self._target = pixels_as_float(self._whole_pixels())
        return self._target

    def pixels(self) -> Tensor | None:
        """The uint8 pixels the target is read from; None for a target given as it is."""
        return None if self._read is None else self._whole_pixels()

    def _whole_pixels(self) -> Tensor:
        assert self._read is not None, "a view is given its target or a way to read it"
        if self._pixels is None:
            self._pixels = self._read(None)
        return self._pixels

    def target_rows(self, y0: int, y1: int, like: Tensor) -> Tensor:
        """Rows ``[y0, y1)`` of the target on ``like``'s device in its dtype, reading no
        others where it is not yet read (and moving them as pixels)."""
        if self._target is None and self._pixels is None and self._read is not None:
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

    def read_ahead(self, read: Callable[[], None]) -> None:
        """Where this engine reads the next batch's images whole, ``read()`` starts
        reading them now (a rank reads only the rows it renders, when it renders)."""
        ...

    def forward_backward(self, batch: list[TrainView], observer: "Observer | None" = None,
                         regularisers: "GradientTerm | None" = None) -> StepResult:
        """Render ``batch``, the loss averaged over its views, the gradients; tell
        ``observer`` what the step saw; with ``regularisers``, their gradient over
        every Gaussian is added to the step's (MCMC)."""
        ...

    def edit_rows(self, edit: "Callable[[RowSet, Total], Result]") -> Result:
        """Bring every row current, run ``edit(row_set, total)`` on this rank's rows
        (``total`` sums a number over the ranks), even the shards out where rows were
        replaced; ``edit``'s result. Groups it replaced are not stepped with the
        gradient taken before it."""
        ...

    def optimizer_step(self, learning_rates: dict[str, float]) -> None: ...

    def set_sh_degree(self, degree: int) -> None:
        """Render with SH of ``degree`` from now on; the rows then hold ``shN``'s
        coefficients up to it (``step/sh_bands.py``). Collective; pre: between steps
        (after ``optimizer_step``, before ``forward_backward``)."""
        ...

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

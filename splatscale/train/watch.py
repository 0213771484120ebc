"""What the Trainer tells a watcher (the live viewer) and asks of it between steps.

The Trainer calls every method on every rank, in the same order; it turns each
answer into one agreed by all ranks (``Engine.any_rank``) before acting on it,
so a watcher on rank 0 alone (the others given ``Bystander``) steers the run.
A watcher never changes the training: a watched run, paused or not, ends bit
for bit as an unwatched one.
"""

from __future__ import annotations

import time
from typing import Protocol

from splatscale.model.gaussians import GaussianModel


class Watcher(Protocol):
    def after_step(self, entry: dict, total_images: int) -> None:
        """The step's log entry (images, loss, psnr, num_gaussians, images_per_second)."""
        ...

    def model_due(self) -> bool:
        """Whether the watcher wants the current model now."""
        ...

    def show_model(self, model: GaussianModel | None) -> None:
        """The current model, a copy the watcher may keep (None on the ranks that do not
        gather it)."""
        ...

    def checkpoint_requested(self) -> bool:
        """Whether to save a checkpoint now (asked once: the request is then taken)."""
        ...

    def checkpoint_saved(self, images: int) -> None: ...

    def paused(self) -> bool:
        """Whether to hold training before the next step."""
        ...

    def wait(self, seconds: float) -> None:
        """Spend ``seconds`` while paused (serving the page meanwhile)."""
        ...

    def serve(self) -> None:
        """Do what the page asked for since the last call, without waiting."""
        ...

    def finished(self, images: int) -> None: ...


class Bystander:
    """The watcher of a rank that does not serve the page: it asks for nothing and
    takes its part in what the serving rank asks for."""

    def after_step(self, entry: dict, total_images: int) -> None:
        pass

    def model_due(self) -> bool:
        return False

    def show_model(self, model: GaussianModel | None) -> None:
        pass

    def checkpoint_requested(self) -> bool:
        return False

    def checkpoint_saved(self, images: int) -> None:
        pass

    def paused(self) -> bool:
        return False

    def wait(self, seconds: float) -> None:
        time.sleep(seconds)

    def serve(self) -> None:
        pass

    def finished(self, images: int) -> None:
        pass

"""When and how training changes the set of Gaussians: 3DGS's schedule, or MCMC.

The Trainer calls a strategy at fixed points of each step, with the images
seen before and after the step's batch (schedules count images, so they hold
for any batch size)::

    result = engine.forward_backward(batch, strategy.tracks_stats(after),
                                     strategy.regularisers)
    strategy.before_adam(engine, before, after)   # 3DGS: densify, reset opacity
    engine.optimizer_step(learning_rates)
    strategy.after_adam(engine, before, after, means_lr)   # MCMC: relocate, add, noise

On the run's last batch a strategy does nothing: no step is left to recover.
"""

from __future__ import annotations

from typing import Protocol

from splatscale.engine import Engine
from splatscale.step.mcmc import Regularisers
from splatscale.train.config import TrainConfig
from splatscale.train.schedule import crossed_multiple, crosses

MCMC_MAX_GAUSSIANS = 1_000_000  # gsplat's cap_max
# gsplat's simple_trainer starts MCMC from opaque, small Gaussians.
MCMC_INITIAL_OPACITY, MCMC_INITIAL_SCALE = 0.5, 0.1


class Strategy(Protocol):
    regularisers: Regularisers | None
    max_gaussians: int | None  # None: no budget
    initial_opacity: float
    initial_scale: float  # times the 3 nearest neighbours' distance
    edits_every_step: bool  # whether every step changes the Gaussians beside Adam

    def tracks_stats(self, after: int) -> bool: ...

    def before_adam(self, engine: Engine, before: int, after: int) -> dict[str, int]:
        """How many Gaussians each change made (empty: none was due)."""
        ...

    def after_adam(self, engine: Engine, before: int, after: int,
                   means_lr: float) -> dict[str, int]:
        """As ``before_adam``."""
        ...


class ThreeDGS:
    """The original schedule: statistics, densification every ``densify_interval``
    images from ``densify_from`` to ``refine_until``, opacity resets, within
    ``max_gaussians`` when set."""

    regularisers = None
    initial_opacity, initial_scale = 0.1, 1.0
    edits_every_step = False

    def __init__(self, config: TrainConfig, extent: float) -> None:
        self.config, self.extent = config, extent
        self.max_gaussians = config.max_gaussians

    def tracks_stats(self, after: int) -> bool:
        return after < self.config.refine_until()

    def before_adam(self, engine: Engine, before: int, after: int) -> dict[str, int]:
        c, changes = self.config, {}
        if not (self.tracks_stats(after) and after < c.iterations):
            return changes
        event = crossed_multiple(before, after, c.densify_interval)
        if event is not None and event > c.densify_from:
            changes = engine.densify_and_prune(c.densify_grad_threshold, c.percent_dense,
                                               self.extent, c.prune_opacity,
                                               event > c.opacity_reset_interval,
                                               self.max_gaussians)
        white_start = c.white_background and before < c.densify_from <= after
        if crosses(before, after, c.opacity_reset_interval) or white_start:
            engine.reset_opacity()
            changes["opacity_reset"] = 1
        return changes

    def after_adam(self, engine: Engine, before: int, after: int,
                   means_lr: float) -> dict[str, int]:
        """Nothing: 3DGS changes the set before Adam."""
        return {}


class MCMC:
    """gsplat's MCMCStrategy: relocation and 5 % growth to ``max_gaussians`` every
    ``densify_interval`` images from ``densify_from`` to ``refine_until``, the dead
    being those of opacity at most ``prune_opacity``; noise on the means after
    every step; opacity and scale regularisers in the loss."""

    tracks_stats = staticmethod(lambda after: False)
    initial_opacity, initial_scale = MCMC_INITIAL_OPACITY, MCMC_INITIAL_SCALE
    edits_every_step = True  # the noise on the means

    def __init__(self, config: TrainConfig) -> None:
        self.config = config
        self.max_gaussians = config.max_gaussians or MCMC_MAX_GAUSSIANS
        self.regularisers = Regularisers(config.opacity_reg, config.scale_reg)

    def before_adam(self, engine: Engine, before: int, after: int) -> dict[str, int]:
        """Nothing: MCMC changes the set after Adam, as gsplat does."""
        return {}

    def after_adam(self, engine: Engine, before: int, after: int,
                   means_lr: float) -> dict[str, int]:
        c, changes = self.config, {}
        if after >= c.iterations:
            return changes
        event = crossed_multiple(before, after, c.densify_interval)
        if event is not None and c.densify_from < event < c.refine_until():
            changes = engine.relocate_and_add(self.max_gaussians, c.prune_opacity)
        engine.inject_noise(means_lr * c.noise_lr, after)
        return changes


def make_strategy(config: TrainConfig, extent: float) -> Strategy:
    return MCMC(config) if config.strategy == "mcmc" else ThreeDGS(config, extent)

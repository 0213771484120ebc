"""Training settings; the defaults are the original 3DGS ones."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from splatscale.errors import DataError
from splatscale.limits import MAX_COUNT, MAX_SEED
from splatscale.step.schedule import scaled_images
from splatscale.strategy import STRATEGIES
from splatscale.strategy.base import RefineSettings
from splatscale.strategy.default import DefaultSettings
from splatscale.strategy.mcmc import MCMCSettings


@dataclass
class TrainConfig(MCMCSettings, DefaultSettings, RefineSettings):
    """Every setting of a run: the strategies' own (inherited from their modules)
    and these."""

    iterations: int = 30_000          # images seen, whatever the batch size
    batch_size: int = 1
    seed: int = 0
    ssim_weight: float = 0.2          # loss = (1 - w) L1 + w (1 - SSIM)
    # Learning rates for batch size 1 (scaled by sqrt(B) for batches).
    position_lr_init: float = 1.6e-4  # times the scene extent
    position_lr_final: float = 1.6e-6
    position_lr_max_steps: int = 30_000
    feature_lr: float = 2.5e-3        # sh0; shN uses feature_lr / 20
    opacity_lr: float = 0.05
    scaling_lr: float = 5e-3
    rotation_lr: float = 1e-3
    random_init: str = "auto"         # without SfM points: "cameras", "cube", or by the images
    sh_degree: int = 3
    sh_degree_interval: int = 1_000
    white_background: bool = False
    # Masks (data/masks.py): None none; "" where the scene keeps them; else their folder.
    masks: str | None = None
    alpha_mask: bool = False          # each image's alpha channel is its mask
    invert_masks: bool = False        # black trains, white is ignored
    skip_missing_masks: bool = False  # an image without a mask trains every pixel
    appearance: str = "none"          # "affine": a colour transform per training image
    antialiased: bool = False         # gsplat's anti-aliased splats (rasterize_mode="antialiased")
    # Every schedule above (counted in images) times this: 0.1 is a whole 3DGS run in
    # 3,000 images, as gsplat's steps_scaler. 1 is the original schedule.
    schedule_scale: float = 1.0

    def refine_until(self) -> int:
        """Images after which the Gaussians stop being densified (or relocated)."""
        if self.densify_until is not None:
            return self.densify_until
        return STRATEGIES[self.strategy].default_refine_until

    @property
    def masked(self) -> bool:
        """Whether the run trains with masks (a folder's, or the images' alpha)."""
        return self.masks is not None or self.alpha_mask

    def scaled(self, factor: float) -> "TrainConfig":
        """These settings with every schedule (the run's length, the learning rate's
        decay, densification's window and interval, opacity resets, SH steps) ``factor``
        times as long; each at least one image."""
        schedules = {name: getattr(self, name) for name in SCHEDULES}
        schedules["densify_until"] = self.refine_until()
        scaled: dict[str, Any] = {name: scaled_images(images, factor)
                                   for name, images in schedules.items()}
        return replace(self, schedule_scale=factor, **scaled)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict, where: str) -> "TrainConfig":
        """The settings ``data`` holds (read from ``where``), each checked: its type,
        its range; a setting it lacks takes its default."""
        if not isinstance(data, dict):
            raise DataError(f"{where}: not a set of settings ({type(data).__name__})")
        values = {}
        for f in fields(cls):
            if f.name in data:
                _check_setting(f.name, str(f.type), data[f.name], where)
                values[f.name] = data[f.name]
        return cls(**values)


# The settings counted in images that --schedule-scale scales (densify_until too).
SCHEDULES = ("iterations", "position_lr_max_steps", "densify_from", "densify_interval",
             "sh_degree_interval", *(name for strategy in STRATEGIES.values()
                                     for name in strategy.schedules))
# Settings with a narrower range than their type's (integers otherwise at least 0).
AT_LEAST_ONE = {"iterations", "batch_size", "position_lr_max_steps", "densify_interval",
                "sh_degree_interval", "max_gaussians"}
CHOICES = {"strategy": tuple(STRATEGIES), "random_init": ("auto", "cameras", "cube"),
           "sh_degree": (0, 1, 2, 3), "appearance": ("none", "affine")}


def _check_setting(name: str, kind: str, value, where: str) -> None:
    """Refuse ``value`` for setting ``name`` of annotation ``kind``, naming both."""
    optional = kind.endswith(" | None")
    if value is None and optional:
        return
    base = kind.removesuffix(" | None")
    low = 1 if name in AT_LEAST_ONE else 0
    if name in CHOICES:
        fits = type(value) is type(CHOICES[name][0]) and value in CHOICES[name]
        expected = " or ".join(map(repr, CHOICES[name]))
    elif base == "str":
        fits, expected = isinstance(value, str), "a string"
    elif base == "bool":
        fits, expected = isinstance(value, bool), "true or false"
    elif base == "int":
        high = MAX_SEED if name == "seed" else MAX_COUNT
        fits = type(value) is int and low <= value <= high
        expected = f"an integer from {low} to {high:,}"
    elif name == "schedule_scale":
        fits = type(value) in (int, float) and 0 < value < math.inf
        expected = "a finite number above 0"
    else:  # float
        fits = type(value) in (int, float) and 0 <= value < math.inf
        expected = "a finite number of at least 0"
    if not fits:
        expected += " or null" if optional else ""
        raise DataError(f"{where}: {name} must be {expected}, not {value!r}")

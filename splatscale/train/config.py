"""Training settings; the defaults are the original 3DGS ones."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

from splatscale.errors import DataError


@dataclass
class TrainConfig:
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
    # Densification, counted in images seen.
    densify_from: int = 500
    densify_until: int | None = None  # 3dgs 15,000; mcmc 25,000 (gsplat's refine_stop_iter)
    densify_interval: int = 100
    densify_grad_threshold: float = 2e-4
    percent_dense: float = 0.01
    opacity_reset_interval: int = 3_000
    prune_opacity: float = 0.005
    # Which strategy changes the set of Gaussians: "3dgs" (the schedule above) or
    # "mcmc" (gsplat 1.5.3's MCMCStrategy, with its simple_trainer's MCMC settings).
    strategy: str = "3dgs"
    max_gaussians: int | None = None  # 3dgs: no budget; mcmc: 1,000,000 (gsplat's cap_max)
    noise_lr: float = 5e5             # mcmc: the means' noise, times their learning rate
    opacity_reg: float = 0.01         # mcmc: L1 on opacity
    scale_reg: float = 0.01           # mcmc: L1 on scale
    random_init: str = "auto"         # without SfM points: "cameras", "cube", or by the images
    sh_degree: int = 3
    sh_degree_interval: int = 1_000
    white_background: bool = False
    # Every schedule above (counted in images) times this: 0.1 is a whole 3DGS run in
    # 3,000 images, as gsplat's steps_scaler. 1 is the original schedule.
    schedule_scale: float = 1.0

    def refine_until(self) -> int:
        """Images after which the Gaussians stop being densified (or relocated)."""
        if self.densify_until is not None:
            return self.densify_until
        return 25_000 if self.strategy == "mcmc" else 15_000

    def scaled(self, factor: float) -> "TrainConfig":
        """These settings with every schedule (the run's length, the learning rate's
        decay, densification's window and interval, opacity resets, SH steps) ``factor``
        times as long; each at least one image."""
        schedules = {name: getattr(self, name) for name in SCHEDULES}
        schedules["densify_until"] = self.refine_until()
        return replace(self, schedule_scale=factor,
                       **{name: max(1, round(images * factor))
                          for name, images in schedules.items()})

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
                _check_setting(f.name, f.type, data[f.name], where)
                values[f.name] = data[f.name]
        return cls(**values)


MAX_SEED = 2 ** 32 - 1  # numpy's generators take no larger seed
MAX_COUNT = 2 ** 62     # beyond it, counts overflow the 64-bit integers of torch and numpy
# The settings counted in images that --schedule-scale scales (densify_until too).
SCHEDULES = ("iterations", "position_lr_max_steps", "densify_from", "densify_interval",
             "opacity_reset_interval", "sh_degree_interval")
# Settings with a narrower range than their type's (integers otherwise at least 0).
AT_LEAST_ONE = {"iterations", "batch_size", "position_lr_max_steps", "densify_interval",
                "sh_degree_interval", "max_gaussians"}
CHOICES = {"strategy": ("3dgs", "mcmc"), "random_init": ("auto", "cameras", "cube"),
           "sh_degree": (0, 1, 2, 3)}


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

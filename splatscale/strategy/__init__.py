"""Strategies: when and how training changes the set of Gaussians.

- ``base``: the contract (``Strategy``, an observer of what each step saw:
  ``step/observer.py``), the engine's seam (``EditsRows``) and the settings every
  strategy shares;
- ``default``: 3DGS's own (``--strategy 3dgs``), with AbsGS's statistic as an
  option;
- ``mcmc``: 3DGS as Markov-chain Monte Carlo (``--strategy mcmc``), gsplat's.

A strategy is one module holding its settings (a dataclass that ``TrainConfig``
inherits), its schedule, its per-row state and its operations, registered in
``STRATEGIES`` below; a setting a user sets has a flag in ``cli.py`` of the
setting's name (a run's settings flags are read from the parser).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Protocol

from splatscale.errors import SplatscaleError
from splatscale.step.schedule import scaled_images
from splatscale.strategy import default, mcmc
from splatscale.strategy.base import Strategy


class StrategyClass(Protocol):
    """What the registry knows of a strategy before it is made."""

    @property
    def settings(self) -> type:
        """Its settings' dataclass, which ``TrainConfig`` inherits."""
        ...

    @property
    def schedules(self) -> tuple[str, ...]:
        """Its settings counted in images, which --schedule-scale scales."""
        ...

    @property
    def default_refine_until(self) -> int:
        """Images after which it stops refining, unless --densify-until says."""
        ...

    def __call__(self, settings, extent: float) -> Strategy: ...


STRATEGIES: dict[str, StrategyClass] = {"3dgs": default.ThreeDGS, "mcmc": mcmc.MCMC}


def make_strategy(config, extent: float) -> Strategy:
    """The strategy ``config.strategy`` names (``config``: a ``TrainConfig``), for a
    scene of ``extent``, its settings checked (``check_settings``)."""
    check_settings(config)
    return STRATEGIES[config.strategy](config, extent)


def check_settings(config) -> None:
    """Refuse a setting of a strategy other than ``config.strategy`` changed from its
    default (a schedule's default scaled as ``config``'s are): it would do nothing.
    The setting is named as its flag, which is how one is changed."""
    for name, other in STRATEGIES.items():
        if name == config.strategy:
            continue
        defaults = other.settings()
        for setting in fields(defaults):
            default = getattr(defaults, setting.name)
            if setting.name in other.schedules:
                default = scaled_images(default, config.schedule_scale)
            if getattr(config, setting.name) != default:
                flag = "--" + setting.name.replace("_", "-")
                raise SplatscaleError(f"{flag}: a setting of --strategy {name}, not of "
                                      f"{config.strategy}")


__all__ = ["STRATEGIES", "Strategy", "check_settings", "make_strategy"]

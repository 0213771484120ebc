"""Strategies: when and how training changes the set of Gaussians.

- ``base``: the contract (``Strategy``), what a step saw (``Seen``), the engine's
  seam (``EditsRows``) and the settings every strategy shares;
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
from splatscale.strategy import default, mcmc
from splatscale.strategy.base import Strategy


class StrategyClass(Protocol):
    """What the registry knows of a strategy before it is made."""

    @property
    def settings(self) -> type:
        """Its settings' dataclass, which ``TrainConfig`` inherits."""
        ...

    @property
    def default_refine_until(self) -> int:
        """Images after which it stops refining, unless --densify-until says."""
        ...

    def __call__(self, settings, extent: float) -> Strategy: ...


STRATEGIES: dict[str, StrategyClass] = {"3dgs": default.ThreeDGS, "mcmc": mcmc.MCMC}


def make_strategy(config, extent: float) -> Strategy:
    """The strategy ``config.strategy`` names (``config``: a ``TrainConfig``), for a
    scene of ``extent``. A setting of another strategy's, changed, is refused, naming
    its flag: it would do nothing."""
    chosen = STRATEGIES[config.strategy]
    for name, other in STRATEGIES.items():
        if other is chosen:
            continue
        for setting in fields(other.settings):
            if getattr(config, setting.name) != setting.default:
                flag = "--" + setting.name.replace("_", "-")
                raise SplatscaleError(f"{flag}: a setting of --strategy {name}, not of "
                                      f"{config.strategy}")
    return chosen(config, extent)


__all__ = ["STRATEGIES", "Strategy", "make_strategy"]

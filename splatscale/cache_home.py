"""The folder where splatscale keeps what it can make again (downscaled images, the demo
scene, compiled kernels)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping


def default_cache_dir(environment: Mapping[str, str] = os.environ) -> Path:
    """``~/.cache/splatscale``, or under XDG_CACHE_HOME where it is set (both as
    ``environment`` says). Raises RuntimeError where there is no home folder."""
    base = environment.get("XDG_CACHE_HOME") or Path(
        environment.get("HOME") or Path.home()) / ".cache"
    return Path(base) / "splatscale"

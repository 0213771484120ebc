"""Which way is up in a model's world. A COLMAP world's axes are arbitrary (they are
its first image's), so a model cannot tell by itself; its cameras can: people hold
them upright. A training run records its cameras' up in the PLY it writes."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from splatscale.data.cameras import Camera


def cameras_up(cameras: Sequence[Camera]) -> np.ndarray | None:
    """The mean of the cameras' up vectors (-y of their OpenCV axes, in the world),
    unit length, as nerfstudio's auto-orient takes it; None when they cancel out."""
    ups = [-camera.viewmat[1, :3].double().numpy() for camera in cameras]
    mean = np.mean(ups, axis=0) if ups else np.zeros(3)
    norm = np.linalg.norm(mean)
    return mean / norm if norm > 1e-6 else None

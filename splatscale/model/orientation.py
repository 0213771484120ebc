"""Which way is up in a model's world, and what its capture looked at. A COLMAP
world's axes are arbitrary (they are its first image's), so a model cannot tell by
itself; its cameras can: people hold them upright, and aim them at what they film.
A training run records its cameras' up in the PLY it writes."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from splatscale.data.cameras import Camera

# Below this, the mean over cameras of sin^2 of their axes' angle to the direction
# they share the least (about 6 degrees), the axes are near parallel (a capture
# facing forward): where they meet is ill-determined.
PARALLEL_AXES = 0.01


def cameras_up(cameras: Sequence[Camera]) -> np.ndarray | None:
    """The mean of the cameras' up vectors (-y of their OpenCV axes, in the world),
    unit length, as nerfstudio's auto-orient takes it; None when they cancel out."""
    ups = [-camera.viewmat[1, :3].double().numpy() for camera in cameras]
    mean = np.mean(ups, axis=0) if ups else np.zeros(3)
    norm = np.linalg.norm(mean)
    return mean / norm if norm > 1e-6 else None


def camera_axes(cameras: Sequence[Camera]) -> tuple[np.ndarray, np.ndarray]:
    """The cameras' centres and unit forward directions (+z of OpenCV axes) in the world."""
    centres = np.stack([camera.center.double().numpy() for camera in cameras])
    forwards = np.stack([camera.viewmat[2, :3].double().numpy() for camera in cameras])
    return centres, forwards / np.linalg.norm(forwards, axis=1, keepdims=True)


def look_at_point(centres: np.ndarray, forwards: np.ndarray, points: np.ndarray) -> np.ndarray:
    """What cameras at ``centres`` facing ``forwards`` (unit) were aimed at: the point
    nearest all their axes. Where those are near parallel or meet behind them, the
    point ahead of the cameras' centroid as far as the scene reaches; their centroid
    where they face all ways."""
    projectors = np.eye(3) - forwards[:, :, None] * forwards[:, None, :]  # off each axis
    system = projectors.mean(axis=0)
    if np.linalg.eigvalsh(system)[0] >= PARALLEL_AXES:
        point = np.linalg.solve(system, np.einsum("nij,nj->i", projectors, centres) / len(centres))
        if np.median(np.einsum("ni,ni->n", point - centres, forwards)) > 0:
            return point
    centroid = centres.mean(axis=0)
    ahead = forwards.mean(axis=0)
    if np.linalg.norm(ahead) < 1e-6:
        return centroid
    return centroid + ahead / np.linalg.norm(ahead) * reach(centroid, points, centres)


def reach(origin: np.ndarray, points: np.ndarray, centres: np.ndarray) -> float:
    """How far the scene reaches from ``origin``: the median distance of its SfM
    points, or of its cameras where it has none."""
    spread = points if len(points) else centres
    return float(np.median(np.linalg.norm(spread - origin, axis=1)))


def most_typical(forwards: np.ndarray) -> int:
    """The camera facing nearest the cameras' mean direction: of an arc, its middle
    one; of a ring, one that looks down on the scene as much as any."""
    return int(np.argmax(forwards @ forwards.mean(axis=0)))

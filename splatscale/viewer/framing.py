"""Where a browser's view of a model starts, and what it turns about.

With the scene's cameras: up is their mean up (``model.orientation``); the view
turns about the point nearest all their optical axes, what they were aimed at;
it starts at the training camera that looks the most like the cameras do on
average, aimed at that point. A model alone turns about the median of its
centres, upright where its PLY records its up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from splatscale.data.cameras import Camera
from splatscale.model.init import nearest_neighbour_scales
from splatscale.model.orientation import cameras_up
from splatscale.viewer.poses import pose_of

# Below this, the mean over cameras of sin^2 of their axes' angle to the direction
# they share the least (about 6 degrees), the axes are near parallel (a capture
# facing forward): where they meet is ill-determined.
PARALLEL_AXES = 0.01
FRUSTUM_DEPTH = 0.05    # a frustum's photo stands this share of the viewing distance out
NEIGHBOUR_SHARE = 0.5   # and at most this share of the cameras' spacing, so none overlap
NEAR_PAST_FRUSTUM = 1.25  # the near plane, in frustum depths: looking through a camera,
                          # its own frustum (which fills the view) is clipped away
FAR_DISTANCES = 1000.0    # the far plane, in viewing distances
LONE_DISTANCE = 3.0     # a model alone is seen from this many times its size
LONE_ELEVATION = math.radians(30.0)  # above its horizon, where its up is known
LONE_FOV = math.radians(75.0)        # viser's own field of view


@dataclass(frozen=True)
class Framing:
    """A first view: from ``position`` towards ``pivot``, which the view turns about,
    with ``up`` up (None: viser's own, +z) and vertical field of view ``fov``; with
    cameras, how far in front of each its photo is drawn, and the clip planes that
    leave those photos out of the view through it (None: viser's own)."""

    up: np.ndarray | None
    pivot: np.ndarray
    position: np.ndarray
    fov: float
    frustum_depth: float | None = None
    near: float | None = None
    far: float | None = None


def scene_framing(cameras: Sequence[Camera], points: np.ndarray) -> Framing:
    """The view of a scene its training ``cameras`` (and SfM ``points``) suggest."""
    centres, forwards = _axes(cameras)
    index = _most_typical(forwards)
    pivot = look_at_point(centres, forwards, points)
    if (pivot - centres[index]) @ forwards[index] <= 0:  # the cameras look out, all around
        pivot = centres[index] + forwards[index] * _reach(centres[index], points, centres)
    home = pose_of(cameras[index])
    distance = float(np.median(np.linalg.norm(centres - pivot, axis=1)))
    depth = _frustum_depth(centres, distance)
    return Framing(cameras_up(cameras), pivot, home.position, home.fov, depth,
                   NEAR_PAST_FRUSTUM * depth, FAR_DISTANCES * distance)


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
    return centroid + ahead / np.linalg.norm(ahead) * _reach(centroid, points, centres)


def _reach(origin: np.ndarray, points: np.ndarray, centres: np.ndarray) -> float:
    """How far the scene reaches from ``origin``: the median distance of its SfM
    points, or of its cameras where it has none."""
    spread = points if len(points) else centres
    return float(np.median(np.linalg.norm(spread - origin, axis=1)))


def _frustum_depth(centres: np.ndarray, distance: float) -> float:
    """How far each frustum's photo stands in front of its camera: a small share of
    the ``distance`` the cameras see the scene from, and no more than half the
    distance between neighbouring cameras."""
    depth = FRUSTUM_DEPTH * distance
    if len(centres) > 1:
        spacing = float(np.median(nearest_neighbour_scales(centres, k=1)))
        depth = min(depth, NEIGHBOUR_SHARE * spacing)
    return depth


def model_framing(centres: np.ndarray, size: float, up: np.ndarray | None) -> Framing:
    """The view of a model alone (Gaussian ``centres``, spread ``size``): from
    ``LONE_DISTANCE`` sizes away, above its horizon where ``up`` is known, else
    along +z as viser's default up (+z) leaves it."""
    pivot = np.median(centres, axis=0)
    away = np.array([0.0, 0.0, -1.0])
    if up is not None:
        level = away - (away @ up) * up
        if np.linalg.norm(level) < 1e-6:  # up along z
            level = np.array([1.0, 0.0, 0.0]) - up[0] * up
        level /= np.linalg.norm(level)
        away = math.cos(LONE_ELEVATION) * level + math.sin(LONE_ELEVATION) * up
    return Framing(up, pivot, pivot + LONE_DISTANCE * size * away, LONE_FOV)


def _axes(cameras: Sequence[Camera]) -> tuple[np.ndarray, np.ndarray]:
    """The cameras' centres and unit forward directions (+z of OpenCV axes) in the world."""
    centres = np.stack([camera.center.double().numpy() for camera in cameras])
    forwards = np.stack([camera.viewmat[2, :3].double().numpy() for camera in cameras])
    return centres, forwards / np.linalg.norm(forwards, axis=1, keepdims=True)


def _most_typical(forwards: np.ndarray) -> int:
    """The camera facing nearest the cameras' mean direction: of an arc, its middle
    one; of a ring, one that looks down on the scene as much as any."""
    return int(np.argmax(forwards @ forwards.mean(axis=0)))

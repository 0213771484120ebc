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
from splatscale.model.orientation import (camera_axes, cameras_up, look_at_point, most_typical,
                                          reach)
from splatscale.viewer.poses import pose_of

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
    centres, forwards = camera_axes(cameras)
    index = most_typical(forwards)
    pivot = look_at_point(centres, forwards, points)
    if (pivot - centres[index]) @ forwards[index] <= 0:  # the cameras look out, all around
        pivot = centres[index] + forwards[index] * reach(centres[index], points, centres)
    home = pose_of(cameras[index])
    distance = float(np.median(np.linalg.norm(centres - pivot, axis=1)))
    depth = _frustum_depth(centres, distance)
    return Framing(cameras_up(cameras), pivot, home.position, home.fov, depth,
                   NEAR_PAST_FRUSTUM * depth, FAR_DISTANCES * distance)


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

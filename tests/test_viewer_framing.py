"""Where the viewer opens, from cameras whose up, aim and poses are known: upright by
their mean up, turning about the point they look at, from the training camera that
looks the most like them; in a world moved and turned as COLMAP's arbitrary axes
would leave it. A model alone: from its recorded up, or as viser leaves it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import viser.transforms as vtf

from splatscale.data.cameras import Camera
from splatscale.viewer.framing import (LONE_DISTANCE, LONE_ELEVATION, model_framing,
                                       scene_framing)
from splatscale.viewer.poses import pose_of
from tests.conftest import look_at_camera, orbit_cameras

TARGET = np.array([0.3, -0.2, 0.5])
NO_POINTS = np.zeros((0, 3))


def moved(cameras: list[Camera], rotation: np.ndarray, shift: np.ndarray) -> list[Camera]:
    """``cameras`` in a world turned by ``rotation`` then shifted by ``shift``."""
    old_to_new = np.eye(4)
    old_to_new[:3, :3], old_to_new[:3, 3] = rotation, shift
    new_to_old = torch.from_numpy(np.linalg.inv(old_to_new))
    return [Camera(c.viewmat @ new_to_old, c.K, c.width, c.height, c.name) for c in cameras]


def arc(target: np.ndarray, degrees: list[float]) -> list[Camera]:
    """Cameras level with ``target`` (so that each one's up is the world's, -y), 4 away,
    at these angles around it, looking at it."""
    return [look_at_camera(target + 4.0 * np.array([math.sin(math.radians(a)), 0.0,
                                                    -math.cos(math.radians(a))]),
                           target, 64, 48, focal=60.0, name=f"at {a}")
            for a in degrees]


def view_rotation(position: np.ndarray, look_at: np.ndarray, up: np.ndarray) -> np.ndarray:
    """The camera-to-world rotation (OpenCV axes) of a view from ``position`` towards
    ``look_at`` with ``up`` up: what viser's orbit controls make of the three."""
    forward = (look_at - position) / np.linalg.norm(look_at - position)
    down = -(up - (up @ forward) * forward)
    down /= np.linalg.norm(down)
    return np.stack([np.cross(down, forward), down, forward], axis=1)


TURNS = [(np.eye(3), np.zeros(3)),
         (vtf.SO3.from_rpy_radians(0.4, -1.1, 2.5).as_matrix(), np.array([5.0, -3.0, 2.0]))]


@pytest.mark.parametrize("rotation, shift", TURNS)
def test_a_ring_gives_its_axis_as_up_and_its_centre_as_pivot(rotation, shift):
    # Eight cameras around the origin, above it (y is down), tilted to look at it.
    cameras = moved(orbit_cameras(8, 64, 48), rotation, shift)
    framing = scene_framing(cameras, NO_POINTS)
    np.testing.assert_allclose(framing.up, rotation @ [0.0, -1.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(framing.pivot, shift, atol=1e-12)
    assert any(np.allclose(framing.position, c.center.numpy(), atol=1e-12) for c in cameras)


@pytest.mark.parametrize("rotation, shift", TURNS)
def test_an_arc_opens_at_its_middle_camera_looking_at_its_target(rotation, shift):
    cameras = moved(arc(TARGET, [-60, -40, -20, 0, 20, 40, 60]), rotation, shift)
    middle = pose_of(cameras[3])
    framing = scene_framing(cameras, NO_POINTS)
    np.testing.assert_allclose(framing.up, rotation @ [0.0, -1.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(framing.pivot, rotation @ TARGET + shift, atol=1e-12)
    np.testing.assert_allclose(framing.position, middle.position, atol=1e-12)
    assert framing.fov == pytest.approx(middle.fov, abs=1e-15)
    # The browser's first view, from there towards the pivot, upright, is the camera's.
    np.testing.assert_allclose(view_rotation(framing.position, framing.pivot, framing.up),
                               vtf.SO3(middle.wxyz).as_matrix(), atol=1e-12)


def test_parallel_cameras_look_as_far_ahead_as_the_points_lie():
    # A forward-facing capture: a grid of cameras all facing +z; the points ahead lie
    # 4, 5 and 6 from their centroid, which is the origin.
    cameras = [look_at_camera([x, y, 0.0], [x, y, 1.0], 64, 48, focal=60.0)
               for x in (-1.0, 0.0, 1.0) for y in (-0.5, 0.5)]
    points = np.array([[0.0, 0.0, 4.0], [3.0, 0.0, 4.0], [0.0, 0.0, 6.0]])
    framing = scene_framing(cameras, points)
    np.testing.assert_allclose(framing.pivot, [0.0, 0.0, 5.0], atol=1e-12)
    np.testing.assert_allclose(framing.up, [0.0, -1.0, 0.0], atol=1e-12)


def test_cameras_looking_out_turn_about_a_point_ahead_of_the_first_view():
    # Eight cameras on a small ring, facing away from its centre (a room captured by
    # turning round): their axes meet behind them.
    cameras = [look_at_camera(0.2 * np.array([math.cos(a), 0.0, math.sin(a)]),
                              3.0 * np.array([math.cos(a), 0.0, math.sin(a)]), 64, 48, 60.0)
               for a in np.linspace(0, 2 * math.pi, 8, endpoint=False)]
    walls = np.array([[3.0, 0.0, 0.0], [0.0, 0.0, 3.0], [-3.0, 0.0, 0.0], [0.0, 0.0, -3.0]])
    framing = scene_framing(cameras, walls)
    ahead = framing.pivot - framing.position
    home = next(c for c in cameras if np.allclose(c.center.numpy(), framing.position))
    forward = home.viewmat[2, :3].numpy()
    np.testing.assert_allclose(ahead / np.linalg.norm(ahead), forward, atol=1e-12)


def test_frustums_stand_out_a_share_of_the_viewing_distance_and_never_overlap():
    ring = scene_framing(orbit_cameras(8, 64, 48, radius=4.0), NO_POINTS)
    distance = 4.0 * math.hypot(1.0, 0.3)  # orbit_cameras' are 0.3 radius above the target
    assert ring.frustum_depth == pytest.approx(0.05 * distance)
    # The near plane lies past a camera's own frustum, the far one well beyond the scene.
    assert ring.near == pytest.approx(1.25 * ring.frustum_depth)
    assert ring.far == pytest.approx(1000 * distance)
    dense = scene_framing(orbit_cameras(400, 64, 48, radius=4.0), NO_POINTS)
    spacing = 2 * 4.0 * math.sin(math.pi / 400)  # neighbours 0.06 apart
    assert dense.frustum_depth == pytest.approx(0.5 * spacing, rel=1e-9)


def test_a_model_alone_opens_upright_where_its_up_is_known():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(101, 3)) + [1.0, 2.0, 3.0]
    pivot = np.median(centres, axis=0)
    up = np.array([0.0, -0.6, 0.8])
    framing = model_framing(centres, 0.5, up)
    np.testing.assert_allclose(framing.pivot, pivot)
    away = framing.position - pivot
    assert np.linalg.norm(away) == pytest.approx(LONE_DISTANCE * 0.5)
    assert away @ up / np.linalg.norm(away) == pytest.approx(math.sin(LONE_ELEVATION))
    # Unknown, as before: along -z, with viser's own up; no cameras, viser's clip planes.
    alone = model_framing(centres, 0.5, None)
    assert alone.up is None and alone.near is None and alone.frustum_depth is None
    np.testing.assert_allclose(alone.position, pivot + [0.0, 0.0, -LONE_DISTANCE * 0.5])

"""Initialisation without SfM points: random points where the cameras look, or in a
cube around them, chosen by what the images show."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from splatscale.data.images import ImageStore, write_png
from splatscale.data.scene import Scene, View
from splatscale.engine.factory import make_engine
from splatscale.model import init_from_points
from splatscale.model.gaussians import SH_C0, SH_REST, GaussianModel
from splatscale.data import load_scene
from splatscale.model.init import (CUBE_EXTENT, focus_point, plain_background,
                                   random_points_in_cube, random_points_in_view)
from splatscale.render import render
from splatscale.train.config import TrainConfig
from splatscale.train.trainer import RunOptions, Trainer, random_init_rule
from tests.conftest import data_path, look_at_camera

OBJECT_RADIUS = 0.5
IMAGES, POINTS = 300, 3000
# Measured: 38.0 dB from points where the cameras look, 14.5 dB from the cube.
PSNR_BAR = 30.0


def striped_ball(n: int = 800) -> GaussianModel:
    """Small opaque Gaussians on a sphere at the origin, in two colours by height."""
    rng = np.random.default_rng(0)
    directions = rng.normal(size=(n, 3))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    stripes = (np.floor((directions[:, 1] + 1) * 3) % 2)[:, None]
    colors = stripes * [0.9, 0.3, 0.2] + (1 - stripes) * [0.2, 0.5, 0.9]
    return GaussianModel(
        means=torch.tensor(OBJECT_RADIUS * directions, dtype=torch.float32),
        quats=torch.tensor([[1.0, 0, 0, 0]]).repeat(n, 1), log_scales=torch.full((n, 3), -3.0),
        opacity_logits=torch.full((n,), 3.0),
        sh0=torch.tensor((colors - 0.5) / SH_C0, dtype=torch.float32)[:, None],
        shN=torch.zeros(n, SH_REST, 3), sh_degree=0)


@pytest.fixture(scope="module")
def inward_scene(tmp_path_factory) -> Scene:
    """12 cameras on a 60-degree arc at distance 4, all looking at the object; no points."""
    folder = tmp_path_factory.mktemp("inward")
    model, views = striped_ball(), []
    for i, angle in enumerate(np.linspace(-math.pi / 6, math.pi / 6, 12)):
        camera = look_at_camera([4 * math.sin(angle), -0.5, 4 * math.cos(angle)], [0, 0, 0],
                                64, 48, 1.2 * 64, dtype=torch.float32, name=f"v{i:02d}.png")
        with torch.no_grad():
            rgb = render(model, camera, background=torch.zeros(3)).rgb
        write_png((rgb.clamp(0, 1) * 255).round().to(torch.uint8).numpy(), folder / camera.name)
        views.append(View(camera, folder / camera.name))
    return Scene(views, np.zeros((0, 3)), np.zeros((0, 3), np.uint8), folder)


def rig_cube_points(cameras, count: int, seed: int = 0):
    """The earlier rule: a cube around the cameras' centroid, half as wide as the rig."""
    rng = np.random.default_rng(seed)
    centres = np.stack([c.center.numpy() for c in cameras]).astype(np.float64)
    middle = centres.mean(axis=0)
    half = 0.5 * np.linalg.norm(centres - middle, axis=1).max()
    return middle + rng.uniform(-half, half, (count, 3)), rng.integers(0, 256, (count, 3))


def inside_object(points: np.ndarray) -> np.ndarray:
    return points[np.linalg.norm(points, axis=1) < 1.2 * OBJECT_RADIUS]


def test_points_surround_the_object(inward_scene):
    cameras = [v.camera for v in inward_scene.views]
    points, colors = random_points_in_view(cameras, 20_000)
    assert points.shape == (20_000, 3) and colors.shape == (20_000, 3)
    near = inside_object(points)
    assert len(near) > 0.01 * len(points)
    for axis in range(3):  # on every side of the object's centre
        assert (near[:, axis] > 0.3).sum() > 20 and (near[:, axis] < -0.3).sum() > 20
    assert len(inside_object(rig_cube_points(cameras, 20_000)[0])) == 0, \
        "the earlier rule never reached the object"


def test_the_cube_covers_the_object_and_the_room_behind_the_cameras(inward_scene):
    cameras = [v.camera for v in inward_scene.views]
    points, colors = random_points_in_cube(cameras, 20_000, seed=2)
    assert points.shape == colors.shape == (20_000, 3)
    centres = np.stack([c.center.numpy() for c in cameras]).astype(np.float64)
    centroid = centres.mean(axis=0)
    half = CUBE_EXTENT * np.linalg.norm(centres - centroid, axis=1).max()
    offsets = points - centroid
    assert np.abs(offsets).max() <= half and np.abs(offsets).max() > 0.99 * half
    np.testing.assert_allclose(offsets.mean(axis=0), 0, atol=0.03 * half)  # uniform
    assert len(inside_object(points)) > 0
    assert (points[:, 2] > centres[:, 2].max()).sum() > 0.1 * len(points), "behind the cameras"


def test_focus_point_is_where_the_axes_meet(inward_scene):
    cameras = [v.camera for v in inward_scene.views]
    centres = np.stack([c.center.numpy() for c in cameras]).astype(np.float64)
    axes = np.stack([c.viewmat[2, :3].numpy() for c in cameras]).astype(np.float64)
    np.testing.assert_allclose(focus_point(centres, axes), [0, 0, 0], atol=1e-5)
    assert focus_point(centres, -axes) is None, "axes meeting behind the cameras"
    assert focus_point(centres, np.repeat([[0.0, 0.0, 1.0]], len(axes), 0)) is None, "parallel"


def test_forward_facing_rig_fills_its_frusta():
    cameras = [look_at_camera([x, 0.0, 0.0], [x, 0.0, 5.0], 40, 30, 40.0, name=str(x))
               for x in np.linspace(-0.5, 0.5, 5)]
    points, _ = random_points_in_view(cameras, 5000, seed=1)
    assert len(points) == 5000
    depths = points[:, 2]
    assert depths.min() > 0.01 and depths.max() <= 4 * 0.5 + 1e-9
    seen = np.zeros(len(points), dtype=bool)
    for camera in cameras:
        view, K = camera.viewmat.numpy(), camera.K.numpy()
        u, v, w = ((points @ view[:3, :3].T + view[:3, 3]) @ K.T).T
        inside = (w > 0) & (0 <= u / w) & (u / w < 40) & (0 <= v / w) & (v / w < 30)
        assert inside.mean() > 0.05, "every camera sees some of the points"
        seen |= inside
    assert seen.all()


def train_psnr(scene: Scene, points: np.ndarray, colors: np.ndarray, out: Path) -> float:
    store = ImageStore(scene, cache_dir=out / "cache")
    config = TrainConfig(iterations=IMAGES, densify_from=100, densify_interval=50)
    engine = make_engine(init_from_points(points, colors.astype(np.uint8)), 1, torch.zeros(3))
    trainer = Trainer(scene, store, config, RunOptions(out, progress=False, checkpoint_every=0),
                      engine=engine)
    while trainer.images_seen < IMAGES:
        trainer.train_step()
    return trainer.evaluate(trainer.train_ids)["psnr"]


def test_training_from_where_the_cameras_look_passes_the_bar(inward_scene, tmp_path):
    cameras = [v.camera for v in inward_scene.views]
    assert train_psnr(inward_scene, *random_points_in_view(cameras, POINTS), tmp_path) >= PSNR_BAR
    assert train_psnr(inward_scene, *rig_cube_points(cameras, POINTS), tmp_path) < PSNR_BAR


def test_extent_counts_training_cameras_only(inward_scene, tmp_path):
    store = ImageStore(inward_scene, cache_dir=tmp_path)
    trainer = Trainer(inward_scene, store, TrainConfig(), RunOptions(tmp_path, eval_split=True,
                                                                     progress=False))
    assert trainer.test_ids == [0, 8]
    assert trainer.extent == inward_scene.camera_extent(trainer.train_ids)
    assert trainer.extent != inward_scene.camera_extent(list(range(12)))


def test_auto_rule_reads_the_images_borders(inward_scene, tmp_path):
    """An object on black is given points where the cameras look; snowmiku, whose photos
    show the room around the toy, the cube."""
    def rule(scene: Scene) -> str:
        store = ImageStore(scene, cache_dir=tmp_path / "cache")
        return random_init_rule(store, list(range(len(scene.views))), TrainConfig())
    assert rule(inward_scene) == "cameras"
    assert rule(load_scene(data_path("snowmiku"))) == "cube"
    assert random_init_rule(None, [], TrainConfig(random_init="cube")) == "cube"


def test_plain_background_tolerates_an_object_touching_the_border():
    image = np.full((100, 100, 3), 255, np.uint8)
    image[40:, 45:55] = 30  # a post running out of the frame: 10 % of the bottom edge
    assert plain_background([image, image, image])
    noisy = np.random.default_rng(0).integers(0, 256, (100, 100, 3), dtype=np.uint8)
    assert not plain_background([noisy, noisy, image])

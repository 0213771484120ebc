"""`render` and `eval` of a fisheye scene render fisheye views at the photos' size; an
orbit about it stays pinhole."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image
from scipy.spatial.transform import Rotation

from splatscale.cli import main
from splatscale.data import load_scene
from splatscale.data.images import ImageStore
from splatscale.model.ply import read_ply
from splatscale.render import render
from splatscale.step.loss import psnr
from tests.conftest import look_at_camera

WIDTH, HEIGHT, FOCAL = 48, 40, 20.0  # as a fisheye, 70 degrees to the side edges


def fisheye_colmap_scene(root, views: int = 8):
    """A COLMAP text scene of ``views`` noise photos through one ideal FISHEYE camera
    circling the origin, and 60 points about it."""
    sparse = root / "sparse" / "0"
    sparse.mkdir(parents=True)
    (root / "images").mkdir()
    rng = np.random.default_rng(0)
    (sparse / "cameras.txt").write_text(
        f"1 FISHEYE {WIDTH} {HEIGHT} {FOCAL} {FOCAL} {WIDTH / 2} {HEIGHT / 2}\n")
    lines = []
    for index, angle in enumerate(np.linspace(0, 2 * math.pi, views, endpoint=False)):
        camera = look_at_camera([2.5 * math.cos(angle), 0.5, 2.5 * math.sin(angle)], [0, 0, 0],
                                WIDTH, HEIGHT, FOCAL)
        x, y, z, w = Rotation.from_matrix(camera.viewmat[:3, :3].numpy()).as_quat()
        tx, ty, tz = camera.viewmat[:3, 3].tolist()
        lines.append(f"{index + 1} {w} {x} {y} {z} {tx} {ty} {tz} 1 view_{index}.png\n\n")
        Image.fromarray(rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8)).save(
            root / "images" / f"view_{index}.png")
    (sparse / "images.txt").write_text("".join(lines))
    points = rng.uniform(-0.8, 0.8, (60, 3))
    (sparse / "points3D.txt").write_text("".join(
        f"{i + 1} {x} {y} {z} 128 128 128 0.5\n" for i, (x, y, z) in enumerate(points)))
    return root


@pytest.fixture(scope="module")
def fisheye_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("fisheye_run")
    scene = fisheye_colmap_scene(base / "scene")
    cache = ["--cache-dir", str(base / "cache")]
    assert main(["train", str(scene), "-o", str(base / "run"), "--iterations", "4",
                 "--eval", "--quiet", *cache]) == 0
    return base, scene, cache


def test_render_and_eval_draw_the_fisheye_views_at_the_photos_size(fisheye_run, capsys):
    base, scene, cache = fisheye_run
    model_file = base / "run" / "point_cloud.ply"
    assert main(["render", str(model_file), "-o", str(base / "png"), "--split", "all",
                 *cache]) == 0
    model = read_ply(model_file)
    store = ImageStore(load_scene(scene), cache_dir=base / "cache")
    scores = []
    for index in range(len(store)):
        camera = store.camera(index)
        assert camera.model == "fisheye" and (camera.width, camera.height) == (WIDTH, HEIGHT)
        written = np.asarray(Image.open(base / "png" / f"view_{index}.png.png"))
        with torch.no_grad():
            rgb = render(model, camera).rgb.clamp(0, 1)
        np.testing.assert_array_equal(written, (rgb * 255).round().to(torch.uint8).numpy())
        if index % 8 == 0:
            scores.append(float(psnr(rgb, store.as_float(index))))
    capsys.readouterr()
    assert main(["eval", str(model_file), *cache]) == 0
    assert json.loads(capsys.readouterr().out)["psnr"] == pytest.approx(np.mean(scores))


def test_a_fisheye_render_is_not_the_pinhole_one(fisheye_run):
    """Guards the test above against a renderer that draws every camera as a pinhole."""
    base, scene, _ = fisheye_run
    model = read_ply(base / "run" / "point_cloud.ply")
    camera = load_scene(scene).views[1].camera
    pinhole = type(camera)(camera.viewmat, camera.K, camera.width, camera.height, camera.name)
    with torch.no_grad():
        assert not torch.allclose(render(model, camera).rgb, render(model, pinhole).rgb,
                                  atol=0.02)


def test_an_orbit_of_a_fisheye_scene_is_pinhole(fisheye_run, monkeypatch):
    base, _, cache = fisheye_run
    drawn = []
    import splatscale.commands as commands
    real = commands.render_view
    monkeypatch.setattr(commands, "render_view",
                        lambda model, camera, **kw: drawn.append(camera) or real(model, camera,
                                                                                   **kw))
    assert main(["render", str(base / "run" / "point_cloud.ply"), "--orbit", "--frames", "2",
                 "-o", str(base / "orbit"), *cache]) == 0
    assert len(drawn) == 2 and all(camera.model == "pinhole" for camera in drawn)

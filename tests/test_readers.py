"""Scene readers: COLMAP (snowmiku and a written text model), transforms.json,
undistortion, the image store."""

from __future__ import annotations

import json
import math

import numpy as np
import pycolmap
import pytest
import torch
from PIL import Image

from splatscale.data import load_scene
from splatscale.data.colmap import read_colmap
from splatscale.data.images import ImageStore
from splatscale.data.transforms import read_transforms
from splatscale.errors import DataError
from tests.conftest import data_path


def project(camera, points: np.ndarray) -> np.ndarray:
    """Pixel coordinates (centres at +0.5) of world points in a pinhole Camera."""
    view = camera.viewmat.numpy()
    p = points @ view[:3, :3].T + view[:3, 3]
    uv = p @ camera.K.numpy().T
    return uv[:, :2] / uv[:, 2:]


def test_snowmiku_matches_the_stored_model():
    root = data_path("snowmiku")
    scene = read_colmap(root)
    recon = pycolmap.Reconstruction(str(root / "sparse" / "0"))
    assert len(scene.views) == 97 and len(scene.points) == 25_784
    assert [v.camera.name for v in scene.views] == sorted(im.name for im in recon.images.values())
    by_name = {im.name: im for im in recon.images.values()}
    for view in scene.views[::10]:
        image = by_name[view.camera.name]
        pose = image.cam_from_world()
        np.testing.assert_allclose(view.camera.viewmat[:3, :3].numpy(), pose.rotation.matrix())
        np.testing.assert_allclose(view.camera.viewmat[:3, 3].numpy(), pose.translation)
        K = recon.cameras[image.camera_id].calibration_matrix()
        np.testing.assert_allclose(view.camera.K.numpy(), K)
        assert (view.camera.width, view.camera.height) == (495, 371)
        assert view.distortion is None and view.image_path.is_file()
    stored = {tuple(p.xyz): tuple(p.color) for p in recon.points3D.values()}
    for xyz, rgb in zip(scene.points[::997], scene.colors[::997]):
        assert stored[tuple(xyz)] == tuple(rgb)


def write_png(path, width, height, value=128):
    Image.fromarray(np.full((height, width, 3), value, np.uint8)).save(path)


@pytest.fixture
def colmap_text_scene(tmp_path):
    """Two cameras (PINHOLE, SIMPLE_RADIAL), two posed images, three points."""
    sparse = tmp_path / "sparse" / "0"
    sparse.mkdir(parents=True)
    (tmp_path / "images").mkdir()
    (sparse / "cameras.txt").write_text("1 PINHOLE 64 48 60 62 32 24\n"
                                        "2 SIMPLE_RADIAL 64 48 58 31 23 0.05\n")
    # Image 2 is rotated 45 degrees about y (quaternion w, x, y, z).
    (sparse / "images.txt").write_text("1 1 0 0 0 0.1 -0.2 3 1 a.png\n\n"
                                       "2 0.9238795325 0 0.3826834324 0 0 0 3 2 b.png\n\n")
    (sparse / "points3D.txt").write_text("1 0.1 0.2 0.3 255 0 0 0.5\n"
                                         "2 -0.1 0.0 0.2 0 255 0 0.5\n"
                                         "3 0.2 -0.3 -0.1 0 0 255 0.5\n")
    write_png(tmp_path / "images" / "a.png", 64, 48)
    write_png(tmp_path / "images" / "b.png", 64, 48)
    return tmp_path


def test_colmap_text_model_gives_known_projections(colmap_text_scene):
    scene = load_scene(colmap_text_scene)
    assert [v.camera.name for v in scene.views] == ["a.png", "b.png"]
    np.testing.assert_allclose(scene.points[2], [0.2, -0.3, -0.1])
    assert tuple(scene.colors[1]) == (0, 255, 0)
    # Image a: identity rotation, t = (0.1, -0.2, 3): point (0.1, 0.2, 0.3) lands at
    # (60 * 0.2 / 3.3 + 32, 62 * 0 / 3.3 + 24).
    uv = project(scene.views[0].camera, np.array([[0.1, 0.2, 0.3]]))
    np.testing.assert_allclose(uv, [[60 * 0.2 / 3.3 + 32, 24.0]], atol=1e-9)
    # Image b is distorted: its pinhole camera is COLMAP's undistorted choice, and the
    # rotation maps the world x axis to camera (cos 45, 0, -sin 45).
    distorted = scene.views[1]
    assert distorted.distortion is not None and distorted.distortion.model == "SIMPLE_RADIAL"
    R = distorted.camera.viewmat[:3, :3].numpy()
    np.testing.assert_allclose(R @ [1, 0, 0], [math.sqrt(0.5), 0, -math.sqrt(0.5)], atol=1e-9)


def opencv_distort(x, y, k1, k2, p1, p2):
    """The OpenCV radial-tangential model on normalised coordinates, written out."""
    r2 = x * x + y * y
    radial = 1 + k1 * r2 + k2 * r2 * r2
    return (x * radial + 2 * p1 * x * y + p2 * (r2 + 2 * x * x),
            y * radial + p1 * (r2 + 2 * y * y) + 2 * p2 * x * y)


def test_transforms_json_with_opencv_distortion(tmp_path):
    """A distorted capture of bright dots at known 3D points: after undistortion the
    dots sit where the pinhole camera projects the points."""
    width, height, fx, fy, cx, cy = 160, 120, 120.0, 118.0, 81.0, 59.0
    k1, k2, p1, p2 = -0.12, 0.03, 0.002, -0.001
    # Camera at (0, 0, 4) looking down -z in OpenGL axes (identity rotation).
    c2w = np.eye(4)
    c2w[2, 3] = 4.0
    # A 4 x 3 grid of well-separated dots, reaching the strongly distorted corners.
    gx, gy = np.meshgrid([-1.5, -0.5, 0.5, 1.5], [-1.1, 0.0, 1.1])
    points = np.stack([gx.ravel(), gy.ravel(), np.linspace(-0.3, 0.3, gx.size)], 1)
    image = np.zeros((height, width, 3), np.float32)
    yy, xx = np.mgrid[0:height, 0:width] + 0.5
    for X, Y, Z in points:
        # OpenCV camera: x right, y down, z forward = (X, -Y, 4 - Z) for this pose.
        x, y = X / (4 - Z), -Y / (4 - Z)
        xd, yd = opencv_distort(x, y, k1, k2, p1, p2)
        u, v = fx * xd + cx, fy * yd + cy
        image += np.exp(-((xx - u) ** 2 + (yy - v) ** 2) / (2 * 0.8 ** 2))[..., None]
    Image.fromarray((np.clip(image, 0, 1) * 255).astype(np.uint8)).save(tmp_path / "f0.png")
    meta = {"fl_x": fx, "fl_y": fy, "cx": cx, "cy": cy, "w": width, "h": height,
            "k1": k1, "k2": k2, "p1": p1, "p2": p2,
            "frames": [{"file_path": "f0.png", "transform_matrix": c2w.tolist()}]}
    (tmp_path / "transforms.json").write_text(json.dumps(meta))

    scene = read_transforms(tmp_path)
    camera = scene.views[0].camera
    assert scene.views[0].distortion.model == "OPENCV" and len(scene.points) == 0
    np.testing.assert_allclose(camera.viewmat.numpy()[:3, 3], [0, 0, 4])  # z forward = -world z
    store = ImageStore(scene, cache_dir=tmp_path / "cache")
    undistorted = store.image(0).float().mean(dim=2).numpy()
    expected = project(camera, points)
    for u, v in expected:
        x0, y0 = int(u) - 3, int(v) - 3
        patch = undistorted[y0:y0 + 7, x0:x0 + 7]
        py, px = np.mgrid[y0:y0 + 7, x0:x0 + 7] + 0.5
        centroid = (np.sum(px * patch) / patch.sum(), np.sum(py * patch) / patch.sum())
        assert np.hypot(centroid[0] - u, centroid[1] - v) < 0.05, (u, v, centroid)
    assert (tmp_path / "cache").exists(), "the undistorted image is cached"


def test_blender_style_transforms_with_camera_angle(tmp_path):
    write_png(tmp_path / "r_0.png", 40, 30)
    Image.fromarray(np.zeros((30, 40, 4), np.uint8)).save(tmp_path / "r_1.png")  # transparent
    frames = [{"file_path": f"./r_{i}", "transform_matrix": np.eye(4).tolist()} for i in range(2)]
    (tmp_path / "transforms_train.json").write_text(json.dumps({"camera_angle_x": 0.8,
                                                                "frames": frames}))
    scene = read_transforms(tmp_path)
    assert len(scene.views) == 2
    focal = 0.5 * 40 / math.tan(0.4)
    np.testing.assert_allclose(scene.views[0].camera.K.numpy()[:2, :2], [[focal, 0], [0, focal]])
    store = ImageStore(scene, background=(1.0, 1.0, 1.0), cache_dir=tmp_path / "cache")
    assert torch.all(store.image(1) == 255), "transparent pixels take the background"


def test_image_store_downscales_and_gives_bands(tmp_path):
    root = data_path("snowmiku")
    scene = read_colmap(root)
    store = ImageStore(scene, resolution=2, cache_dir=tmp_path)
    camera = store.camera(3)
    assert (camera.width, camera.height) == (248, 186)
    np.testing.assert_allclose(camera.K[0, 0].item(),
                               scene.views[3].camera.K[0, 0].item() * 248 / 495)
    image = store.image(3)
    assert image.shape == (186, 248, 3) and image.dtype == torch.uint8
    assert torch.equal(store.image(3, rows=(10, 50)), image[10:50])
    # A second store reads the cached copy, identical.
    assert torch.equal(ImageStore(scene, resolution=2, cache_dir=tmp_path).image(3), image)
    capped = ImageStore(scene, max_width=100, cache_dir=tmp_path).camera(0)
    assert camera.width > capped.width == 100


def transforms_with_absent_frames(root, present: int, absent: int) -> None:
    for i in range(present):
        write_png(root / f"f{i}.png", 8, 6)
    frames = [{"file_path": f"f{i}.png", "transform_matrix": np.eye(4).tolist()}
              for i in range(present + absent)]
    (root / "transforms.json").write_text(json.dumps({"fl_x": 8.0, "frames": frames}))


def test_absent_images_of_a_transforms_scene_are_named(tmp_path):
    transforms_with_absent_frames(tmp_path, present=3, absent=5)
    with pytest.raises(DataError) as error:
        load_scene(tmp_path)
    message = str(error.value)
    assert "transforms.json: 5 of the 8 images it lists are missing" in message
    assert "f3.png, f4.png, f5.png, ..." in message and "--skip-missing-images" in message
    assert "COLMAP" not in message


def test_absent_images_can_be_skipped(tmp_path, capsys):
    transforms_with_absent_frames(tmp_path, present=3, absent=2)
    scene = load_scene(tmp_path, skip_missing_images=True)
    assert [v.camera.name for v in scene.views] == ["f0.png", "f1.png", "f2.png"]
    assert ("transforms.json: 2 of the 5 images it lists are missing (f3.png, f4.png); "
            "skipping them") in capsys.readouterr().err
    snowmiku = data_path("snowmiku")
    images = sorted(p.name for p in (snowmiku / "images").iterdir())
    root = tmp_path / "colmap"
    (root / "images").mkdir(parents=True)
    (root / "sparse").symlink_to(snowmiku / "sparse")
    for name in images[::2]:
        (root / "images" / name).symlink_to(snowmiku / "images" / name)
    scene = read_colmap(root, skip_missing_images=True)
    assert [v.camera.name for v in scene.views] == images[::2]
    assert f"{len(images[1::2])} of the {len(images)} images it lists are missing" \
        in capsys.readouterr().err


def test_a_scene_with_every_image_absent_is_refused(tmp_path):
    transforms_with_absent_frames(tmp_path, present=0, absent=2)
    with pytest.raises(DataError, match="all 2 of the 2 images it lists are missing"):
        load_scene(tmp_path, skip_missing_images=True)


@pytest.mark.parametrize("mode, values, expected", [
    ("I;16", [0, 257 * 128, 65535], [0, 128, 255]),   # 16-bit grey PNG
    ("I", [0, 257 * 64, 65535], [0, 64, 255]),        # 32-bit integer grey (TIFF)
    ("F", [0.0, 0.5, 1.0], [0, 128, 255]),            # float grey (TIFF)
    ("L", [0, 100, 255], [0, 100, 255]),
    ("1", [0, 1, 1], [0, 255, 255]),
])
def test_every_pillow_mode_decodes_to_8_bit_rgb(tmp_path, mode, values, expected):
    from splatscale.data.images import _decode

    array = np.array([values], dtype={"I;16": np.uint16, "I": np.int32, "F": np.float32,
                                      "L": np.uint8, "1": bool}[mode])
    path = tmp_path / ("image.tif" if mode in ("I", "F") else "image.png")
    Image.fromarray(array).save(path)
    with Image.open(path) as image:
        assert image.mode == mode, image.mode
    decoded = _decode(path, (0.0, 0.0, 0.0))
    assert decoded.dtype == np.uint8 and decoded.shape == (1, 3, 3)
    np.testing.assert_array_equal(decoded[0, :, 0], expected)
    np.testing.assert_array_equal(decoded[..., 0], decoded[..., 2])


def test_an_edited_image_is_not_read_stale_from_the_cache(tmp_path):
    root = tmp_path / "scene"
    root.mkdir()
    write_png(root / "f0.png", 32, 24, value=40)
    frames = [{"file_path": "f0.png", "transform_matrix": np.eye(4).tolist()}]
    (root / "transforms.json").write_text(json.dumps({"fl_x": 30.0, "frames": frames}))
    scene = read_transforms(root)
    assert ImageStore(scene, resolution=2, cache_dir=tmp_path / "c").image(0).float().mean() == 40
    write_png(root / "f0.png", 32, 24, value=200)
    assert ImageStore(scene, resolution=2, cache_dir=tmp_path / "c").image(0).float().mean() == 200

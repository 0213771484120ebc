"""Fisheye captures read natively: COLMAP's fisheye models and nerfstudio's OPENCV_FISHEYE
resampled once to an ideal equidistant fisheye of the whole field of view (checked against
the models written out here, not pycolmap), cached and scaled as such; every other
distorted model undistorted to a pinhole as before; bad fisheye cameras one line each."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pycolmap
import pytest
from PIL import Image
from scipy.ndimage import map_coordinates

from splatscale.cli import main
from splatscale.data import load_scene
from splatscale.data.images import ImageStore
from splatscale.errors import DataError
from tests.test_bad_input import assert_clean_error

WIDTH, HEIGHT = 160, 120


def noise(width: int = WIDTH, height: int = HEIGHT, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3)).astype(np.uint8)


def colmap_scene(root, camera_line: str, image: np.ndarray):
    """One camera (a line of cameras.txt after its id), one image at the origin, one point."""
    sparse = root / "sparse" / "0"
    sparse.mkdir(parents=True)
    (root / "images").mkdir()
    (sparse / "cameras.txt").write_text(f"1 {camera_line}\n")
    (sparse / "images.txt").write_text("1 1 0 0 0 0 0 0 1 a.png\n\n")
    (sparse / "points3D.txt").write_text("1 0.1 0.2 3 255 0 0 0.5\n")
    Image.fromarray(image).save(root / "images" / "a.png")
    return root


def opencv_fisheye_theta_d(theta: np.ndarray, k: tuple[float, ...]) -> np.ndarray:
    """OpenCV's fisheye model, written out: the distorted angle of the true angle."""
    k1, k2, k3, k4 = k
    t2 = theta * theta
    return theta * (1 + k1 * t2 + k2 * t2 ** 2 + k3 * t2 ** 3 + k4 * t2 ** 4)


def true_angle(theta_d: np.ndarray, k: tuple[float, ...]) -> np.ndarray:
    """The true angle of a distorted one, by bisection on [0, pi/2] (monotone here)."""
    low, high = np.zeros_like(theta_d), np.full_like(theta_d, math.pi / 2)
    for _ in range(80):
        middle = 0.5 * (low + high)
        below = opencv_fisheye_theta_d(middle, k) < theta_d
        low, high = np.where(below, middle, low), np.where(below, high, middle)
    return 0.5 * (low + high)


FX, FY, CX, CY = 70.0, 71.0, 81.0, 59.0
K_FISHEYE = (0.06, -0.01, 0.004, -0.001)


def fisheye_dots(points: np.ndarray) -> np.ndarray:
    """A photo of bright dots at camera-space ``points`` through OpenCV's fisheye model."""
    image = np.zeros((HEIGHT, WIDTH, 3), np.float32)
    yy, xx = np.mgrid[0:HEIGHT, 0:WIDTH] + 0.5
    for x, y, z in points:
        radial = math.hypot(x, y)
        theta_d = opencv_fisheye_theta_d(np.array(math.atan2(radial, z)), K_FISHEYE)
        u, v = FX * theta_d * x / radial + CX, FY * theta_d * y / radial + CY
        image += np.exp(-((xx - u) ** 2 + (yy - v) ** 2) / (2 * 0.8 ** 2))[..., None]
    return (np.clip(image, 0, 1) * 255).astype(np.uint8)


def test_nerfstudio_opencv_fisheye_keeps_the_whole_field_of_view(tmp_path):
    """Dots up to 58 degrees off axis land where r = f theta puts them, and the camera's
    size is the bounding box of the photo's border directions (the model inverted here
    by bisection): every angle the photo sees is kept, none cropped."""
    angles = np.radians([10, 25, 45, 55, 58])
    azimuths = np.radians([0, 30, 160, 10, 180])
    points = np.stack([np.sin(angles) * np.cos(azimuths), np.sin(angles) * np.sin(azimuths),
                       np.cos(angles)], 1) * 3.0
    Image.fromarray(fisheye_dots(points)).save(tmp_path / "f0.png")
    k1, k2, k3, k4 = K_FISHEYE
    meta = {"camera_model": "OPENCV_FISHEYE", "fl_x": FX, "fl_y": FY, "cx": CX, "cy": CY,
            "w": WIDTH, "h": HEIGHT, "k1": k1, "k2": k2, "k3": k3, "k4": k4,
            "frames": [{"file_path": "f0.png", "transform_matrix": np.eye(4).tolist()}]}
    (tmp_path / "transforms.json").write_text(json.dumps(meta))
    view = load_scene(tmp_path).views[0]
    camera = view.camera
    assert camera.model == "fisheye" and view.distortion.model == "OPENCV_FISHEYE"
    K = camera.K.numpy()
    assert (K[0, 0], K[1, 1]) == (FX, FY)

    us, vs = np.arange(WIDTH + 1.0), np.arange(HEIGHT + 1.0)
    border = np.concatenate([np.stack([us, 0 * us], 1), np.stack([us, 0 * us + HEIGHT], 1),
                             np.stack([0 * vs, vs], 1), np.stack([0 * vs + WIDTH, vs], 1)])
    x, y = (border[:, 0] - CX) / FX, (border[:, 1] - CY) / FY
    theta = true_angle(np.hypot(x, y), K_FISHEYE)
    scale = theta / np.hypot(x, y)
    u, v = FX * scale * x, FY * scale * y
    assert (camera.width, camera.height) == (math.ceil(np.ptp(u)), math.ceil(np.ptp(v)))
    np.testing.assert_allclose(K[:2, 2], [-u.min(), -v.min()], atol=1e-6)

    store = ImageStore(load_scene(tmp_path), cache_dir=tmp_path / "cache")
    resampled = store.image(0).float().mean(dim=2).numpy()
    assert resampled.shape == (camera.height, camera.width)
    for px, py, pz in points:
        angle, radial = math.atan2(math.hypot(px, py), pz), math.hypot(px, py)
        cu, cv = FX * angle * px / radial + K[0, 2], FY * angle * py / radial + K[1, 2]
        x0, y0 = int(cu) - 3, int(cv) - 3
        patch = resampled[y0:y0 + 7, x0:x0 + 7]
        gy, gx = np.mgrid[y0:y0 + 7, x0:x0 + 7] + 0.5
        centroid = (np.sum(gx * patch) / patch.sum(), np.sum(gy * patch) / patch.sum())
        assert np.hypot(centroid[0] - cu, centroid[1] - cv) < 0.05, (cu, cv, centroid)


FISHEYE_MODELS = {
    "OPENCV_FISHEYE": "70 71 81 59 0.06 -0.01 0.004 -0.001",
    "SIMPLE_RADIAL_FISHEYE": "70 81 59 0.05",
    "RADIAL_FISHEYE": "70 81 59 0.05 -0.01",
    "THIN_PRISM_FISHEYE": "70 71 81 59 0.05 -0.01 0.001 0.002 0.003 -0.001 0.001 0.001",
    "RAD_TAN_THIN_PRISM_FISHEYE": "70 71 81 59 0.05 -0.01 0.002 0 0 0 0.001 0.001 "
                                  "0.001 0 0.001 0",
}


@pytest.mark.parametrize("model", sorted(FISHEYE_MODELS))
def test_each_colmap_fisheye_model_is_resampled_to_an_ideal_fisheye(tmp_path, model):
    """Each pixel of the resampled image holds the photo where the photo's model sends
    that pixel's equidistant ray; the focal lengths are the photo's."""
    photo = noise()
    params = [float(p) for p in FISHEYE_MODELS[model].split()]
    root = colmap_scene(tmp_path, f"{model} {WIDTH} {HEIGHT} {FISHEYE_MODELS[model]}", photo)
    view = load_scene(root).views[0]
    camera = view.camera
    assert camera.model == "fisheye" and view.distortion.model == model
    assert camera.K[0, 0] == params[0] and camera.K[1, 1] == params[1 if "THIN" in model or
                                                                     "OPENCV" in model else 0]
    resampled = ImageStore(load_scene(root), cache_dir=tmp_path / "cache").image(0).numpy()
    assert resampled.shape == (camera.height, camera.width, 3)
    source = pycolmap.Camera(model=model, width=WIDTH, height=HEIGHT, params=params)
    K = camera.K.numpy()
    rng = np.random.default_rng(1)
    for _ in range(20):  # pixels well inside the photo: the map is exact there
        u, v = rng.uniform(0.3, 0.7) * camera.width, rng.uniform(0.3, 0.7) * camera.height
        i, j = int(v), int(u)
        x, y = (j + 0.5 - K[0, 2]) / K[0, 0], (i + 0.5 - K[1, 2]) / K[1, 1]
        theta = math.hypot(x, y)
        s = math.sin(theta) / theta if theta else 1.0
        src = source.img_from_cam(np.array([[x * s, y * s, math.cos(theta)]]))[0] - 0.5
        expected = [map_coordinates(photo[..., c].astype(np.float32), [[src[1]], [src[0]]],
                                    order=1)[0] for c in range(3)]
        np.testing.assert_allclose(resampled[i, j], np.rint(expected), atol=1)


@pytest.mark.parametrize("line", [f"OPENCV_FISHEYE {WIDTH} {HEIGHT} 70 71 81 59 0 0 0 0",
                                  f"FISHEYE {WIDTH} {HEIGHT} 70 71 81 59",
                                  f"SIMPLE_FISHEYE {WIDTH} {HEIGHT} 70 81 59"])
def test_an_ideal_fisheye_photo_is_its_own_resampling(tmp_path, line):
    """OPENCV_FISHEYE without coefficients maps onto itself pixel for pixel; FISHEYE and
    SIMPLE_FISHEYE, the ideal projection, are read as they are."""
    photo = noise()
    scene = load_scene(colmap_scene(tmp_path, line, photo))
    camera = scene.views[0].camera
    fy = 81 if line.startswith("SIMPLE") else 71
    assert camera.model == "fisheye" and (camera.width, camera.height) == (WIDTH, HEIGHT)
    np.testing.assert_allclose(camera.K.numpy(), [[70, 0, 81], [0, 70 if fy == 81 else 71, 59],
                                                  [0, 0, 1]], atol=1e-9)
    assert (scene.views[0].distortion is None) == (not line.startswith("OPENCV"))
    image = ImageStore(scene, cache_dir=tmp_path / "cache").image(0).numpy()
    np.testing.assert_array_equal(image, photo)


def test_nerfstudio_opencv_fisheye_without_coefficients_is_an_ideal_fisheye(tmp_path):
    Image.fromarray(noise()).save(tmp_path / "f0.png")
    meta = {"camera_model": "OPENCV_FISHEYE", "fl_x": FX, "fl_y": FY, "cx": CX, "cy": CY,
            "frames": [{"file_path": "f0.png", "transform_matrix": np.eye(4).tolist()}]}
    (tmp_path / "transforms.json").write_text(json.dumps(meta))
    view = load_scene(tmp_path).views[0]
    assert view.camera.model == "fisheye" and view.distortion is None
    assert (view.camera.width, view.camera.height) == (WIDTH, HEIGHT)


@pytest.mark.parametrize("line", [f"SIMPLE_RADIAL {WIDTH} {HEIGHT} 70 81 59 0.05",
                                  f"OPENCV {WIDTH} {HEIGHT} 70 71 81 59 -0.1 0.02 0.001 0"])
def test_other_distorted_models_go_to_colmaps_pinhole_as_before(tmp_path, line):
    """COLMAP's undistorted pinhole camera, and each pixel the photo where the model sends
    its ray (x, y, 1), blacked out past an edge pixel's centre: bit for bit as before."""
    photo = noise()
    root = colmap_scene(tmp_path, line, photo)
    camera = load_scene(root).views[0].camera
    model, *numbers = line.split()
    params = [float(p) for p in numbers[2:]]
    source = pycolmap.Camera(model=model, width=WIDTH, height=HEIGHT, params=params)
    pinhole = pycolmap.undistort_camera(pycolmap.UndistortCameraOptions(), source)
    assert camera.model == "pinhole"
    assert (camera.width, camera.height) == (pinhole.width, pinhole.height)
    np.testing.assert_array_equal(camera.K.numpy(), pinhole.calibration_matrix())
    K = pinhole.calibration_matrix()
    u, v = np.meshgrid(np.arange(pinhole.width) + 0.5, np.arange(pinhole.height) + 0.5)
    rays = np.stack([(u - K[0, 2]) / K[0, 0], (v - K[1, 2]) / K[1, 1], np.ones_like(u)], -1)
    src = source.img_from_cam(rays.reshape(-1, 3)) - 0.5
    coords = [src[:, 1].reshape(u.shape), src[:, 0].reshape(u.shape)]
    expected = np.stack([map_coordinates(photo[..., c].astype(np.float32), coords, order=1,
                                         mode="constant") for c in range(3)], -1)
    image = ImageStore(load_scene(root), cache_dir=tmp_path / "cache").image(0).numpy()
    np.testing.assert_array_equal(image, np.clip(np.rint(expected), 0, 255).astype(np.uint8))


OPENCV_FISHEYE_LINE = f"OPENCV_FISHEYE {WIDTH} {HEIGHT} 70 71 81 59 0.06 -0.01 0.004 -0.001"


def test_scaling_keeps_the_fisheye_and_the_cache_and_fingerprint_tell_it_apart(tmp_path):
    root = colmap_scene(tmp_path, OPENCV_FISHEYE_LINE, noise())
    scene = load_scene(root)
    full = scene.views[0].camera
    half = ImageStore(scene, resolution=2, cache_dir=tmp_path / "cache")
    camera = half.camera(0)
    assert camera.model == "fisheye"
    assert (camera.width, camera.height) == (round(full.width / 2), round(full.height / 2))
    np.testing.assert_allclose(camera.K[0, 0], full.K[0, 0] * camera.width / full.width)
    assert half.image(0).shape == (camera.height, camera.width, 3)

    # The same scene with its cameras called pinhole: another cache entry, another run.
    as_pinhole = dataclasses.replace(scene, views=[dataclasses.replace(
        scene.views[0], camera=dataclasses.replace(full, model="pinhole"))])
    pinhole_store = ImageStore(as_pinhole, resolution=2, cache_dir=tmp_path / "cache")
    assert pinhole_store._cache_path(0) != half._cache_path(0)
    assert pinhole_store.fingerprint() != half.fingerprint()


def with_nan_k1(root):
    """The scene's model as binary files whose camera's k1 is NaN (COLMAP's text reader
    refuses NaN parameters itself; its binary files hold them)."""
    sparse = root / "sparse" / "0"
    model = pycolmap.Reconstruction(str(sparse))
    params = list(model.cameras[1].params)
    params[4] = math.nan
    model.cameras[1].params = params
    for text in sparse.iterdir():
        text.unlink()
    model.write_binary(str(sparse))
    return root


@pytest.mark.parametrize("line, problem", [
    (f"OPENCV_FISHEYE {WIDTH} {HEIGHT} 70 71 81 59 0.1 0 0 0", "parameters are not all finite"),
    (f"OPENCV_FISHEYE {WIDTH} {HEIGHT} 30 30 81 59 0 0 0 0",
     "field of view cannot be represented"),
    (f"OPENCV_FISHEYE {WIDTH} {HEIGHT} 50 50 81 59 -0.3 0 0 0",
     "field of view cannot be represented"),
])
def test_a_fisheye_camera_that_cannot_be_resampled_is_one_line(tmp_path, capsys, line,
                                                               problem):
    """Non-finite parameters (k1 made NaN); a border beyond 90 degrees from the axis
    (f = 30: the corner is 3.3 radians out); a polynomial that turns back inside the
    photo."""
    root = colmap_scene(tmp_path / "scene", line, noise())
    if "finite" in problem:
        with_nan_k1(root)
    with pytest.raises(DataError, match=problem):
        load_scene(root)
    code = main(["train", str(root), "-o", str(tmp_path / "out"), "--iterations", "1"])
    assert_clean_error(code, capsys.readouterr().err, "camera 1 of a.png", problem)
    assert not (tmp_path / "out").exists()

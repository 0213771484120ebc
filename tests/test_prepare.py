"""`splatscale prepare`: photos and video to a COLMAP scene whose cameras match the
known ones, resumable (keeping the user's files in the scene), stopped cleanly, and one
line for each bad input."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pycolmap
import pytest
from PIL import Image
from scipy.ndimage import map_coordinates

from splatscale.cli import main
from splatscale.data import load_scene
from splatscale.folder_lock import LOCK_NAME
from splatscale.prepare.alignment import pose_errors, similarity
from splatscale.prepare.frames import sharpness
from splatscale.prepare.photos import (EXIF_IFD, FOCAL_35MM, ORIENTATION, inspect_photo,
                                       write_photo)
from splatscale.prepare.scene_folder import MAPPING_SCRATCH, MODEL_FILES, image_name
from splatscale.prepare.sfm import image_pairs
from bench.scenes import write_video
from tests.conftest import data_path
from tests.test_bad_input import assert_clean_error, on_a_terminal
from tests.test_refused_runs import snapshot
from tests.test_stop_signals import STOPS, Command, assert_no_stack_dump

SNOWMIKU = data_path("snowmiku")
EVERY = 3  # every 3rd of snowmiku's 97 views (495 x 371, 1/8 of the capture's): 33


def poses(scene) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {Path(view.camera.name).name: (view.camera.viewmat[:3, :3].numpy(),
                                          view.camera.center.numpy()) for view in scene.views}


def some_photos(folder: Path, every: int = EVERY) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for source in sorted((SNOWMIKU / "images").iterdir())[::every]:
        shutil.copyfile(source, folder / source.name)
        written.append(folder / source.name)
    return written


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> tuple[Path, Path, dict]:
    """The scene of 33 photos, one of them named with a space, which COLMAP's list of
    pairs to match would split: written as ``image_name`` names it."""
    base = tmp_path_factory.mktemp("prepare")
    last = some_photos(base / "photos")[-1]
    last.rename(last.with_name(last.name.replace("_", " ")))
    assert main(["prepare", str(base / "photos"), "-o", str(base / "scene"), "--quiet"]) == 0
    report = json.loads((base / "scene" / "prepare.json").read_text())["report"]
    return base / "photos", base / "scene", report


def assert_close_to_known(found: dict, registered_at_least: int) -> None:
    assert len(found) >= registered_at_least
    known_scene = load_scene(SNOWMIKU)
    angles, distances = pose_errors(found, poses(known_scene))
    extent = known_scene.camera_extent(list(range(len(known_scene.views))))
    assert np.median(angles) < 1.0, angles
    assert np.median(distances) < 0.01 * extent, (distances, extent)


def test_photos_make_a_scene_whose_cameras_match_the_known_ones(prepared):
    photos, scene, report = prepared
    assert report["registered"] == report["images"] == 33 and not report["left_out"]
    assert report["cameras"] == 1  # one size, no EXIF: one shared camera
    assert report["sfm"]["matcher"] == "exhaustive" and report["pairs"] == 33 * 32 // 2
    assert 0 < report["mean_reprojection_error_px"] < 2 and report["points"] > 1000
    assert set(report["seconds"]) == {"images", "features", "matching", "mapping"}
    for photo in photos.iterdir():  # upright JPEGs are taken byte for byte
        assert (scene / "images" / image_name(photo.name)).read_bytes() == photo.read_bytes()
    sources = json.loads((scene / "prepare.json").read_text())["sources"]
    assert sorted(sources) == sorted(p.name for p in photos.iterdir())
    assert sorted(p.name for p in (scene / "sparse" / "0").iterdir()) == sorted(MODEL_FILES)
    assert_close_to_known(poses(load_scene(scene)), 33)


def test_running_again_reuses_features_and_matches(prepared, capsys):
    photos, scene, _ = prepared
    assert main(["prepare", str(photos), "-o", str(scene), "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["reused"] == {"images": True, "features": 33, "pairs": 33 * 32 // 2}
    assert report["registered"] == 33


def copy_of(scene: Path, tmp_path: Path) -> Path:
    """A copy of the module's scene, to continue without changing it."""
    copy = tmp_path / "scene"
    shutil.copytree(scene, copy)
    return copy


USERS_FILES = ("images/my_mask.png", "sparse/0/my_extra.txt", "sparse/1/notes.txt")


def test_continuing_rewrites_a_removed_image_and_keeps_the_users_files(prepared, tmp_path,
                                                                         capsys):
    photos, scene, _ = prepared
    scene = copy_of(scene, tmp_path)
    removed = sorted((scene / "images").iterdir())[3]
    kept = removed.read_bytes()
    removed.unlink()
    for name in USERS_FILES:
        (scene / name).parent.mkdir(exist_ok=True)
        (scene / name).write_text(f"the user's {name}")
    assert main(["prepare", str(photos), "-o", str(scene), "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["reused"] == {"images": False, "features": 33, "pairs": 33 * 32 // 2}
    assert report["registered"] == 33 and removed.read_bytes() == kept
    for name in USERS_FILES:
        assert (scene / name).read_text() == f"the user's {name}"
    assert sorted(p.name for p in (scene / "sparse" / "0").iterdir()) == sorted(
        (*MODEL_FILES, "my_extra.txt"))


@pytest.mark.parametrize("stop", STOPS, ids=lambda s: s.name)
def test_a_stop_in_the_mapper_waits_for_it(prepared, tmp_path, stop):
    """The mapper runs in a worker thread: the stop cancels it and waits for it to end,
    as a process that exits while it runs aborts with glog's stack dump."""
    photos, scene, _ = prepared
    scene = copy_of(scene, tmp_path)
    before = kept_by_a_stop(scene)
    command = Command("prepare", str(photos), "-o", str(scene))  # bars: the stages seen
    code, stderr = command.stopped_when(command.says("mapping (incremental)"), stop)
    assert_no_stack_dump(stderr)
    assert code == 130, stderr
    said = [line for line in on_a_terminal(stderr) if "reusing" not in line]
    assert said == ["splatscale: interrupted"], stderr
    assert not (scene / LOCK_NAME).exists() and kept_by_a_stop(scene) == before


def kept_by_a_stop(scene: Path) -> dict:
    """``snapshot`` less the database, whose header pycolmap rewrites as it opens it,
    and the mapper's scratch folder, which a stop as it is made can leave (the next run
    clears it)."""
    return {path: data for path, data in snapshot(scene).items()
            if path != "database.db" and not path.startswith(MAPPING_SCRATCH)}


@pytest.mark.parametrize("change", ["added", "removed", "changed"])
def test_photos_changed_since_the_scene_was_made_are_refused(change, prepared, tmp_path,
                                                             capsys):
    photos, scene, _ = prepared
    name = sorted(photos.iterdir())[5].name
    before = snapshot(scene)
    try:
        if change == "added":
            name = sorted((SNOWMIKU / "images").iterdir())[1].name  # not among every 3rd
            shutil.copyfile(SNOWMIKU / "images" / name, photos / name)
        elif change == "removed":
            (photos / name).rename(tmp_path / name)
        else:
            stat = (photos / name).stat()
            os.utime(photos / name, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10 ** 9))
        code = main(["prepare", str(photos), "-o", str(scene), "--quiet"])
    finally:  # the module's scene is made from the photos as they were
        if change == "added":
            (photos / name).unlink()
        elif change == "removed":
            (tmp_path / name).rename(photos / name)
        else:
            os.utime(photos / name, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert_clean_error(code, capsys.readouterr().err, str(photos.resolve()), "1 file",
                       f"{name} ({change})", "--overwrite")
    assert snapshot(scene) == before


def test_changed_settings_are_refused_and_change_nothing(prepared, capsys):
    photos, scene, _ = prepared
    before = snapshot(scene)
    code = main(["prepare", str(photos), "-o", str(scene), "--camera-model", "OPENCV"])
    assert_clean_error(code, capsys.readouterr().err, str(scene), "camera_model",
                       "--overwrite")
    assert snapshot(scene) == before


def test_a_video_goes_through_the_video_path(tmp_path, capsys):
    """A video named with a space, which COLMAP's list of pairs to match would split."""
    frames = some_photos(tmp_path / "frames", every=1)[:48]
    video = tmp_path / "my orbit.mp4"
    write_video(frames, video)
    scene = tmp_path / "scene"
    assert main(["prepare", str(video), "-o", str(scene), "--frames", "24", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["images"] == 24 and report["registered"] >= 20
    assert report["sfm"]["matcher"] == "sequential" and report["cameras"] == 1
    names = sorted(p.name for p in (scene / "images").iterdir())
    assert len(names) == 24 and all(re.fullmatch(r"my_orbit\.mp4_\d{6}\.jpg", name)
                                    for name in names)
    # Frame k is photo k: its known pose is that photo's.
    found = {frames[int(name[-10:-4])].name: pose for name, pose in
             poses(load_scene(scene)).items()}
    assert_close_to_known(found, 20)


def fisheye_photos(folder: Path, every: int) -> list[Path]:
    """Snowmiku's photos through an ideal equidistant fisheye of their size whose corners
    see what theirs see (37 degrees off axis; inside the photo everywhere else, as
    r / f < atan(r / f_pinhole) within the corners' radius), with the EXIF 35 mm focal
    length of its focal length (without one, prepare starts from a wide fisheye's)."""
    folder.mkdir(parents=True)
    written = []
    for view in load_scene(SNOWMIKU).views[::every]:
        K, width, height = view.camera.K.numpy(), view.camera.width, view.camera.height
        corner = np.hypot(width / 2, height / 2)
        f = corner / np.arctan(corner / K[0, 0])
        u, v = np.meshgrid(np.arange(width) + 0.5 - width / 2,
                           np.arange(height) + 0.5 - height / 2)
        theta = np.hypot(u, v) / f
        to_pinhole = np.tan(theta) / np.maximum(theta, 1e-12) / f  # pinhole r / fisheye r
        x = u * to_pinhole * K[0, 0] + K[0, 2] - 0.5
        y = v * to_pinhole * K[1, 1] + K[1, 2] - 0.5
        photo = np.asarray(Image.open(view.image_path).convert("RGB"), dtype=np.float32)
        fisheye = np.stack([map_coordinates(photo[..., c], [y, x], order=1) for c in range(3)],
                           -1)
        exif = Image.Exif()
        exif.get_ifd(EXIF_IFD)[FOCAL_35MM] = round(f / max(width, height) * 35)
        path = folder / Path(view.camera.name).name
        Image.fromarray(np.clip(np.rint(fisheye), 0, 255).astype(np.uint8)).save(
            path, quality=95, exif=exif)
        written.append(path)
    return written


def test_fisheye_photos_make_a_scene_that_trains_as_fisheye(tmp_path, capsys):
    """prepare --camera-model OPENCV_FISHEYE: COLMAP's fisheye model (its distortion
    refined once every view is placed), poses as known, and the scene's cameras ideal
    fisheyes of about the photos' size."""
    photos = fisheye_photos(tmp_path / "photos", every=5)
    scene = tmp_path / "scene"
    assert main(["prepare", str(tmp_path / "photos"), "-o", str(scene), "--camera-model",
                 "OPENCV_FISHEYE", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["sfm"]["camera_model"] == "OPENCV_FISHEYE"
    assert report["registered"] >= len(photos) - 3  # as with SIMPLE_RADIAL, 3 left out
    model = pycolmap.Reconstruction(str(scene / "sparse" / "0"))
    assert {camera.model.name for camera in model.cameras.values()} == {"OPENCV_FISHEYE"}
    prepared_scene = load_scene(scene)
    cameras = [view.camera for view in prepared_scene.views]
    assert all(camera.model == "fisheye" for camera in cameras)
    assert all(abs(camera.width - 495) <= 16 and abs(camera.height - 371) <= 16
               for camera in cameras)
    assert_close_to_known(poses(prepared_scene), len(photos) - 3)


def test_train_on_photos_alone_names_the_prepare_command(prepared, tmp_path, capsys):
    photos, _, _ = prepared
    code = main(["train", str(photos), "-o", str(tmp_path / "run")])
    assert_clean_error(code, capsys.readouterr().err, "splatscale prepare", str(photos))
    assert not (tmp_path / "run").exists()


def noise_photos(folder: Path, count: int) -> None:
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(count):
        Image.fromarray(rng.integers(0, 256, (120, 160, 3), dtype=np.uint8)).save(
            folder / f"noise_{i}.png")


@pytest.mark.parametrize("case, fragment", [
    ("missing", "no such file"),
    ("empty", "no images"),
    ("two", "at least 3"),
    ("truncated", "not a readable image"),
    ("mixed", "both images and videos"),
    ("bad video", "not a video that can be decoded"),
    ("unregistered", "registered 0 of 4 images"),
])
def test_bad_input_gets_one_line(case, fragment, tmp_path, capsys):
    source = tmp_path / "input"
    if case == "empty":
        source.mkdir()
    elif case == "two":
        some_photos(source, every=40)[2].unlink()
    elif case == "truncated":
        photos = some_photos(source, every=20)
        photos[1].write_bytes(photos[1].read_bytes()[:2000])
    elif case == "mixed":
        some_photos(source, every=20)
        (source / "clip.mp4").write_bytes(b"\0" * 100)
    elif case == "bad video":
        source = tmp_path / "clip.mp4"
        source.write_bytes(np.random.default_rng(0).bytes(5000))
    elif case == "unregistered":
        noise_photos(source, 4)
    code = main(["prepare", str(source), "-o", str(tmp_path / "scene"), "--quiet"])
    assert_clean_error(code, capsys.readouterr().err, fragment)
    if case != "unregistered":  # SfM's outcome, not a refusal: its database is kept
        assert not (tmp_path / "scene").exists()


def test_a_folder_holding_other_files_is_refused(prepared, tmp_path, capsys):
    photos, _, _ = prepared
    scene = tmp_path / "scene"
    (scene / "images").mkdir(parents=True)
    (scene / "notes.txt").write_text("mine")
    before = snapshot(scene)
    code = main(["prepare", str(photos), "-o", str(scene), "--overwrite"])
    assert_clean_error(code, capsys.readouterr().err, "prepare did not write")
    assert snapshot(scene) == before


def test_similarity_recovers_a_known_transform():
    rng = np.random.default_rng(1)
    points = rng.normal(size=(20, 3))
    q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    rotation = q * np.sign(np.linalg.det(q))
    moved = 2.5 * points @ rotation.T + np.array([1.0, -2.0, 0.5])
    scale, found, shift = similarity(points, moved)
    assert scale == pytest.approx(2.5) and np.allclose(found, rotation)
    assert np.allclose(shift, [1.0, -2.0, 0.5])


def test_pose_errors_are_zero_for_the_same_cameras_in_another_frame():
    rng = np.random.default_rng(2)
    known = {}
    for i in range(6):
        q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
        known[f"{i}.jpg"] = (q * np.sign(np.linalg.det(q)), rng.normal(size=3))
    q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    turn = q * np.sign(np.linalg.det(q))  # world_found = 0.3 * turn @ world_known + 1
    found = {name: (rot @ turn.T, 0.3 * turn @ centre + 1.0)
             for name, (rot, centre) in known.items()}
    angles, distances = pose_errors(found, known)
    assert np.allclose(angles, 0, atol=1e-5) and np.allclose(distances, 0, atol=1e-9)


def test_sequential_pairs_follow_capture_order_and_join_videos():
    first, second = [f"a{i}" for i in range(30)], ["b0", "b1"]
    pairs = image_pairs([first, second], "sequential")
    assert ("a0", "a1") in pairs and ("a0", "a10") in pairs and ("a0", "a16") in pairs
    assert ("a0", "a11") not in pairs  # beyond the overlap and not a power of two
    assert ("a5", "b1") in pairs and ("b0", "b1") in pairs
    assert len(image_pairs([first], "exhaustive")) == 30 * 29 // 2


def test_sharpness_prefers_the_unblurred_frame():
    rng = np.random.default_rng(3)
    sharp = rng.integers(0, 256, (64, 64)).astype(np.float32)
    blurred = (sharp + np.roll(sharp, 1, 0) + np.roll(sharp, 1, 1) + np.roll(sharp, 1, (0, 1))) / 4
    assert sharpness(sharp) > 4 * sharpness(blurred)


def test_a_turned_photo_is_written_upright_once(tmp_path):
    pixels = np.zeros((40, 60, 3), np.uint8)
    pixels[:, :10] = 255  # a white band on the left of the stored image
    exif = Image.Exif()
    exif[ORIENTATION] = 6  # shown turned a quarter clockwise
    Image.fromarray(pixels).save(tmp_path / "turned.jpg", exif=exif, quality=100)
    photo = inspect_photo(tmp_path / "turned.jpg")
    assert not photo.copy and photo.camera[-1] == "(40, 60)"
    (tmp_path / "out").mkdir()
    write_photo(photo, tmp_path / "out")
    with Image.open(tmp_path / "out" / "turned.jpg") as written:
        assert written.size == (40, 60) and written.getexif().get(ORIENTATION, 1) == 1
        upright = np.asarray(written.convert("L"), dtype=float)
    assert upright[:10].mean() > 200 and upright[20:].mean() < 50  # the band is on top

"""`splatscale prepare` never loses or corrupts the user's files, and says what it
skips: the checks that refuse before SfM runs, and the names it writes (all cheap:
no SfM here; tests/test_prepare.py has the runs)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from splatscale.cli import main
from splatscale.prepare.frames import extract_frames
from splatscale.prepare.photos import ORIENTATION, inspect_photo, write_photo
from splatscale.prepare.pipeline import Request, check_inputs, recorded_settings
from splatscale.prepare.scene_folder import (MODEL_FILES, SceneFolder, manifest_problem,
                                             source_record)
from splatscale.prepare.sfm import SfmSettings, give_fisheye_a_focal_prior
from bench.scenes import write_video
from tests.test_bad_input import assert_clean_error
from tests.test_prepare import some_photos
from tests.test_refused_runs import snapshot


def noise_image(path: Path, seed: int = 0, size: tuple[int, int] = (60, 40), **save) -> Path:
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(
        path, **save)
    return path


def made_scene(scene: Path) -> Path:
    """A folder as ``prepare`` leaves it, as far as the checks look: three photos in
    ``images/``, ``sparse/0``, the database and the manifest."""
    some_photos(scene / "images", every=40)
    (scene / "sparse" / "0").mkdir(parents=True)
    (scene / "sparse" / "0" / "cameras.bin").write_bytes(b"model")
    (scene / "database.db").write_bytes(b"features")
    (scene / "prepare.json").write_text(json.dumps({"settings": {"input": "elsewhere"}}))
    return scene


def prepare(*args) -> int:
    return main(["prepare", *map(str, args), "--quiet"])


def checked(source: Path, output: Path, frames: int | None = None):
    return check_inputs(Request(source, output, frames, SfmSettings(), progress=False))


@pytest.mark.parametrize("case", ["its own images", "a link to the scene",
                                  "a photo linked from the scene", "the video's folder",
                                  "inside the photos"])
def test_an_output_holding_the_input_or_inside_it_is_refused(case, tmp_path, capsys):
    scene = made_scene(tmp_path / "scene")
    source, output = scene / "images", scene
    if case == "a link to the scene":
        output = tmp_path / "link"
        output.symlink_to(scene)
    elif case == "a photo linked from the scene":
        source = tmp_path / "photos"
        some_photos(source, every=40)
        (source / "linked.jpg").symlink_to(next((scene / "images").iterdir()))
    elif case == "the video's folder":
        source = scene / "clip.mp4"  # refused before it is opened
        source.write_bytes(b"\0" * 100)
    elif case == "inside the photos":
        output = scene / "images" / "scene"
    before = snapshot(tmp_path)
    code = prepare(source, "-o", output, "--overwrite")
    fragment = "inside the input" if case == "inside the photos" else "holds the input"
    assert_clean_error(code, capsys.readouterr().err, str(output), fragment)
    assert snapshot(tmp_path) == before


def test_overwrite_refuses_a_file_prepare_did_not_write(tmp_path, capsys):
    scene = made_scene(tmp_path / "scene")
    (scene / "database.db.mine").write_bytes(b"the user's copy")
    some_photos(tmp_path / "photos", every=40)
    before = snapshot(scene)
    code = prepare(tmp_path / "photos", "-o", scene, "--overwrite")
    assert_clean_error(code, capsys.readouterr().err, "database.db.mine", "did not write")
    assert snapshot(scene) == before


def test_clearing_removes_what_prepare_wrote_and_nothing_it_links_to(tmp_path):
    scene, photos = made_scene(tmp_path / "scene"), tmp_path / "photos"
    some_photos(photos, every=40)
    for entry in ("images", "sparse"):  # the user's own folders linked in
        target = tmp_path / f"own {entry}"
        (scene / entry).rename(target)
        (scene / entry).symlink_to(target)
    (scene / "database.db-wal").write_bytes(b"log")
    (scene / ".images.partial").mkdir()
    (scene / ".notes").write_text("the user's")
    kept = {name: snapshot(tmp_path / name) for name in ("photos", "own images", "own sparse")}
    SceneFolder(scene).clear()
    assert sorted(p.name for p in scene.iterdir()) == [".notes"]
    assert {name: snapshot(tmp_path / name) for name in kept} == kept


def made_by_prepare(scene: Path) -> Path:
    """``made_scene`` with the model files pycolmap writes and a manifest naming its
    images, as prepare leaves a scene."""
    made_scene(scene)
    for name in MODEL_FILES:
        (scene / "sparse" / "0" / name).write_bytes(b"model")
    names = sorted(path.name for path in (scene / "images").iterdir())
    (scene / "prepare.json").write_text(json.dumps(
        {"settings": {"input": "elsewhere"}, "cameras": [names], "sequences": [names]}))
    return scene


USERS_FILES = ("images/my_mask.png", "sparse/0/my_extra.txt", "sparse/1/notes.txt")


def add_users_files(scene: Path) -> None:
    for name in USERS_FILES:
        (scene / name).parent.mkdir(exist_ok=True)
        (scene / name).write_text(f"the user's {name}")


def assert_users_files_kept(scene: Path) -> None:
    for name in USERS_FILES:
        assert (scene / name).read_text() == f"the user's {name}"


def test_clearing_keeps_the_users_files_and_says_so(tmp_path, capsys):
    scene = made_by_prepare(tmp_path / "scene")
    add_users_files(scene)
    (scene / ".mapping.x1y2").mkdir()  # the mapper's scratch, left by a run killed outright
    SceneFolder(scene).clear()
    assert sorted(str(p.relative_to(scene)) for p in scene.rglob("*")) == sorted(
        ("images", "sparse", "sparse/0", "sparse/1", *USERS_FILES))
    assert_users_files_kept(scene)
    assert capsys.readouterr().err.splitlines() == [
        f"splatscale: {scene}: --overwrite kept what prepare did not write: "
        + ", ".join(USERS_FILES)]


def test_publishing_replaces_only_prepares_own_files(tmp_path):
    """Continued, prepare writes its images and model over the earlier ones, and removes
    only those of its earlier files that the new ones do not replace."""
    scene = made_by_prepare(tmp_path / "scene")
    add_users_files(scene)
    folder = SceneFolder(scene)
    manifest = json.loads(folder.manifest.read_text())
    old, *same = manifest["cameras"][0]
    folder.staged_images.mkdir()
    for name in (*same, "new.jpg"):
        (folder.staged_images / name).write_bytes(b"written again")
    written = {"cameras": [[*same, "new.jpg"]], "sequences": [[*same, "new.jpg"]]}
    folder.publish_images(manifest, written)
    assert not (folder.images / old).exists() and not folder.staged_images.exists()
    for name in (*same, "new.jpg"):
        assert (folder.images / name).read_bytes() == b"written again"
    assert json.loads(folder.manifest.read_text())["cameras"] == written["cameras"]

    class Model:  # pycolmap's Reconstruction, as publish_model uses it
        def write(self, path: str) -> None:
            for name in MODEL_FILES[:-1]:  # one fewer than the earlier model's
                (Path(path) / name).write_bytes(b"new model")
    folder.publish_model(Model())
    assert {p.name: p.read_bytes() for p in folder.model.iterdir()} == {
        **{name: b"new model" for name in MODEL_FILES[:-1]},
        "my_extra.txt": b"the user's sparse/0/my_extra.txt"}
    assert_users_files_kept(scene)


def test_frames_of_two_videos_of_one_name_stay_apart(tmp_path):
    photos = some_photos(tmp_path / "photos", every=1)[:6]
    frames = tmp_path / "frames"
    frames.mkdir()
    names = []
    for video in (tmp_path / "clip.mp4", tmp_path / "clip.mkv"):
        write_video(photos, video)
        names += extract_frames(video, 6, 6, frames)
    assert len(set(names)) == 12 and sorted(p.name for p in frames.iterdir()) == sorted(names)
    assert "clip.mkv_000005.jpg" in names


def test_photos_of_one_stem_stay_apart(tmp_path, capsys):
    photos = tmp_path / "photos"
    photos.mkdir()
    for i, name in enumerate(("a.png", "a.tif", "b.png")):
        noise_image(photos / name, seed=i)
    inputs = checked(photos, tmp_path / "scene")
    assert [photo.name for photo in inputs.photos] == ["a.png", "a.tif.png", "b.png"]
    noise_image(photos / "a.tif.png", seed=3)  # the one name left that two could take
    code = prepare(photos, "-o", tmp_path / "scene")
    assert_clean_error(code, capsys.readouterr().err, "a.tif", "would be written as a.tif.png")
    assert not (tmp_path / "scene").exists()


def test_names_with_whitespace_are_written_with_underscores(tmp_path, capsys):
    """COLMAP's list of pairs to match splits its lines at spaces: an image named with
    one would be matched with none."""
    photos = tmp_path / "photos"
    photos.mkdir()
    for i, name in enumerate(("img 0.jpg", "img\t1.png", "img 2.tif")):
        noise_image(photos / name, seed=i)
    inputs = checked(photos, tmp_path / "scene")
    assert [photo.name for photo in inputs.photos] == ["img_1.png", "img_0.jpg",
                                                       "img_2.tif.png"]  # a tab sorts first
    noise_image(photos / "img_0.jpg", seed=3)
    code = prepare(photos, "-o", tmp_path / "scene")
    assert_clean_error(code, capsys.readouterr().err, "img_0.jpg",
                       "would be written as img_0.jpg")
    videos = tmp_path / "videos"
    videos.mkdir()
    for name in ("my clip.mp4", "my_clip.mp4"):  # refused before they are opened
        (videos / name).write_bytes(b"\0" * 100)
    code = prepare(videos, "-o", tmp_path / "scene")
    assert_clean_error(code, capsys.readouterr().err, "my_clip.mp4",
                       "would be written as my_clip.mp4_000000.jpg")
    assert not (tmp_path / "scene").exists()


def test_what_the_input_folder_holds_unread_is_named(tmp_path, capsys):
    photos = tmp_path / "photos"
    (photos / "sub").mkdir(parents=True)
    (photos / ".git").mkdir()  # a dot-named folder: not the user's photos
    for i, name in enumerate(("a.png", "b.png", "c.png", ".hidden.jpg", "sub/d.png",
                              ".git/e.png")):
        noise_image(photos / name, seed=i)
    (photos / ".DS_Store").write_bytes(b"a file of the system's")
    inputs = checked(photos, tmp_path / "scene")
    assert [photo.name for photo in inputs.photos] == ["a.png", "b.png", "c.png"]
    assert capsys.readouterr().err.splitlines() == [
        f"splatscale: {photos}: skipping 1 dot-named file: .hidden.jpg",
        f"splatscale: {photos}: not read: sub/ (prepare reads a folder's own files, not "
        "its subfolders)"]
    for name in ("a.png", "b.png", "c.png"):
        (photos / name).unlink()
    code = prepare(photos, "-o", tmp_path / "scene")
    assert_clean_error(code, capsys.readouterr().err, "no images", "not read: sub/")


def test_a_video_of_fewer_frames_than_asked_gives_them_all_and_says_so(tmp_path, capsys):
    video = tmp_path / "clip.mp4"
    write_video(some_photos(tmp_path / "photos", every=1)[:6], video)
    request = Request(video, tmp_path / "scene", 500, SfmSettings(), progress=False)
    inputs = check_inputs(request)
    assert capsys.readouterr().err.splitlines() == [
        f"splatscale: --frames 500: {video} holds 6 frames; all 6 are taken"]
    assert inputs.frames == {video: (6, 6)} and recorded_settings(request, inputs)["frames"] == 6


def test_frames_asked_of_photos_are_refused(tmp_path, capsys):
    some_photos(tmp_path / "photos", every=40)
    code = prepare(tmp_path / "photos", "-o", tmp_path / "scene", "--frames", "5")
    assert_clean_error(code, capsys.readouterr().err, "--frames: takes frames from a video",
                       "holds photos")
    assert not (tmp_path / "scene").exists()


def test_a_video_cut_short_is_counted_and_said(tmp_path, capsys):
    video = tmp_path / "clip.avi"  # AVI's header lists the frames, and stays when cut
    write_video(some_photos(tmp_path / "photos", every=1)[:40], video)
    video.write_bytes(video.read_bytes()[:video.stat().st_size // 2])
    inputs = checked(video, tmp_path / "scene", frames=10)
    held = re.search(r"holds (\d+) of the 40 frames its header lists",
                     capsys.readouterr().err).group(1)
    assert 10 < int(held) < 40 and inputs.frames == {video: (10, int(held))}
    frames = tmp_path / "frames"
    assert len(extract_frames(video, 10, int(held), frames)) == 10
    assert capsys.readouterr().err == ""
    extract_frames(video, 10, 40, tmp_path / "trusting the header")
    assert f"decoding ended after {held} of its 40 frames" in capsys.readouterr().err


def test_heic_photos_are_read_upright_and_other_files_named(tmp_path, capsys):
    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(2):
        noise_image(photos / f"IMG_{i}.HEIC", seed=i, quality=-1)
    pixels = np.zeros((40, 60, 3), np.uint8)
    pixels[:, :10] = 255  # a white band on the left of the stored image
    exif = Image.Exif()
    exif[ORIENTATION] = 6  # pillow-heif writes it as HEIF's rotation (irot)
    Image.fromarray(pixels).save(photos / "turned.heic", exif=exif.tobytes(), quality=-1)
    for name in ("notes.txt", "IMG_0.AAE"):
        (photos / name).write_text("not a photo")
    inputs = checked(photos, tmp_path / "scene")
    assert [photo.name for photo in inputs.photos] == ["IMG_0.HEIC.png", "IMG_1.HEIC.png",
                                                       "turned.heic.png"]
    assert capsys.readouterr().err.splitlines() == [
        f"splatscale: {photos}: skipping 2 files neither photo nor video: IMG_0.AAE, notes.txt"]
    turned = inspect_photo(photos / "turned.heic")
    assert turned.camera[-1] == "(40, 60)"
    (tmp_path / "out").mkdir()
    write_photo(turned, tmp_path / "out")
    with Image.open(tmp_path / "out" / "turned.heic.png") as written:
        assert written.format == "PNG" and written.size == (40, 60)
        upright = np.asarray(written.convert("L"), dtype=float)
    assert upright[:10].mean() > 200 and upright[20:].mean() < 50  # the band is on top


A_FILE = {"size": 1, "mtime_ns": 1}
BAD_MANIFESTS = {
    "not a JSON object": [],
    "'settings'": {"settings": ["input"]},
    "'cameras'": {"settings": {}, "cameras": [["a.jpg", 3]], "sequences": [["a.jpg"]]},
    "'sequences' is missing": {"settings": {}, "cameras": [["a.jpg"]]},
    "same images": {"settings": {}, "cameras": [["a.jpg"]], "sequences": [["b.jpg"]]},
    "'sources'": {"settings": {}, "sources": {"a.jpg": {"size": "big", "mtime_ns": 1}}},
    "file names": {"settings": {}, "cameras": [["../a.jpg"]], "sequences": [["../a.jpg"]]},
    "'cameras' names no image of b.jpg of 'sources'": {
        "settings": {}, "sources": {"a.jpg": A_FILE, "b.jpg": A_FILE},
        "cameras": [["a.jpg"]], "sequences": [["a.jpg"]]},
    "'cameras' names x.jpg, made from nothing in 'sources'": {
        "settings": {}, "sources": {"a.jpg": A_FILE},
        "cameras": [["a.jpg", "x.jpg"]], "sequences": [["a.jpg", "x.jpg"]]},
}


def test_the_manifests_images_are_those_of_its_sources():
    """A photo's image is named as the photo, "_" for whitespace, with ".png" where it
    was converted; a video's frames by the video's name and their index."""
    for sources, images in (({"a b.jpg": A_FILE, "c.tif": A_FILE}, ["a_b.jpg", "c.tif.png"]),
                            ({"my clip.mp4": A_FILE}, ["my_clip.mp4_000000.jpg",
                                                       "my_clip.mp4_000031.jpg"])):
        manifest = {"settings": {}, "sources": sources, "cameras": [images],
                    "sequences": [images]}
        assert manifest_problem(manifest) is None, manifest


@pytest.mark.parametrize("field", BAD_MANIFESTS)
def test_every_field_read_from_the_manifest_is_checked(field, tmp_path, capsys):
    scene = made_scene(tmp_path / "scene")
    (scene / "prepare.json").write_text(json.dumps(BAD_MANIFESTS[field]))
    some_photos(tmp_path / "photos", every=40)
    before = snapshot(scene)
    code = prepare(tmp_path / "photos", "-o", scene)
    assert_clean_error(code, capsys.readouterr().err, str(scene / "prepare.json"), field,
                       "--overwrite")
    assert snapshot(scene) == before


@pytest.mark.parametrize("change", ["extra", "missing"])
def test_settings_the_manifest_has_more_or_fewer_of_are_named(change, tmp_path, capsys):
    photos = tmp_path / "photos"
    some_photos(photos, every=40)
    scene = made_scene(tmp_path / "scene")
    settings = {"input": str(photos.resolve()), "camera_model": "SIMPLE_RADIAL",
                "max_image_size": 3200, "frames": None}
    if change == "extra":
        settings["from_a_later_version"] = 1
    else:
        del settings["frames"]  # the value prepare now has for photos: changed all the same
    (scene / "prepare.json").write_text(json.dumps({"settings": settings}))
    before = snapshot(scene)
    code = prepare(photos, "-o", scene)
    named = "from_a_later_version" if change == "extra" else "frames"
    assert_clean_error(code, capsys.readouterr().err, f"with other settings ({named})")
    assert snapshot(scene) == before


def test_a_manifest_without_the_sources_record_is_continued(tmp_path):
    photos = tmp_path / "photos"
    some_photos(photos, every=40)
    scene = made_scene(tmp_path / "scene")
    settings = {"input": str(photos.resolve()), "camera_model": "SIMPLE_RADIAL"}
    written_before_the_record = {"settings": settings, "cameras": [["a.jpg"]],
                                 "sequences": [["a.jpg"]]}
    (scene / "prepare.json").write_text(json.dumps(written_before_the_record))
    record = source_record(tuple(sorted(photos.iterdir())))
    assert SceneFolder(scene).check(settings, record, False) == written_before_the_record


def test_a_camera_model_prepare_does_not_know_is_one_line(tmp_path, capsys):
    some_photos(tmp_path / "photos", every=40)
    with pytest.raises(SystemExit) as refused:  # argparse's refusal
        prepare(tmp_path / "photos", "-o", tmp_path / "scene", "--camera-model",
                "OPENCV_FISHEYE_WIDE")
    assert_clean_error(refused.value.code, capsys.readouterr().err, "--camera-model",
                       "OPENCV_FISHEYE_WIDE")
    assert not (tmp_path / "scene").exists()


def test_a_fisheye_camera_without_a_focal_prior_is_given_a_typical_lens(tmp_path):
    """COLMAP verifies no pair of fisheye views without a prior focal length: a fisheye
    camera without one (no EXIF) gets a 150-degree lens's; others are left alone."""
    import pycolmap

    database = tmp_path / "database.db"
    cameras = [("OPENCV_FISHEYE", False), ("RADIAL_FISHEYE", False), ("OPENCV_FISHEYE", True),
               ("SIMPLE_RADIAL", False)]
    with pycolmap.Database.open(str(database)) as db:
        ids = []
        for model, prior in cameras:
            camera = pycolmap.Camera.create_from_model_name(0, model, 594.0, 495, 371)
            camera.has_prior_focal_length = prior
            ids.append(db.write_camera(camera))
    for camera_id in ids:
        give_fisheye_a_focal_prior(database, camera_id)
    typical = math.hypot(495, 371) / 2 / math.radians(75)
    with pycolmap.Database.open(str(database)) as db:
        found = [db.read_camera(camera_id) for camera_id in ids]
    assert [list(found[0].params[:2]), found[1].params[0]] == [[typical, typical], typical]
    assert found[0].has_prior_focal_length and found[1].has_prior_focal_length
    assert found[2].params[0] == found[3].params[0] == 594.0
    assert not found[3].has_prior_focal_length

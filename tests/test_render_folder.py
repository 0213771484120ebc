"""`render` writes into a folder of renders and never replaces a file it did not write;
each view's render is named by its image's path, so no two meet."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from splatscale.cli import main
from splatscale.model.ply import write_ply
from splatscale.errors import DataError
from splatscale.train.render_folder import check_distinct, photo_name, render_names
from tests.conftest import random_model
from tests.test_bad_input import assert_clean_error
from tests.test_refused_runs import snapshot

IMAGES = ("cam0/f0.png", "cam0/f1.png", "cam1/f0.png", "cam1/f1.png")


@pytest.fixture
def scene(tmp_path) -> tuple[Path, Path]:
    """A transforms.json scene whose images of two cameras share their file names, and a
    model to render there."""
    root = tmp_path / "scene"
    rng = np.random.default_rng(0)
    frames = []
    for i, name in enumerate(IMAGES):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)).save(root / name)
        pose = np.eye(4)
        pose[:3, 3] = [0.2 * i, 0.0, 3.0]  # OpenGL axes: looking down -z at the origin
        frames.append({"file_path": name, "transform_matrix": pose.tolist()})
    (root / "transforms.json").write_text(json.dumps({"fl_x": 30.0, "frames": frames}))
    model = tmp_path / "model.ply"
    write_ply(random_model(50, dtype=torch.float32), model)
    return root, model


def render(model: Path, root: Path, output: Path, tmp_path: Path) -> int:
    return main(["render", str(model), "--data", str(root), "--split", "all", "-o",
                 str(output), "--cache-dir", str(tmp_path / "cache")])


def test_views_of_two_cameras_with_one_file_name_keep_apart(scene, tmp_path, capsys):
    root, model = scene
    assert render(model, root, tmp_path / "out", tmp_path) == 0
    assert capsys.readouterr().out.startswith("4 renders in ")
    pngs = sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*.png"))
    assert pngs == sorted(f"{name}.png" for name in IMAGES)


def test_a_folder_of_the_users_files_is_never_written(scene, tmp_path, capsys):
    root, model = scene
    before = snapshot(root)
    for output in (root, root / "cam0"):
        assert render(model, root, output, tmp_path) == 2
        assert_clean_error(2, capsys.readouterr().err, str(output), "which no render wrote")
    assert snapshot(root) == before


def test_renders_replace_their_own_files_alone(scene, tmp_path, capsys):
    root, model = scene
    out = tmp_path / "out"
    assert render(model, root, out, tmp_path) == 0
    (out / "notes.txt").write_text("the user's own")
    assert render(model, root, out, tmp_path) == 0  # its own renders, written again
    assert (out / "notes.txt").read_text() == "the user's own"
    listed = json.loads((out / "renders.json").read_text())["files"]
    assert sorted(listed) == sorted(f"{name}.png" for name in IMAGES)

    (out / listed[0]).unlink()
    (out / "renders.json").write_text(json.dumps({"files": listed[1:]}))  # not ours now
    (out / listed[0]).write_bytes(b"the user's file")
    before = snapshot(out)
    assert render(model, root, out, tmp_path) == 2
    assert_clean_error(2, capsys.readouterr().err, listed[0], "no render wrote it")
    assert snapshot(out) == before


def test_renders_never_write_through_a_link(scene, tmp_path, capsys):
    root, model = scene
    out = tmp_path / "out"
    assert render(model, root, out, tmp_path) == 0
    victim = tmp_path / "victim.png"
    victim.write_bytes(b"the user's own")
    (out / "cam0" / "f0.png.png").unlink()
    (out / "cam0" / "f0.png.png").symlink_to(victim)
    assert render(model, root, out, tmp_path) == 2
    assert_clean_error(2, capsys.readouterr().err, "cam0/f0.png.png", "no render wrote it")
    assert victim.read_bytes() == b"the user's own"


def test_a_list_of_renders_naming_files_outside_its_folder_is_refused(scene, tmp_path,
                                                                     capsys):
    root, model = scene
    out = tmp_path / "out"
    out.mkdir()
    (out / "renders.json").write_text(json.dumps({"files": ["../victim.png"]}))
    assert render(model, root, out, tmp_path) == 2
    assert_clean_error(2, capsys.readouterr().err, "renders.json", "inside its folder")


def test_render_names_are_distinct_and_stay_inside_the_folder():
    names = ["x.jpg", "x.png", "x.jpg.png", "../a.jpg", "__/a.jpg", "%2E%2E/a.jpg",
             "/abs/f.png", "abs/f.png"]
    files = render_names(names)
    assert files[:3] == ["x.jpg.png", "x.png.png", "x.jpg.png.png"]
    assert len(set(files + [photo_name(f) for f in files])) == 2 * len(names)
    assert not any(part in ("..", "") for f in files for part in f.split("/"))
    assert not any(f.startswith("/") for f in files)
    with pytest.raises(DataError, match="one image in two ways"):
        check_distinct(render_names(["a/b.jpg", "a//b.jpg"]))

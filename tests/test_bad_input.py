"""Bad input: one clear line naming the file and the problem, exit status 2, and
nothing already in the output folder damaged."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.conftest import data_path


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "splatscale", *args], capture_output=True,
                          text=True, timeout=300)


def assert_clean_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture
def output(tmp_path) -> Path:
    """An output folder holding an earlier run's files, which must survive."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "point_cloud.ply").write_bytes(b"earlier model")
    (out / "config.json").write_text('{"earlier": true}')
    return out


def assert_untouched(out: Path) -> None:
    assert (out / "point_cloud.ply").read_bytes() == b"earlier model"
    assert (out / "config.json").read_text() == '{"earlier": true}'
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "point_cloud.ply"]


@pytest.fixture
def small_colmap(tmp_path) -> Path:
    """A writable copy of snowmiku (model and images)."""
    source = data_path("snowmiku")
    root = tmp_path / "scene"
    shutil.copytree(source / "sparse", root / "sparse")
    (root / "images").mkdir()
    for path in sorted((source / "images").iterdir()):
        shutil.copy(path, root / "images" / path.name)
    return root


def test_missing_data_path(output):
    result = run_cli("train", str(output.parent / "nowhere"), "-o", str(output))
    assert_clean_error(result, "nowhere", "no such file or folder")
    assert_untouched(output)


def test_images_named_by_the_model_but_missing(small_colmap, output):
    missing = sorted((small_colmap / "images").iterdir())[5]
    missing.unlink()
    result = run_cli("train", str(small_colmap), "-o", str(output), "--iterations", "2")
    assert_clean_error(result, missing.name, "missing")
    assert_untouched(output)


def test_corrupt_jpeg(small_colmap, output):
    broken = sorted((small_colmap / "images").iterdir())[7]
    broken.write_bytes(b"\xff\xd8\xff\xe0 this is not a JPEG")
    result = run_cli("train", str(small_colmap), "-o", str(output), "--iterations", "2")
    assert_clean_error(result, broken.name, "not a readable image")
    assert_untouched(output)


def test_empty_point_cloud(small_colmap, output):
    import pycolmap

    recon = pycolmap.Reconstruction(str(small_colmap / "sparse" / "0"))
    for point_id in list(recon.points3D):
        recon.delete_point3D(point_id)
    recon.write(str(small_colmap / "sparse" / "0"))
    result = run_cli("train", str(small_colmap), "-o", str(output), "--iterations", "2")
    assert_clean_error(result, "sparse/0", "no 3D points")
    assert_untouched(output)


def test_ply_with_missing_properties(tmp_path):
    from plyfile import PlyData, PlyElement

    records = np.zeros(3, dtype=[("x", "f4"), ("y", "f4"), ("z", "f4")])
    PlyData([PlyElement.describe(records, "vertex")]).write(str(tmp_path / "points.ply"))
    result = run_cli("export", str(tmp_path / "points.ply"), "--format", "splat")
    assert_clean_error(result, "points.ply", "missing PLY properties", "f_dc_0")
    assert not (tmp_path / "points.splat").exists()


def test_not_a_scene_folder(tmp_path, output):
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp_path / "lonely.png")
    result = run_cli("train", str(tmp_path), "-o", str(output))
    assert_clean_error(result, str(tmp_path), "no COLMAP model")
    assert_untouched(output)

"""Bad input: one line naming the file (or flag) and the problem, exit status 2, no
traceback, and nothing already in the output folder damaged."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from splatscale.cli import main
from splatscale.model.ply import write_ply
from tests.conftest import HANG_GUARD, data_path, random_model

EARLIER = {"point_cloud.ply": b"earlier model", "config.json": b'{"earlier": true}',
           "notes.txt": b"the user's own file"}


def run_cli(*args: str, **options) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "splatscale", *args], capture_output=True,
                          text=True, timeout=HANG_GUARD, **options)


def on_a_terminal(stderr: str) -> list[str]:
    """The lines a terminal shows of ``stderr``: a progress bar that was cleared (with
    carriage returns) is gone."""
    shown = (line.rsplit("\r", 1)[-1] for line in stderr.split("\n"))
    return [line for line in shown if line.strip()]


def assert_clean_error(code: int, stderr: str, *fragments: str) -> None:
    assert code == 2, stderr
    lines = on_a_terminal(stderr)
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert lines[0].startswith("splatscale: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture
def output(tmp_path) -> Path:
    """An output folder holding an earlier run's files, which must survive."""
    out = tmp_path / "out"
    out.mkdir()
    for name, content in EARLIER.items():
        (out / name).write_bytes(content)
    return out


def assert_untouched(out: Path) -> None:
    assert {p.name: p.read_bytes() for p in out.iterdir()} == EARLIER


@pytest.fixture
def small_colmap(tmp_path) -> Path:
    """A writable copy of snowmiku (model and images)."""
    source = data_path("snowmiku")
    root = tmp_path / "scene"
    shutil.copytree(source / "sparse", root / "sparse")
    shutil.copytree(source / "images", root / "images")
    return root


def test_missing_data_path(output):
    result = run_cli("train", str(output.parent / "nowhere"), "-o", str(output), "--overwrite")
    assert_clean_error(result.returncode, result.stderr, "nowhere", "no such file or folder")
    assert_untouched(output)


def test_images_named_by_the_model_but_missing(small_colmap, output):
    missing = sorted((small_colmap / "images").iterdir())[5]
    missing.unlink()
    result = run_cli("train", str(small_colmap), "-o", str(output), "--iterations", "2",
                     "--overwrite")
    assert_clean_error(result.returncode, result.stderr, missing.name, "missing")
    assert_untouched(output)


@pytest.mark.parametrize("damage, fragment", [
    (lambda p: p.write_bytes(b"\xff\xd8\xff\xe0 this is not a JPEG"), "not a readable image"),
    (lambda p: Image.open(p).resize((200, 100)).save(p),
     "image is 200x100, its camera says 495x371"),
])
def test_bad_image_is_found_before_the_folder_is_touched(small_colmap, output, damage, fragment):
    broken = sorted((small_colmap / "images").iterdir())[7]
    damage(broken)
    result = run_cli("train", str(small_colmap), "-o", str(output), "--iterations", "2",
                     "--overwrite")
    assert_clean_error(result.returncode, result.stderr, broken.name, fragment)
    assert_untouched(output)


def test_empty_point_cloud(small_colmap, output):
    import pycolmap

    recon = pycolmap.Reconstruction(str(small_colmap / "sparse" / "0"))
    for point_id in list(recon.points3D):
        recon.delete_point3D(point_id)
    recon.write(str(small_colmap / "sparse" / "0"))
    result = run_cli("train", str(small_colmap), "-o", str(output), "--iterations", "2",
                     "--overwrite")
    assert_clean_error(result.returncode, result.stderr, "sparse/0", "no 3D points")
    assert_untouched(output)


def test_not_a_scene_folder(tmp_path, output):
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp_path / "lonely.png")
    result = run_cli("train", str(tmp_path), "-o", str(output), "--overwrite")
    assert_clean_error(result.returncode, result.stderr, str(tmp_path), "no COLMAP model")
    assert_untouched(output)


# -- transforms.json: every frame's numbers are checked before use --------------------

def frame(**changes) -> dict:
    return {"file_path": "f0.png", "transform_matrix": np.eye(4).tolist(), **changes}


SINGULAR = np.eye(4)
SINGULAR[:3, :3] = 0
SCALED = np.eye(4) * 2
SCALED[3, 3] = 1
NAN_MATRIX = np.eye(4)
NAN_MATRIX[0, 3] = float("nan")

BAD_TRANSFORMS = {
    "nan matrix": ({"fl_x": 20, "frames": [frame(transform_matrix=NAN_MATRIX.tolist())]},
                   "transform_matrix is not a 4x4 matrix of finite numbers"),
    "singular matrix": ({"fl_x": 20, "frames": [frame(transform_matrix=SINGULAR.tolist())]},
                        "transform_matrix is singular"),
    "scaled rotation": ({"fl_x": 20, "frames": [frame(transform_matrix=SCALED.tolist())]},
                        "not a proper rotation"),
    "ragged matrix": ({"fl_x": 20, "frames": [frame(transform_matrix=[[1, 0], [0, 1, 0]])]},
                      "transform_matrix is not a 4x4 matrix"),
    "file_path null": ({"fl_x": 20, "frames": [frame(file_path=None)]},
                       "file_path is not a file name"),
    "focal not a number": ({"fl_x": "wide", "frames": [frame()]}, "fl_x is not a number ('wide')"),
    "focal zero": ({"fl_x": 0, "frames": [frame()]}, "focal lengths must be positive"),
    "angle zero": ({"camera_angle_x": 0, "frames": [frame()]}, "camera_angle_x must be an angle"),
    "width zero": ({"fl_x": 20, "w": 0, "h": 10, "frames": [frame()]}, "is not a positive size"),
    "no frames": ({"fl_x": 20, "frames": []}, "no 'frames' list"),
}


@pytest.mark.parametrize("name", BAD_TRANSFORMS)
def test_bad_transforms_json(name, tmp_path, output, capsys):
    meta, fragment = BAD_TRANSFORMS[name]
    scene = tmp_path / "scene"
    scene.mkdir()
    Image.fromarray(np.full((10, 12, 3), 100, np.uint8)).save(scene / "f0.png")
    (scene / "transforms.json").write_text(json.dumps(meta))
    code = main(["train", str(scene), "-o", str(output), "--overwrite", "--quiet"])
    assert_clean_error(code, capsys.readouterr().err, "transforms.json", fragment)
    assert_untouched(output)


# -- models and checkpoints --------------------------------------------------------

def broken_models(folder: Path) -> dict[str, tuple[Path, str]]:
    good = folder / "good.ply"
    write_ply(random_model(20, dtype=torch.float32), good)
    truncated = folder / "truncated.ply"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    empty = folder / "empty.ply"
    write_ply(random_model(0, dtype=torch.float32), empty)
    nan = random_model(20, dtype=torch.float32)
    nan.log_scales[[3, 7]] = float("inf")
    nan.means[7, 0] = float("nan")
    write_ply(nan, folder / "nan.ply")
    (folder / "zero.ply").write_bytes(b"")
    return {"truncated": (truncated, "not a 3DGS PLY file"),
            "empty": (empty, "the model has no Gaussians"),
            "nan": (folder / "nan.ply",
                    "2 of 20 Gaussians have NaN or infinite values (rows 3, 7)"),
            "zero bytes": (folder / "zero.ply", "not a 3DGS PLY file")}


@pytest.mark.parametrize("name", ["truncated", "empty", "nan", "zero bytes"])
@pytest.mark.parametrize("command", ["eval", "export"])
def test_bad_models_are_refused(tmp_path, capsys, name, command):
    path, fragment = broken_models(tmp_path)[name]
    extra = ["--format", "splat"] if command == "export" else []
    code = main([command, str(path), *extra])
    assert_clean_error(code, capsys.readouterr().err, path.name, fragment)
    assert not path.with_suffix(".splat").exists()


@pytest.mark.parametrize("content, fragment", [
    (b"garbage, not a checkpoint", "not a readable checkpoint"),
    (b"", "not a readable checkpoint"),
    ("pickle", "not a splatscale checkpoint"),
])
def test_bad_checkpoints_are_refused(output, capsys, content, fragment):
    checkpoint = output / "checkpoint.pt"
    if content == "pickle":
        torch.save({"weights": torch.zeros(3)}, checkpoint)  # another program's file
    else:
        checkpoint.write_bytes(content)
    before = checkpoint.read_bytes()
    code = main(["train", "-o", str(output), "--resume", "--quiet"])
    assert_clean_error(code, capsys.readouterr().err, "checkpoint.pt", fragment)
    assert checkpoint.read_bytes() == before
    checkpoint.unlink()
    assert_untouched(output)


# -- flags and the environment -------------------------------------------------------

@pytest.mark.parametrize("flags, fragment", [
    (["--threads", "-1"], "argument --threads: must be between 1"),
    (["--threads", "1000"], "argument --threads: must be between 1"),
    (["--threads", "two"], "argument --threads: not an integer: 'two'"),
    (["--max-width", "0"], "argument --max-width: must be at least 16"),
    (["--iterations", "0"], "argument --iterations: must be at least 1"),
    (["--batch-size", "-2"], "argument --batch-size: must be at least 1"),
    (["--checkpoint-every", "-5"], "argument --checkpoint-every: must be at least 0"),
    (["--save-at", "0"], "argument --save-at: must be at least 1"),
    (["--resume", "--overwrite"], "--resume and --overwrite: choose one"),
    (["--pixel-cost", "0"], "argument --pixel-cost: must be a finite number above 0, got 0"),
    (["--intersection-cost", "inf"], "argument --intersection-cost: must be a finite number"),
    (["--pixel-cost", "cheap"], "argument --pixel-cost: not a number: 'cheap'"),
    (["--no-forwarding"], "--no-forwarding: only with --offload"),
    (["--forwarding"], "--forwarding: only with --offload"),
    (["--lookahead"], "--lookahead: only with --offload"),
    (["--no-lookahead"], "--no-lookahead: only with --offload"),
    (["--comm", "gloo"], "--comm gloo: chooses how several ranks talk"),
    (["--comm", "nccl", "--nproc", "2"], "--comm nccl: NCCL joins GPUs"),
])
def test_bad_flags(output, capsys, flags, fragment):
    with pytest.raises(SystemExit) as exit_info:
        code = main(["train", "-o", str(output), "--quiet", *flags])
        raise SystemExit(code)
    assert_clean_error(exit_info.value.code, capsys.readouterr().err, fragment)
    assert_untouched(output)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
@pytest.mark.parametrize("ranks", [[], ["--nproc", "2"]])
def test_cuda_without_a_gpu_says_so(output, capsys, ranks):
    code = main(["train", "-o", str(output), "--quiet", "--device", "cuda", *ranks])
    assert_clean_error(code, capsys.readouterr().err, "sees no CUDA device",
                       "or train with --device cpu")
    assert_untouched(output)


@pytest.mark.parametrize("missing, fragment", [
    ({"gsplat.cuda": None}, "pip install 'splatscale[cuda]'"),
    ({"gsplat.cuda._backend": type(sys)("no_toolkit")}, "no CUDA toolkit"),
])
def test_cuda_without_gsplat_or_its_compiler_says_what_to_install(output, capsys, monkeypatch,
                                                                   missing, fragment):
    from splatscale.backends import cuda as cuda_backend
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for name, module in missing.items():
        if module is not None:
            module._C = None  # what gsplat leaves when it finds no nvcc
        monkeypatch.setitem(sys.modules, name, module)
    cuda_backend.cuda_kernels.cache_clear()
    try:
        code = main(["train", "-o", str(output), "--device", "cuda"])
    finally:
        cuda_backend.cuda_kernels.cache_clear()
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and fragment in err, err
    assert_untouched(output)


def test_output_that_is_a_file(tmp_path, capsys):
    target = tmp_path / "taken"
    target.write_text("a file")
    code = main(["train", "-o", str(target), "--quiet"])
    assert_clean_error(code, capsys.readouterr().err, str(target), "exists and is not a folder")
    assert target.read_text() == "a file"


def test_a_write_that_fails_names_the_file(tmp_path):
    """A file size limit stands in for a full disk: the checkpoint (~90 kB, written
    before the model) cannot be written. A first run here writes the demo's images and
    the kernels' cache, which the limited run then only reads."""
    cache = ["--cache-dir", str(tmp_path / "cache")]
    assert main(["train", "-o", str(tmp_path / "warm"), "--iterations", "2", "--quiet",
                 *cache]) == 0

    def limit_file_size():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail the write rather than kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, 50_000))

    out = tmp_path / "out"
    result = run_cli("train", "-o", str(out), "--iterations", "2", "--schedule-scale", "1",
                     "--quiet", *cache, preexec_fn=limit_file_size)
    assert_clean_error(result.returncode, result.stderr, str(out / "checkpoint.pt"),
                       "File too large")
    assert not (out / "point_cloud.ply").exists(), "no model without its checkpoint"


def test_output_files_follow_the_umask(tmp_path):
    cache = ["--cache-dir", str(tmp_path / "cache")]
    out = tmp_path / "out"
    result = run_cli("train", "-o", str(out), "--iterations", "20", "--quiet", *cache,
                     "--checkpoint-every", "10", preexec_fn=lambda: os.umask(0o027))
    assert result.returncode == 0, result.stderr
    result = run_cli("train", "-o", str(out), "--iterations", "30", "--quiet", *cache,
                     "--resume", preexec_fn=lambda: os.umask(0o027))
    assert result.returncode == 0, result.stderr
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir() if p.is_file()}
    assert set(modes.values()) == {0o640}, modes


def test_iterations_that_are_no_multiple_of_the_batch_say_what_is_trained(tmp_path, capsys):
    assert main(["train", "-o", str(tmp_path / "out"), "--iterations", "10", "--batch-size", "4",
                 "--quiet", "--cache-dir", str(tmp_path / "cache")]) == 0
    assert ("--iterations 10 is not a multiple of --batch-size 4: the run trains on 12 images"
            in capsys.readouterr().err)


def test_a_bug_says_it_is_one(monkeypatch, tmp_path, capsys):
    from splatscale import commands

    monkeypatch.setitem(commands.COMMANDS, "export", lambda args: [][1])
    assert main(["export", str(tmp_path / "m.ply"), "--format", "splat"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "this is a bug in splatscale" in err


def test_an_image_listed_twice_is_refused(small_colmap, output):
    """COLMAP's text model with image 1 listed again, as image 98, at another pose."""
    import pycolmap

    sparse = small_colmap / "sparse" / "0"
    pycolmap.Reconstruction(str(sparse)).write_text(str(sparse))
    for binary in sparse.glob("*.bin"):
        binary.unlink()
    for name, prefix, replace in (("images.txt", "1 ", {0: "98", 5: "0.5"}),
                                  ("frames.txt", "1 1 ", {0: "98", 2: "0.5", -1: "98"})):
        lines = (sparse / name).read_text().split("\n")[:-1]  # each line ends with one
        fields = next(line for line in lines if line.startswith(prefix)).split()
        for index, value in replace.items():
            fields[index] = value
        extra = [" ".join(fields), ""] if name == "images.txt" else [" ".join(fields)]
        (sparse / name).write_text("\n".join(lines + extra) + "\n")
    image = sorted((small_colmap / "images").iterdir())[0].name
    result = run_cli("train", str(small_colmap), "-o", str(output), "--overwrite")
    assert_clean_error(result.returncode, result.stderr, f"image {image} is listed twice")
    assert_untouched(output)


def test_points_that_are_not_finite_are_dropped_saying_how_many(small_colmap, capsys):
    import pycolmap

    from splatscale.data.colmap import read_colmap

    sparse = small_colmap / "sparse" / "0"
    recon = pycolmap.Reconstruction(str(sparse))
    first = min(recon.points3D)
    recon.points3D[first].xyz = np.array([np.nan, 0.0, 0.0])
    recon.write(str(sparse))
    scene = read_colmap(small_colmap)
    assert np.isfinite(scene.points).all() and len(scene.points) == len(recon.points3D) - 1
    assert f"dropped 1 of {len(recon.points3D)} points with NaN" in capsys.readouterr().err

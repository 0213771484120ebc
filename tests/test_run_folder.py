"""The output folder is sacred: runs never mix, one writer at a time, nothing stale
left behind, resume continues the run it finds, Ctrl-C leaves a checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from splatscale.cli import main
from splatscale.model.ply import write_ply
from splatscale.folder_lock import LOCK_NAME
from tests.test_bad_input import assert_clean_error
from tests.test_refused_runs import snapshot
from tests.conftest import HANG_GUARD, random_model, wait_until


@pytest.fixture
def cache(tmp_path_factory) -> list[str]:
    return ["--cache-dir", str(tmp_path_factory.getbasetemp() / "demo-cache")]


def train(out: Path, cache: list[str], *flags: str) -> int:
    return main(["train", "-o", str(out), "--quiet", *cache, *flags])


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_new_run_never_replaces_a_previous_one_unasked(tmp_path, cache, capsys):
    out = tmp_path / "run"
    assert train(out, cache, "--iterations", "20") == 0
    (out / "notes.txt").write_text("mine")
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    capsys.readouterr()
    assert train(out, cache, "--iterations", "10") == 2
    err = capsys.readouterr().err
    assert "holds a previous run" in err and "--overwrite" in err and "--resume" in err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before

    assert train(out, cache, "--iterations", "10", "--overwrite", "--save-at", "10") == 0
    assert [m["images"] for m in metrics(out)] == [10], "no line of the earlier run is left"
    assert json.loads((out / "report.json").read_text())["iterations"] == 10
    assert (out / "notes.txt").read_text() == "mine", "files not of a run stay"


def test_overwrite_removes_the_runs_own_files_alone(tmp_path, cache, capsys):
    out = tmp_path / "run"
    assert train(out, cache, "--iterations", "20", "--eval", "--save-at", "10") == 0
    users = {"point_cloud_best.ply": "mine", "checkpoint.pt.mybackup.rank0": "mine",
             "renders/test/notes.txt": "mine", "renders/mine/a.png": "mine"}
    for name, text in users.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    assert train(out, cache, "--iterations", "10", "--overwrite") == 0
    for name, text in users.items():
        assert (out / name).read_text() == text, name
    assert not (out / "point_cloud_10.ply").exists(), "the run's own model is removed"
    assert sorted(p.name for p in (out / "renders" / "test").iterdir()) == ["notes.txt"]

    only_the_users = tmp_path / "theirs"
    only_the_users.mkdir()
    (only_the_users / "point_cloud_v2.ply").write_text("mine")
    assert train(only_the_users, cache, "--iterations", "10") == 0


def test_a_link_where_the_run_writes_is_refused_before_anything_goes(tmp_path, cache,
                                                                      capsys):
    out = tmp_path / "run"
    assert train(out, cache, "--iterations", "20", "--eval") == 0
    elsewhere = tmp_path / "elsewhere"
    (out / "renders").rename(elsewhere)
    (out / "renders").symlink_to(elsewhere)
    before = snapshot(out)
    capsys.readouterr()
    assert train(out, cache, "--iterations", "10", "--overwrite") == 2
    assert_clean_error(2, capsys.readouterr().err, str(out / "renders"), "a link")
    assert snapshot(out) == before and (elsewhere / "test" / "renders.json").is_file()


def test_one_run_at_a_time(tmp_path, cache, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_NAME).write_text(f"{os.getpid()} {os.uname().nodename}\n")  # alive: us
    assert train(out, cache, "--iterations", "10") == 2
    assert f"process {os.getpid()}" in capsys.readouterr().err
    assert not (out / "config.json").exists()

    finished = subprocess.Popen(["true"])
    finished.wait()
    (out / LOCK_NAME).write_text(f"{finished.pid} {os.uname().nodename}\n")  # a dead process
    assert train(out, cache, "--iterations", "10") == 0
    assert f"taking over the lock of process {finished.pid}" in capsys.readouterr().err
    assert not (out / LOCK_NAME).exists(), "released at the end"


def test_resume_cleans_up_and_continues_the_run_it_finds(tmp_path, cache, capsys):
    out = tmp_path / "run"
    assert train(out, cache, "--iterations", "20", "--checkpoint-every", "10") == 0
    # A killed continuation: log lines past the checkpoint, a half-written checkpoint.
    with open(out / "metrics.jsonl", "a") as log:
        log.write(json.dumps({"step": 30, "images": 30}) + "\n" + '{"step": 40, "ima')
    (out / ".checkpoint.pt.k1ll3d_x.tmp").write_bytes(b"half")
    (out / ".notes.tmp").write_text("the user's own, of that shape")
    capsys.readouterr()

    assert train(out, cache, "--resume", "--iterations", "40", "--batch-size", "4") == 0
    err = capsys.readouterr().err
    assert "--batch-size 4 ignored: the resumed run keeps --batch-size 1" in err
    assert "the run now ends after 40 images (it was to end after 20)" in err
    assert [m["images"] for m in metrics(out)] == [10, 20, 30, 40], "each step logged once"
    assert [p.name for p in out.glob(".*.tmp")] == [".notes.tmp"]

    # Without --iterations a resume goes to the run's own end, here already reached.
    assert train(out, cache, "--resume") == 0
    assert json.loads((out / "report.json").read_text())["iterations"] == 40


def test_resume_refuses_another_scene_or_split(tmp_path, cache, capsys):
    """A run that kept no record (config.json) is resumed with the flags as given: the
    checkpoint refuses what it was not trained on."""
    out = tmp_path / "run"
    assert train(out, cache, "--iterations", "10") == 0
    (out / "config.json").unlink()
    capsys.readouterr()
    assert train(out, cache, "--resume", "--resolution", "2") == 2
    assert "a checkpoint of another scene" in capsys.readouterr().err
    assert train(out, cache, "--resume", "--eval") == 2
    assert "trained without --eval" in capsys.readouterr().err


def test_export_never_writes_over_its_input(tmp_path, capsys):
    model = tmp_path / "model.ply"
    write_ply(random_model(10, dtype=torch.float32), model)
    before = model.read_bytes()
    assert main(["export", str(model), "--format", "ply"]) == 2
    assert "--format ply: " in capsys.readouterr().err
    assert main(["export", str(model), "--format", "ply", "-o", str(model)]) == 2
    assert "is the input model" in capsys.readouterr().err
    assert model.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.ply"]


def test_export_never_replaces_a_file_unasked(tmp_path, capsys):
    model = tmp_path / "model.ply"
    write_ply(random_model(10, dtype=torch.float32), model)
    (tmp_path / "checkpoint.pt").write_bytes(b"a run's checkpoint")
    (tmp_path / "notes.spz").write_bytes(b"the user's own")
    before = snapshot(tmp_path)
    for flags, fragment in ((["--format", "splat", "-o", str(tmp_path / "checkpoint.pt")],
                             "a .splat file's name ends in .splat"),
                            (["--format", "spz", "-o", str(tmp_path / "notes.spz")],
                             "exists; --overwrite replaces it")):
        assert main(["export", str(model), *flags]) == 2
        assert_clean_error(2, capsys.readouterr().err, fragment)
    assert snapshot(tmp_path) == before
    assert main(["export", str(model), "--format", "splat"]) == 0
    assert main(["export", str(model), "--format", "splat"]) == 2
    assert main(["export", str(model), "--format", "splat", "--overwrite"]) == 0


def test_nan_guard_keeps_the_last_good_checkpoint(tmp_path, cache):
    from splatscale.data.images import ImageStore
    from splatscale.demo import demo_scene
    from splatscale.errors import TrainingDiverged
    from splatscale.train.config import TrainConfig
    from splatscale.train.trainer import RunOptions, Trainer

    scene = demo_scene(Path(cache[1]))
    options = RunOptions(tmp_path, progress=False, checkpoint_every=0)
    trainer = Trainer(scene, ImageStore(scene, cache_dir=Path(cache[1])), TrainConfig(), options)
    for _ in range(3):
        trainer.train_step()
    trainer.save_checkpoint()
    good = (tmp_path / "checkpoint.pt").read_bytes()

    trainer.config.feature_lr = float("inf")  # colours become infinite, then the loss NaN
    with pytest.raises(TrainingDiverged, match=r"the loss of images 5..5 is (nan|inf); "
                                               r".*checkpoint.pt keeps the state after image 3"):
        for _ in range(3):
            trainer.train_step()
    with pytest.raises(TrainingDiverged, match="Gaussians have NaN or infinite parameters"):
        trainer.save_checkpoint()
    assert (tmp_path / "checkpoint.pt").read_bytes() == good


def test_ctrl_c_saves_a_checkpoint_that_resumes(tmp_path, cache):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "splatscale", "train", "-o", str(out), "--quiet", *cache,
               "--iterations", "100000", "--checkpoint-every", "0"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    wait_until((out / "metrics.jsonl").is_file, "the first log line: training under way",
               process)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=HANG_GUARD)
    assert process.returncode == 130, err
    assert "Traceback" not in err and "checkpoint.pt is saved, and splatscale train -o" in err
    saved = torch.load(out / "checkpoint.pt", weights_only=False)["trainer"]["images_seen"]
    assert saved >= 10
    assert train(out, cache, "--resume", "--iterations", str(saved + 4)) == 0
    assert json.loads((out / "report.json").read_text())["iterations"] == saved + 4


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="watches /proc/PID/maps")
def test_ctrl_c_during_start_up_is_quiet(tmp_path, cache):
    process = subprocess.Popen([sys.executable, "-m", "splatscale", "train", "-o",
                                str(tmp_path / "run"), "--quiet", *cache],
                               stderr=subprocess.PIPE, text=True)
    # The CLI's start-up: from the moment torch's libraries load (inside the CLI's
    # handlers) to the scene's set-up. Earlier, the interpreter itself is starting.
    maps = Path(f"/proc/{process.pid}/maps")
    wait_until(lambda: b"libtorch" in maps.read_bytes(), "torch loading", process, every=0.01)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=HANG_GUARD)
    assert process.returncode == 130 and "Traceback" not in err, err

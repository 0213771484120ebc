"""A model remembers its run: eval, render, export and view of a run's model read its
scene as the run did (scene, resolution, background, test views), and --resume alone
continues a run with all its settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from splatscale.cli import main
from splatscale.model.ply import read_ply, write_ply
from tests.conftest import data_path, random_model
from tests.test_bad_input import assert_clean_error
from tests.test_refused_runs import snapshot

SNOWMIKU = data_path("snowmiku")


@pytest.fixture(scope="module")
def snow_run(tmp_path_factory) -> tuple[Path, list[str]]:
    """A run on snowmiku, read at 1/8 of its size, with a white background and test
    views: every setting that is not the default."""
    base = tmp_path_factory.mktemp("snow")
    cache = ["--cache-dir", str(base / "cache")]
    assert main(["train", str(SNOWMIKU), "-o", str(base / "run"), "--resolution", "8",
                 "--white-background", "--eval", "--iterations", "6", "--quiet",
                 *cache]) == 0
    return base / "run", cache


def scores(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


def test_eval_of_a_runs_model_reads_its_scene_as_it_trained(snow_run, capsys):
    run, cache = snow_run
    reported = json.loads((run / "report.json").read_text())["test"]
    for model in (run, run / "point_cloud.ply"):
        assert main(["eval", str(model), *cache]) == 0
        assert scores(capsys)["psnr"] == pytest.approx(reported["psnr"], abs=1e-6)
    # Told otherwise, it does otherwise: another resolution scores otherwise.
    assert main(["eval", str(run), "--resolution", "4", *cache]) == 0
    assert scores(capsys)["psnr"] != pytest.approx(reported["psnr"], abs=1e-3)


def test_a_model_outside_a_run_needs_its_scene_named(snow_run, tmp_path, capsys):
    run, cache = snow_run
    lone = tmp_path / "model.ply"
    lone.write_bytes((run / "point_cloud.ply").read_bytes())
    assert main(["eval", str(lone), *cache]) == 2
    assert_clean_error(2, capsys.readouterr().err, str(lone), "--data")
    assert main(["eval", str(lone), "--data", str(SNOWMIKU), "--resolution", "8", *cache]) == 0
    assert scores(capsys)["psnr"] > 5


def test_a_run_without_test_views_says_so(tmp_path, capsys):
    cache = ["--cache-dir", str(tmp_path / "cache")]
    assert main(["train", "-o", str(tmp_path / "run"), "--iterations", "4", "--quiet",
                 *cache]) == 0
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run"), *cache]) == 2
    assert_clean_error(2, capsys.readouterr().err, "--split test", "without --eval",
                       "--split train")
    assert main(["eval", str(tmp_path / "run"), "--split", "train", *cache]) == 0


def test_render_and_export_take_a_run_folder(snow_run, tmp_path, capsys):
    run, cache = snow_run
    assert main(["render", str(run), "-o", str(tmp_path / "png"), *cache]) == 0
    written = sorted(p.name for p in (tmp_path / "png").iterdir())
    assert written == sorted(p.name for p in (run / "renders" / "test").iterdir()
                             if not p.name.endswith(".photo.png"))
    assert main(["export", str(run), "--format", "splat", "-o",
                 str(tmp_path / "model.splat")]) == 0
    assert (tmp_path / "model.splat").stat().st_size == 32 * len(read_ply(run / "point_cloud.ply"))


def test_a_bad_record_is_named_in_one_line(snow_run, tmp_path, capsys):
    run, cache = snow_run
    copy = tmp_path / "run"
    copy.mkdir()
    (copy / "point_cloud.ply").write_bytes((run / "point_cloud.ply").read_bytes())
    record = json.loads((run / "config.json").read_text())
    for field, value, fragment in (("resolution", 3, "resolution must be 1, 2, 4 or 8"),
                                   ("eval", "yes", "eval must be true or false"),
                                   ("data", str(tmp_path / "gone"), "is not there any more")):
        (copy / "config.json").write_text(json.dumps({**record, field: value}))
        assert main(["eval", str(copy), *cache]) == 2
        assert_clean_error(2, capsys.readouterr().err, "config.json", fragment)


def test_resume_alone_continues_with_the_runs_own_settings(snow_run, tmp_path, capsys):
    run, cache = snow_run
    copy = tmp_path / "run"
    copy.mkdir()
    for path in run.iterdir():
        if path.is_file():
            (copy / path.name).write_bytes(path.read_bytes())
    capsys.readouterr()
    assert main(["train", "-o", str(copy), "--resume", "--iterations", "8", "--quiet",
                 "--resolution", "2", *cache]) == 0
    err = capsys.readouterr().err
    assert "--resolution 2 ignored: the resumed run keeps --resolution 8" in err
    record = json.loads((copy / "config.json").read_text())
    assert record["data"] == str(SNOWMIKU.resolve()) and record["resolution"] == 8
    assert record["eval"] is True and record["white_background"] is True
    assert json.loads((copy / "report.json").read_text())["iterations"] == 8


def test_a_run_stopped_before_its_first_checkpoint(tmp_path, capsys):
    """What a kill -9 leaves before the first checkpoint: the record and the log."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"data": None}))
    (out / "metrics.jsonl").write_text("")
    before = snapshot(out)
    assert main(["train", "-o", str(out), "--resume", "--quiet"]) == 2
    assert_clean_error(2, capsys.readouterr().err, "stopped before its first checkpoint",
                       "--overwrite")
    assert main(["train", "-o", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert_clean_error(2, err, "stopped before its first checkpoint", "--overwrite")
    assert "--resume" not in err
    assert snapshot(out) == before


def test_view_reads_a_runs_record_through_the_same_checks(tmp_path, capsys):
    model = tmp_path / "run" / "point_cloud.ply"
    model.parent.mkdir()
    write_ply(random_model(5, dtype=torch.float32), model)
    (tmp_path / "run" / "config.json").write_text(json.dumps({"data": None, "max_width": 3}))
    assert main(["view", str(tmp_path / "run"), "--port", "1"]) == 2
    assert_clean_error(2, capsys.readouterr().err, "config.json",
                       "max_width must be null or an integer of at least 16")

"""The command line, end to end on the built-in scene."""

import json

from splatscale.cli import main
from splatscale.model.ply import read_ply


def test_train_render_eval_export(tmp_path, capsys):
    out = tmp_path / "run"
    cache = ["--cache-dir", str(tmp_path / "cache")]
    assert main(["train", "-o", str(out), "--eval", "--iterations", "40", "--batch-size", "2",
                 "--quiet", "--save-at", "20", *cache]) == 0
    report = json.loads((out / "report.json").read_text())
    for key in ("num_gaussians", "iterations", "images_per_second", "iterations_per_second",
                "wall_seconds", "peak_memory_bytes"):
        assert key in report, key
    assert report["iterations"] == 40 and report["steps"] == 20
    assert set(report["test"]) >= {"psnr", "ssim"}
    config = json.loads((out / "config.json").read_text())
    assert config["batch_size"] == 2 and config["eval"] is True
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["step"] == 10 and "test" in lines[-1]
    renders = sorted(p.name for p in (out / "renders" / "test").glob("*.png"))
    assert renders == [f"view_{i:03d}.png{kind}.png" for i in (0, 8, 16, 24)  # every 8th
                       for kind in (".photo", "")]
    assert len(read_ply(out / "point_cloud.ply")) == report["num_gaussians"]
    assert (out / "point_cloud_20.ply").is_file() and (out / "checkpoint.pt").is_file()

    assert main(["train", "-o", str(out), "--eval", "--iterations", "60", "--batch-size", "2",
                 "--quiet", "--resume", *cache]) == 0
    assert json.loads((out / "report.json").read_text())["iterations"] == 60

    capsys.readouterr()
    assert main(["eval", str(out / "point_cloud.ply"), *cache]) == 0
    scores = json.loads(capsys.readouterr().out)  # stdout holds the result alone
    assert scores["psnr"] > 10
    assert main(["render", str(out / "point_cloud.ply"), "-o", str(tmp_path / "png"), *cache]) == 0
    assert len(list((tmp_path / "png").glob("*.png"))) == 4
    assert main(["export", str(out / "point_cloud.ply"), "--format", "splat"]) == 0
    assert (out / "point_cloud.splat").stat().st_size == 32 * report_gaussians(out)


def report_gaussians(out):
    return json.loads((out / "report.json").read_text())["num_gaussians"]


def test_the_cli_offers_every_registered_strategy_and_its_flags():
    """The CLI declares --strategy's choices and the strategies' flags itself (it loads
    no torch): they must name the registry's strategies and their settings."""
    from dataclasses import fields

    from splatscale.cli import build_parser
    from splatscale.strategy import STRATEGIES

    train = build_parser().parse_args(["train", "-o", "out"])
    choices = next(action.choices for action in _train_actions() if action.dest == "strategy")
    assert tuple(choices) == tuple(STRATEGIES)
    settings = {f.name for strategy in STRATEGIES.values() for f in fields(strategy.settings)}
    flagged = {name for name in vars(train) if name in settings}
    assert "absgrad" in flagged, flagged


def _train_actions():
    from splatscale.cli import build_parser

    subparsers = next(a for a in build_parser()._actions if a.dest == "command")
    return subparsers.choices["train"]._actions

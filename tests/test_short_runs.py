"""A short run that is finished: --schedule-scale scales every schedule (its
milestones land where the original's do, scaled), --max-pixels caps the images, and
a run shorter than its schedule says so."""

from __future__ import annotations

import json
import math

import pytest

from splatscale.cli import main
from splatscale.data.images import ImageStore
from splatscale.demo import demo_scene
from splatscale.train.config import TrainConfig
from splatscale.strategy import default, make_strategy
from splatscale.step.schedule import position_lr


class RecordingEngine:
    """What a strategy asks of an engine, by the image it asked at: its edits run
    with the operations of ``default`` recorded in place of made (``milestones``)."""

    def __init__(self) -> None:
        self.densified: list[int] = []
        self.resets: list[int] = []
        self.at = 0

    def edit_rows(self, edit):
        return edit(None, lambda count: count)

    def densify_and_prune(self, *args, **kwargs) -> dict:
        self.densified.append(self.at)
        return {}

    def reset_opacity(self, rows) -> dict:
        self.resets.append(self.at)
        return {}


def milestones(config: TrainConfig) -> tuple[list[int], list[int]]:
    """The images after which a 3DGS run densifies, and those it resets opacity at."""
    strategy, engine = make_strategy(config, extent=1.0), RecordingEngine()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(default, "densify_and_prune", engine.densify_and_prune)
        patch.setattr(default, "reset_opacity", engine.reset_opacity)
        for image in range(config.iterations):
            engine.at = image + 1
            strategy.before_adam(engine, image, image + 1)
    return engine.densified, engine.resets


def test_a_scaled_schedule_has_the_originals_milestones_scaled():
    original, scaled = TrainConfig(), TrainConfig().scaled(0.1)
    assert scaled.iterations == 3_000 and scaled.schedule_scale == 0.1
    densified, resets = milestones(original)
    densified_scaled, resets_scaled = milestones(scaled)
    assert [i // 10 for i in densified] == densified_scaled  # 600..14,900 -> 60..1,490
    assert [i // 10 for i in resets] == resets_scaled        # every 3,000 -> every 300
    assert densified_scaled[0] == 60 and densified_scaled[-1] == 1_490
    # The learning rate of the means decays to its final value at the run's end.
    assert position_lr(scaled.iterations, 1.0, 0.01,
                       scaled.position_lr_max_steps) == pytest.approx(0.01)
    assert position_lr(1_500, 1.0, 0.01, scaled.position_lr_max_steps) == pytest.approx(0.1)
    assert scaled.sh_degree_interval == 100
    mcmc = TrainConfig(strategy="mcmc").scaled(0.1)
    assert mcmc.refine_until() == 2_500


def test_flags_given_beside_the_scale_hold_as_given(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "-o", str(out), "--schedule-scale", "0.001", "--iterations", "40",
                 "--densify-until", "20", "--quiet",
                 "--cache-dir", str(tmp_path / "cache")]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["schedule_scale"] == 0.001 and config["iterations"] == 40
    assert config["densify_until"] == 20 and config["densify_interval"] == 1
    assert "inside the 3DGS schedule" not in capsys.readouterr().err


def test_a_run_shorter_than_its_schedule_says_how_to_fit_it(tmp_path, capsys):
    assert main(["train", "-o", str(tmp_path / "run"), "--iterations", "20", "--quiet",
                 "--cache-dir", str(tmp_path / "cache")]) == 0
    err = capsys.readouterr().err
    assert "inside the 3DGS schedule of 30,000" in err
    assert "--schedule-scale 0.000667 fits the whole schedule" in err


def test_max_pixels_caps_every_image_keeping_its_aspect(tmp_path):
    scene = demo_scene(tmp_path / "cache")
    full = scene.views[0].camera
    store = ImageStore(scene, cache_dir=tmp_path / "cache",
                       max_pixels=full.width * full.height // 9)
    camera = store.camera(0)
    assert (camera.width, camera.height) == (round(full.width / 3), round(full.height / 3))
    assert camera.K[0, 0] == pytest.approx(full.K[0, 0] * camera.width / full.width)
    assert math.isclose(camera.width / camera.height, full.width / full.height, rel_tol=0.02)
    assert tuple(store.image(0).shape) == (camera.height, camera.width, 3)


def test_a_pixel_count_is_read_in_thousands_and_millions(tmp_path, capsys):
    from splatscale.cli import _pixel_count

    assert _pixel_count("500K") == 500_000 and _pixel_count("1.5M") == 1_500_000
    assert _pixel_count("2000") == 2000
    with pytest.raises(SystemExit):
        main(["train", "-o", str(tmp_path / "run"), "--max-pixels", "lots"])
    assert "--max-pixels: not a pixel count: 'lots'" in capsys.readouterr().err

"""A video of a model without the viewer: an orbit about what its capture looked at,
written as H.264 MP4 that decodes back to the renders."""

from __future__ import annotations

import math

import numpy as np
import pytest

from splatscale.data.camera_path import orbit
from splatscale.data.video import write_mp4
from tests.conftest import look_at_camera

PIVOT = np.array([0.5, -0.2, 1.0])
UP = np.array([0.0, 0.0, 1.0])


def test_an_orbit_circles_the_pivot_at_the_starts_height_and_distance():
    start = look_at_camera(PIVOT + [3.0, 0.0, 1.0], PIVOT, 64, 48, focal=60.0)
    path = orbit(start, PIVOT, UP, frames=8)
    assert len(path) == 8
    for k, camera in enumerate(path):
        centre = camera.center.numpy()
        offset = centre - PIVOT
        assert offset @ UP == pytest.approx(1.0)
        assert np.linalg.norm(offset - (offset @ UP) * UP) == pytest.approx(3.0)
        forward = camera.viewmat[2, :3].numpy()  # OpenCV z: where it looks
        assert forward == pytest.approx(-offset / np.linalg.norm(offset))
        up_in_view = -camera.viewmat[1, :3].numpy()  # upright: no roll
        assert up_in_view @ np.cross(forward, UP) == pytest.approx(0.0, abs=1e-12)
        assert up_in_view @ UP > 0
        angle = math.atan2(offset[1], offset[0])
        assert angle == pytest.approx(math.atan2(math.sin(k * math.pi / 4),
                                                 math.cos(k * math.pi / 4)), abs=1e-9)
    assert path[0].center.numpy() == pytest.approx(start.center.numpy(), abs=1e-12)
    assert all(c.width == 64 and c.height == 48 and c.K.equal(start.K) for c in path)


def test_a_start_on_the_axis_is_refused():
    start = look_at_camera(PIVOT + [0.0, 0.0, 2.0], PIVOT + [1, 0, 0], 64, 48, focal=60.0)
    with pytest.raises(ValueError, match="on its axis"):
        orbit(start, PIVOT, UP, frames=4)


def test_an_mp4_decodes_back_to_its_frames(tmp_path):
    import av

    rng = np.random.default_rng(0)
    frames = [np.repeat(np.repeat(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8), 8, 0), 8, 1)
              for _ in range(12)]
    assert write_mp4(iter(frames), tmp_path / "v.mp4", fps=24) == 12
    with av.open(str(tmp_path / "v.mp4")) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264" and stream.average_rate == 24
        decoded = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
    assert len(decoded) == 12
    for got, sent in zip(decoded, frames):
        assert got.shape == sent.shape
        assert np.abs(got.astype(int) - sent).mean() < 6  # lossy, visually lossless


def test_render_orbit_writes_a_video_of_the_model_turning(tmp_path, capsys):
    import av

    from splatscale.cli import main

    cache = ["--cache-dir", str(tmp_path / "cache")]
    run = tmp_path / "run"
    assert main(["train", "-o", str(run), "--iterations", "100", "--schedule-scale", "1",
                 "--quiet", *cache]) == 0
    capsys.readouterr()
    assert main(["render", str(run), "--orbit", "--frames", "6", "--fps", "12", *cache]) == 0
    video = run / "renders" / "orbit" / "orbit.mp4"
    assert capsys.readouterr().out.strip() == f"6 frames in {video}"
    with av.open(str(video)) as container:
        frames = [f.to_ndarray(format="rgb24").astype(float)
                  for f in container.decode(container.streams.video[0])]
    assert len(frames) == 6 and frames[0].shape == (96, 128, 3)  # the demo's views, even
    assert all(frame.std() > 10 for frame in frames), "the model is in view, not blank"
    assert np.abs(frames[0] - frames[3]).mean() > 5, "half a turn later it looks otherwise"
    assert main(["render", str(run), "--orbit", "--split", "test", *cache]) == 2
    assert "--split test: not with --orbit" in capsys.readouterr().err


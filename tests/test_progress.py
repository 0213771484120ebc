"""What a run tells its user: an estimate of the time left that follows the model's
growth, a summary in words at the end, a word before the kernels compile, and the
train command's help in groups."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from splatscale.cli import build_parser, main
from splatscale.train.progress import TimeLeft, duration_text
from splatscale.train.summary import summary
from tests.conftest import HANG_GUARD, data_path
from tests.test_fisheye_commands import fisheye_colmap_scene

TOTAL, DENSIFY_FROM, GROWTH_ENDS = 30_000, 500, 15_000


def gaussians_at(image: int) -> float:
    """A model that grows tenfold, steadily, while it densifies."""
    growth = min(max(image - DENSIFY_FROM, 0), GROWTH_ENDS - DENSIFY_FROM)
    return 100_000 + 900_000 * growth / (GROWTH_ENDS - DENSIFY_FROM)


def seconds_per_image(gaussians: float) -> float:
    return 0.02 + 2e-7 * gaussians  # fixed per pixel, then per Gaussian


def true_time_left(now: int) -> float:
    return sum(seconds_per_image(gaussians_at(i)) for i in range(now, TOTAL))


@pytest.mark.parametrize("now", [2_000, 7_000, 12_000, 20_000])
def test_the_time_left_follows_a_growing_model(now):
    estimate, elapsed = TimeLeft(TOTAL, (DENSIFY_FROM, GROWTH_ENDS)), 0.0
    for image in range(0, now, 10):
        seconds = sum(seconds_per_image(gaussians_at(i)) for i in range(image, image + 10))
        estimate.step(image + 10, seconds, int(gaussians_at(image)),
                      int(gaussians_at(image + 10)))
        elapsed += seconds
    truth = true_time_left(now)
    assert estimate.seconds() == pytest.approx(truth, rel=0.1)
    # A constant rate (what a plain bar assumes) is far off while the model grows.
    if now < GROWTH_ENDS:
        assert elapsed / now * (TOTAL - now) < 0.7 * truth


def test_durations_read_as_a_person_says_them():
    assert [duration_text(s) for s in (3.2, 89, 600, 7_300)] == [
        "3 s", "89 s", "10 min", "2 h 02 min"]


def test_the_summary_says_what_was_trained_how_well_where_and_what_next(tmp_path):
    report = {"iterations": 30_000, "wall_seconds": 1_176.0, "images_per_second": 25.5,
              "num_gaussians": 1_234_567, "test": {"psnr": 27.314, "ssim": 0.8712},
              "test_views": 9}
    lines = summary(report, tmp_path / "run")
    assert lines[0] == "trained on 30,000 images in 20 min (25.5 images/s): 1,234,567 Gaussians"
    assert lines[1] == ("on its 9 test views, held out of training: PSNR 27.31 dB, "
                        "SSIM 0.871")
    assert f"splatscale view {tmp_path / 'run'}" in "\n".join(lines)
    assert f"splatscale export {tmp_path / 'run'} --format spz" in "\n".join(lines)
    assert "without --eval" in lines[-1]
    untested = summary({**report, "test": None}, tmp_path)
    assert not any(line.startswith("on its") or "--eval" in line for line in untested)


def test_a_finished_run_says_its_summary_in_words(tmp_path, capsys):
    assert main(["train", "-o", str(tmp_path / "run"), "--iterations", "20", "--eval",
                 "--quiet", "--cache-dir", str(tmp_path / "cache")]) == 0
    err = capsys.readouterr().err
    assert "--eval holds 4 of the 32 views out of training" in err
    assert "splatscale: trained on 20 images in" in err
    assert "on its 4 test views, held out of training: PSNR" in err
    assert "LPIPS skipped" not in err and "Error" not in err


def test_a_cold_kernel_cache_is_told_apart_from_a_warm_one(tmp_path):
    """Cold: an empty cache folder. Warm: once a step's forward and backward pass (the
    render and the loss) has run in this process, numba has cached the largest kernels
    for their present source."""
    check = "from splatscale.backends.cpu_compile import kernels_cached; print(kernels_cached())"
    cold = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                          env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)},
                          timeout=HANG_GUARD)
    assert cold.stdout.strip() == "False", cold.stderr
    from splatscale.backends.cpu_compile import kernels_cached
    from splatscale.render import render
    from splatscale.step.ssim import ssim
    from tests.conftest import look_at_camera, random_model

    model = random_model(20, dtype=torch.float32).requires_grad_(True)
    camera = look_at_camera([0, 0, 4], [0, 0, 0], 32, 24, focal=30.0, dtype=torch.float32)
    rgb = render(model, camera).rgb
    (1 - ssim(rgb, torch.zeros_like(rgb))).backward()
    assert kernels_cached()


COMPILED_BY_A_RUN = """
import sys
from numba.core.dispatcher import Dispatcher
from splatscale.backends import cpu_compile
from splatscale.cli import main

def compiled():
    return {(name, attr, sig) for name, module in list(sys.modules.items())
            if name.startswith("splatscale") for attr, value in vars(module).items()
            if isinstance(value, Dispatcher) for sig in value.signatures}

for part in cpu_compile.PARTS.values():
    part()
before = compiled()
main(["train", sys.argv[2], "--iterations", "3", "--resolution", "8", "--quiet",
      "--output", sys.argv[1]])
print(sorted(compiled() - before))
"""


def test_the_compile_parts_compile_what_a_training_step_calls(tmp_path):
    """A first run compiles its kernels in three processes: what they compile is every
    specialisation a default training step calls, so the run itself compiles none."""
    done = subprocess.run([sys.executable, "-c", COMPILED_BY_A_RUN, str(tmp_path / "run"),
                           str(data_path("snowmiku"))],
                          capture_output=True, text=True, timeout=HANG_GUARD)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


FILL_A_COLD_CACHE = """
import numpy as np
from splatscale.backends import cpu_compile
from splatscale.render import compositing_kernels as kernels

print(cpu_compile.kernels_cached())
# The compositing forward of an empty tile, with a depth output.
f32, image = np.float32, (16, 16)
kernels.forward(np.zeros((0, kernels.PACKED_WIDTH), f32), np.zeros(3, f32),
                np.zeros(2, np.int64), np.zeros(1, np.int64), 1, 0, 16, 0, 16,
                np.zeros((*image, 3), f32), np.zeros(image, f32), np.zeros(image, f32),
                np.zeros(image, np.int32), np.zeros(0, np.uint8))
print(cpu_compile.kernels_cached((kernels.forward,)))
with cpu_compile.compiling() as first_compile:
    print(first_compile())
print(cpu_compile.kernels_cached())
"""


def test_a_cold_cache_is_filled_by_every_process(tmp_path):
    """A compile on an empty cache: every child's part (the projection backward, SH,
    SSIM and compositing among the kernels checked) reaches the cache, and none
    failed. Compositing cached with depth first (a render that asks for it) is not a
    run's, which composites none: it would compile its own, and round otherwise."""
    done = subprocess.run([sys.executable, "-c", FILL_A_COLD_CACHE], capture_output=True,
                          text=True, env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)},
                          timeout=HANG_GUARD)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "[]", "True"]


def test_a_part_whose_process_fails_is_said():
    """A part whose process fails apart is among those the compile returns (a run
    then compiles them itself), once its helper is done; no part, no process, done
    at once."""
    from splatscale.backends.cpu_compile import compiling

    with compiling(["unknown"]) as compile_:
        assert compile_() == ["unknown"]
        assert compile_.done()
    with compiling([]) as compile_:
        assert compile_.done()
        assert compile_() == []


def test_parts_started_afresh_where_the_helper_does_not_fork():
    """Off Linux the helper starts each part as a process of its own, and says which
    failed as the forked ones do."""
    script = ("import sys\nfrom splatscale.backends.cpu_compile import _compile_apart\n"
              "sys.platform = 'darwin'\n_compile_apart(['unknown'])")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=HANG_GUARD)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["unknown"]


HELPER_KILLED = """
import os, signal, time
from splatscale.backends.cpu_compile import compiling

def children(pid):
    found = []
    for proc in os.listdir("/proc"):
        try:
            with open(f"/proc/{proc}/stat") as stat:
                if int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(proc))
        except (OSError, ValueError):
            pass
    return found

with compiling(["loss"]) as loss:
    helper, = children(os.getpid())
    while not children(helper):  # the helper has imported and forked its part
        time.sleep(0.05)
    part, = children(helper)
    os.kill(helper, signal.SIGKILL)
    print(loss())
while os.path.exists(f"/proc/{part}") and open(f"/proc/{part}/stat").read().split()[2] != "Z":
    time.sleep(0.05)
print("part ended")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks on Linux alone")
def test_a_helper_killed_takes_its_parts_with_it(tmp_path):
    """The helper killed outright (as by the kernel, out of memory): its forked part
    ends with it, before it compiles SSIM, and the compile says that part failed (the
    run compiles it itself)."""
    done = subprocess.run([sys.executable, "-c", HELPER_KILLED], capture_output=True,
                          text=True, env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)},
                          timeout=HANG_GUARD)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["['loss']", "part ended"]
    assert not list(tmp_path.rglob("*_ssim_value_and_grad*"))


# One process compiles as a rank does (the machine's first), so the default run keeps
# the ranks alone: each case is a whole cold compile.
@pytest.mark.parametrize("flags", [pytest.param([], marks=pytest.mark.slow), ["--nproc", "2"],
                                   pytest.param(["--nproc", "2", "--absgrad"],
                                                marks=pytest.mark.slow)])
def test_a_first_run_trains_the_model_later_runs_train(tmp_path, flags):
    """The run that compiles the kernels (an empty cache) and a run that finds them
    cached write the same model, byte for byte, in one process and in ranks (with
    AbsGS's kernel compiled apart, too): a kernel compiled in the process that ran
    it rounded otherwise than the same kernel loaded from the cache."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    for run in ("first", "later"):
        done = subprocess.run(
            [sys.executable, "-m", "splatscale", "train", str(data_path("snowmiku")),
             "--iterations", "2", "--resolution", "8", "--quiet", *flags,
             "--cache-dir", str(tmp_path / "images"), "--output", str(tmp_path / run)],
            capture_output=True, text=True, env=env, timeout=HANG_GUARD)
        assert done.returncode == 0, done.stderr
    first, later = ((tmp_path / run / "point_cloud.ply").read_bytes()
                    for run in ("first", "later"))
    assert first == later


VARIANT_RUN = """
import sys
from splatscale.cli import main
from splatscale.render import compositing_kernels, projection_kernels

flags = {"absgrad": ["--absgrad", "--resolution", "8"], "fisheye": []}[sys.argv[4]]
code = main(["train", sys.argv[2], "--iterations", "2", "--quiet", *flags, "--cache-dir",
             sys.argv[3], "--output", sys.argv[1]])
kernel = {"absgrad": compositing_kernels.backward_with_absgrad,
          "fisheye": projection_kernels.project_backward}[sys.argv[4]]
print(sum(kernel.stats.cache_hits.values()), sum(kernel.stats.cache_misses.values()))
sys.exit(code)
"""


@pytest.mark.slow  # a whole first compile
@pytest.mark.parametrize("variant", ["absgrad", "fisheye"])
def test_a_first_run_loads_the_kernels_its_settings_want_from_the_cache(tmp_path, variant):
    """What only some runs call (AbsGS's backward, the fisheye projection) is compiled
    apart, once the run's settings and cameras want it: on an empty cache the run
    still loads it from the cache (compiled in a child), as every later run does, and
    compiles none of it itself."""
    scene = (fisheye_colmap_scene(tmp_path / "scene") if variant == "fisheye"
             else data_path("snowmiku"))
    done = subprocess.run(
        [sys.executable, "-c", VARIANT_RUN, str(tmp_path / "run"), str(scene),
         str(tmp_path / "images"), variant],
        capture_output=True, text=True, timeout=HANG_GUARD,
        env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr
    hits, misses = map(int, done.stdout.split()[-2:])
    assert hits >= 1 and misses == 0


def compiling_with_cache(cache) -> list[int]:
    """The processes compiling into numba cache folder ``cache``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:  # not a process, or one that has ended
            continue
        # splatscale's processes cache in a folder of its own inside (``kernel_cache``)
        given = f"NUMBA_CACHE_DIR={cache}".encode()
        if any(entry == given or entry.startswith(given + b"/") for entry in environ):
            found.append(int(proc.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux's /proc")
def test_a_first_run_refused_as_it_prepares_ends_the_compile_it_began(tmp_path):
    """A first run begins compiling as it prepares; refused there (a folder without a
    COLMAP model), it says one line, exits 2 and leaves no process compiling."""
    empty, cache = tmp_path / "photos", tmp_path / "cache"
    empty.mkdir()
    done = subprocess.run([sys.executable, "-m", "splatscale", "train", str(empty), "-o",
                           str(tmp_path / "run")], capture_output=True, text=True,
                          env={**os.environ, "NUMBA_CACHE_DIR": str(cache)},
                          timeout=HANG_GUARD)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "no COLMAP model" in done.stderr
    assert compiling_with_cache(cache) == []
    assert not (tmp_path / "run").exists()


def test_train_help_comes_in_groups_and_says_every_default():
    train = build_parser()._subparsers._group_actions[0].choices["train"]
    titles = [group.title for group in train._action_groups]
    assert titles[2:5] == ["the run", "schedule and strategy", "the scene's images"]
    assert any(t.startswith("distributed") for t in titles)
    assert any(t.startswith("offloaded") for t in titles)
    for action in train._actions:
        takes_value = action.option_strings and action.nargs != 0
        if takes_value and not isinstance(action, argparse._HelpAction):
            assert "default" in action.help or action.required, action.option_strings

"""The viewer in a real browser: Debian's chromium, headless, driven by Playwright.

Skipped where chromium or Playwright is missing, unless SPLATSCALE_BROWSER_TESTS is
"required" (as CI sets it). Screenshots go to SPLATSCALE_TEST_ARTIFACTS (default:
the test's temporary folder).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

import viser.transforms as vtf

from splatscale.cli import main
from splatscale.data.images import ImageStore
from splatscale.demo import demo_scene
from splatscale.viewer.page import FRUSTUM_SIZE, Scenery
from splatscale.viewer.poses import overview, pose_of
from tests.conftest import HANG_GUARD, wait_until

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
REQUIRED = os.environ.get("SPLATSCALE_BROWSER_TESTS") == "required"
# Headless chromium draws WebGL in software.
CHROMIUM_ARGS = ["--use-angle=swiftshader", "--enable-unsafe-swiftshader", "--ignore-gpu-blocklist"]
VIEWPORT = {"width": 1280, "height": 800}
PANEL_LEFT = 860  # pixels: the control panel covers the canvas to the right of this
PAGE_HANG_GUARD = HANG_GUARD * 1000  # milliseconds, as Playwright counts


def playwright_or_skip():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    missing = ("chromium" if CHROMIUM is None else None) or \
              ("Playwright" if sync_playwright is None else None)
    if missing:
        if REQUIRED:
            pytest.fail(f"{missing} is missing and SPLATSCALE_BROWSER_TESTS=required")
        pytest.skip(f"{missing} is not installed")
    return sync_playwright


@pytest.fixture
def browser_page():
    sync_playwright = playwright_or_skip()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS,
                                             timeout=PAGE_HANG_GUARD)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.set_default_timeout(PAGE_HANG_GUARD)  # every wait, click and load
            yield page
        finally:
            browser.close()


@pytest.fixture
def artifacts(tmp_path) -> Path:
    folder = Path(os.environ.get("SPLATSCALE_TEST_ARTIFACTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def splatscale(*args: str, ready: str):
    """``splatscale ARGS`` as a process, once it has said ``ready`` on stderr; stopped
    (Ctrl-C) at the end if it has not exited."""
    process = subprocess.Popen([sys.executable, "-m", "splatscale", *args],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    said = []
    try:
        for line in process.stderr:
            said.append(line)
            if ready in line:
                break
        else:
            pytest.fail(f"splatscale {' '.join(args)} ended before saying {ready!r}: {said}")
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(2)
            process.wait(timeout=HANG_GUARD)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("viewer")
    cache = folder / "cache"
    out = folder / "run"
    assert main(["train", "-o", str(out), "--iterations", "150", "--eval", "--quiet",
                 "--cache-dir", str(cache)]) == 0
    return out, cache


def below_centre(page) -> np.ndarray:
    """The canvas's pixels just below its centre, where the first view shows the demo's
    model (its centre holds the first camera's frustum)."""
    from io import BytesIO

    from PIL import Image

    shot = np.asarray(Image.open(BytesIO(page.screenshot())).convert("RGB"), dtype=float)
    x, y = VIEWPORT["width"] // 2, VIEWPORT["height"] * 5 // 8
    return shot[y - 20:y + 20, x - 20:x + 20]


def drawn(pixels: np.ndarray) -> bool:
    """Whether ``pixels`` of the canvas show something other than its white."""
    return np.abs(pixels.mean(axis=(0, 1)) - 255).max() > 10


def on_screen(point: np.ndarray, pose, viewport: dict) -> tuple[np.ndarray, float]:
    """Where the browser draws world ``point`` when its camera has ``pose`` (viser:
    vertical field of view, principal point centred), and its depth."""
    local = vtf.SO3(pose.wxyz).inverse().apply(point - pose.position)
    focal = viewport["height"] / (2 * np.tan(pose.fov / 2))
    centre = np.array([viewport["width"], viewport["height"]]) / 2
    return centre + focal * local[:2] / local[2], local[2]


def image_plane_centre(pose, size: float) -> np.ndarray:
    """The centre of the photo viser draws in a frustum of ``size`` (its client's rule:
    the frustum's volume is kept for any field of view)."""
    half_height = np.tan(pose.fov / 2)
    depth = size / np.cbrt(half_height * half_height * pose.aspect / 3)
    return pose.position + depth * vtf.SO3(pose.wxyz).apply(np.array([0.0, 0.0, 1.0]))


def camera_to_click(scenery: Scenery, viewport: dict) -> tuple[str, np.ndarray]:
    """The training camera whose photo is nearest the browser's first view, well inside
    the canvas: its name and where to click."""
    first = overview(pose_of(scenery.store.camera(scenery.train_ids[0])), scenery.extent)
    size = FRUSTUM_SIZE * scenery.extent
    spots = []
    for index in scenery.train_ids:
        camera_pose = pose_of(scenery.store.camera(index))
        spot, depth = on_screen(image_plane_centre(camera_pose, size), first, viewport)
        inside = 60 < spot[0] < PANEL_LEFT - 60 and 60 < spot[1] < viewport["height"] - 60
        if depth > 0 and inside:
            spots.append((depth, scenery.store.camera(index).name, spot))
    assert spots, "no training camera in the browser's first view"
    _, name, spot = min(spots, key=lambda s: s[0])
    return name, spot


def test_view_shows_the_model_and_compares_a_camera(demo_run, browser_page, artifacts):
    out, cache = demo_run
    port = free_port()
    with splatscale("view", str(out), "--port", str(port), "--cache-dir", str(cache),
                    ready="viewing"):
        page = browser_page
        elsewhere = []
        page.on("request", lambda request: elsewhere.append(request.url)
                if not request.url.startswith((f"http://127.0.0.1:{port}/", "data:", "blob:"))
                else None)
        page.goto(f"http://127.0.0.1:{port}")
        page.get_by_text("Click a camera").wait_for()
        wait_until(lambda: drawn(below_centre(page)), "the splats drawn on the canvas")
        page.screenshot(path=artifacts / "viewer-view.png")

        scene = demo_scene(cache)
        train_ids, test_ids = scene.split(True)
        name, spot = camera_to_click(Scenery(ImageStore(scene), train_ids, test_ids), VIEWPORT)
        page.mouse.click(*spot)
        page.get_by_text(name).wait_for()
        text = page.inner_text("body")
        assert "training view" in text and "photo" in text and "exact render" in text
        assert re.search(r"PSNR\s+\d+\.\d\d dB", text)
        page.screenshot(path=artifacts / "viewer-camera.png")

        page.get_by_role("button", name="Render this view (exact)").click()
        page.get_by_text("exact render, ").wait_for()
    assert not elsewhere, f"the page loaded from elsewhere: {elsewhere}"


def progress(page) -> tuple[int, int, str]:
    text = page.inner_text("body")
    images = re.search(r"images\s+([\d,]+)\s*/\s*([\d,]+)", text)
    state = re.search(r"state\s+(\w+)", text)
    if not images or not state:
        return 0, 0, ""
    return int(images[1].replace(",", "")), int(images[2].replace(",", "")), state[1]


def test_train_with_the_viewer_pauses_resumes_and_ends_as_without(tmp_path, browser_page,
                                                                   artifacts):
    cache = ["--cache-dir", str(tmp_path / "cache")]
    iterations = ["--iterations", "1500", "--quiet"]
    watched, alone = tmp_path / "watched", tmp_path / "alone"
    port = free_port()
    with splatscale("train", "-o", str(watched), *iterations, *cache, "--viewer",
                    "--port", str(port), ready="watch and steer") as run:
        page = browser_page
        page.goto(f"http://127.0.0.1:{port}")
        first = wait_until(lambda: progress(page)[0], "the images counter")
        wait_until(lambda: progress(page)[0] > first, "the counter to advance")

        page.get_by_role("button", name="Pause").click()
        wait_until(lambda: progress(page)[2] == "paused", "the run to pause")
        held_at = progress(page)[0]
        assert held_at < 1500, "the run ended before it could be paused"
        page.get_by_role("button", name="Checkpoint now").click()
        page.get_by_text(f"checkpoint saved after image {held_at:,}").wait_for()
        time.sleep(4)
        assert progress(page)[0] == held_at and run.poll() is None
        page.screenshot(path=artifacts / "viewer-train-paused.png")

        page.get_by_role("button", name="Resume").click()
        wait_until(lambda: progress(page)[0] > held_at, "the run to resume")
        # The page closed, the run goes on (and no longer shares the cores with a
        # browser drawing in software).
        page.goto("about:blank")
        assert run.wait(timeout=HANG_GUARD) == 0
    # A process of its own, as the watched run: an earlier test in this one may have
    # changed its thread count, and with it how sums over threads round.
    subprocess.run([sys.executable, "-m", "splatscale", "train", "-o", str(alone), *iterations,
                    *cache], check=True, capture_output=True)
    assert (watched / "point_cloud.ply").read_bytes() == (alone / "point_cloud.ply").read_bytes()

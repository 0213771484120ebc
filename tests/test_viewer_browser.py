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
from io import BytesIO
from pathlib import Path

import numpy as np
import pytest
import torch
import viser.transforms as vtf

from splatscale.cli import main
from splatscale.data.images import ImageStore
from splatscale.demo import demo_scene
from splatscale.model.ply import read_ply
from splatscale.render import render
from splatscale.viewer.page import TRAIN_COLOR, Scenery
from splatscale.viewer.poses import Pose, camera_at, pose_of
from tests.conftest import HANG_GUARD, wait_until
from tests.test_viewer_framing import view_rotation

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
REQUIRED = os.environ.get("SPLATSCALE_BROWSER_TESTS") == "required"
# Headless chromium draws WebGL in software.
CHROMIUM_ARGS = ["--use-angle=swiftshader", "--enable-unsafe-swiftshader", "--ignore-gpu-blocklist"]
VIEWPORT = {"width": 1280, "height": 800}
PANEL_LEFT = 860  # pixels: the control panel covers the canvas to the right of this
CENTRE = 60  # pixels: the half width of the square at the canvas's centre that is checked
ALIKE = 12   # levels of 255: the most the browser's splats differ from our render, on average
OVERVIEW_FOV = np.radians(60.0)
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


def screenshot(page) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(BytesIO(page.screenshot())).convert("RGB"), dtype=float)


def settled(page) -> np.ndarray:
    """A screenshot of the page once it has stopped changing (two in a row the same):
    what it shows as it loads, or between two frames, counts for nothing."""
    shots = [screenshot(page)]

    def still() -> bool:
        shots[:] = [shots[-1], screenshot(page)]
        return np.array_equal(*shots)

    wait_until(still, "the page still")
    return shots[-1]


def centre(image: np.ndarray) -> np.ndarray:
    """The canvas's pixels around its centre, where the view's pivot is drawn."""
    x, y = VIEWPORT["width"] // 2, VIEWPORT["height"] // 2
    return image[y - CENTRE:y + CENTRE, x - CENTRE:x + CENTRE]


def drawn(pixels: np.ndarray) -> bool:
    """Whether ``pixels`` of the canvas show something other than its white."""
    return np.abs(pixels.mean(axis=(0, 1)) - 255).max() > 10


def alike(shown: np.ndarray, expected: np.ndarray) -> bool:
    """Whether the browser's splats look like our exact render: it draws them with
    their degree-0 colours and its own sorting, within a few levels on average (a
    frustum, the background or another view is tens of levels away)."""
    return np.abs(shown - expected).mean() < ALIKE


def view_pose(position: np.ndarray, look_at: np.ndarray, up: np.ndarray, fov: float) -> Pose:
    """The browser's view from ``position`` towards ``look_at`` with ``up`` up."""
    rotation = view_rotation(position, look_at, up)
    return Pose(vtf.SO3.from_matrix(rotation).wxyz, position, fov,
                VIEWPORT["width"] / VIEWPORT["height"])


def exact_view(out: Path, scenery: Scenery, pose: Pose) -> np.ndarray:
    """Our render of the run's model as the browser's canvas shows it from ``pose``."""
    model = read_ply(out / "point_cloud.ply")
    camera = camera_at(pose, VIEWPORT["height"])
    background = torch.tensor(scenery.store.background, dtype=model.means.dtype)
    with torch.no_grad():
        rgb = render(model, camera, background=background).rgb.clamp(0, 1)
    return (rgb * 255).round().numpy()


def on_screen(point: np.ndarray, pose, viewport: dict) -> tuple[np.ndarray, float]:
    """Where the browser draws world ``point`` when its camera has ``pose`` (viser:
    vertical field of view, principal point centred), and its depth."""
    local = vtf.SO3(pose.wxyz).inverse().apply(point - pose.position)
    focal = viewport["height"] / (2 * np.tan(pose.fov / 2))
    centre = np.array([viewport["width"], viewport["height"]]) / 2
    return centre + focal * local[:2] / local[2], local[2]


def photo_corners(camera_pose: Pose, depth: float) -> np.ndarray:
    """The corners of the photo a frustum holds, ``depth`` in front of its camera."""
    half_height = depth * np.tan(camera_pose.fov / 2)
    half_width = half_height * camera_pose.aspect
    local = np.array([[x * half_width, y * half_height, depth]
                      for x in (-1, 1) for y in (-1, 1)])
    return vtf.SO3(camera_pose.wxyz).apply(local) + camera_pose.position


def frustums_over_centre(scenery: Scenery, pose: Pose) -> list[str]:
    """The cameras whose frustum's photo the browser draws over the centre of the view
    from ``pose`` (in front of its near plane, which clips a camera's own)."""
    depth, near = scenery.framing().frustum_depth, scenery.framing().near
    low = np.array([VIEWPORT["width"], VIEWPORT["height"]]) / 2 - CENTRE
    covering = []
    for index in scenery.train_ids + scenery.test_ids:
        camera = scenery.store.camera(index)
        spots = [on_screen(c, pose, VIEWPORT) for c in photo_corners(pose_of(camera), depth)]
        shown = np.array([spot for spot, z in spots if z > near])
        overlaps = len(shown) and ((shown.max(axis=0) > low).all()
                                   and (shown.min(axis=0) < low + 2 * CENTRE).all())
        if overlaps:
            covering.append(camera.name)
    return covering


def overview(scenery: Scenery) -> Pose:
    """A view from twice as far as the first one, seeing the cameras around the scene."""
    framing = scenery.framing()
    position = framing.pivot + 2.2 * (framing.position - framing.pivot)
    return view_pose(position, framing.pivot, framing.up, OVERVIEW_FOV)


def overview_address(port: int, scenery: Scenery) -> str:
    """The page, opened at ``overview`` (viser's URL parameters, in world coordinates)."""
    framing, pose = scenery.framing(), overview(scenery)
    vector = lambda v: ",".join(f"{x:.9g}" for x in v)  # noqa: E731
    return (f"http://127.0.0.1:{port}/?initialCameraPosition={vector(pose.position)}"
            f"&initialCameraLookAt={vector(framing.pivot)}&initialCameraUp={vector(framing.up)}"
            f"&initialCameraFov={pose.fov:.9g}")


def camera_to_click(scenery: Scenery, viewport: dict) -> tuple[str, np.ndarray]:
    """The training camera whose photo is nearest the overview, well inside the
    canvas: its name and where to click."""
    first = overview(scenery)
    depth = scenery.framing().frustum_depth
    spots = []
    for index in scenery.train_ids:
        camera_pose = pose_of(scenery.store.camera(index))
        spot, z = on_screen(camera_pose.position + depth * vtf.SO3(camera_pose.wxyz).apply(
            np.array([0.0, 0.0, 1.0])), first, viewport)
        inside = 60 < spot[0] < PANEL_LEFT - 60 and 60 < spot[1] < viewport["height"] - 60
        if z > 0 and inside:
            spots.append((z, scenery.store.camera(index).name, spot))
    assert spots, "no training camera in the overview"
    _, name, spot = min(spots, key=lambda s: s[0])
    return name, spot


def frustum_pixels(image: np.ndarray) -> int:
    """How many pixels left of the panel have the training frustums' colour."""
    return int((np.abs(image[:, :PANEL_LEFT] - TRAIN_COLOR).max(axis=2) < 12).sum())


def within_screen(locator) -> bool:
    box = locator.bounding_box()
    return box is not None and 0 <= box["y"] and box["y"] + box["height"] <= VIEWPORT["height"]


def test_view_opens_on_the_model_and_compares_a_camera(demo_run, browser_page, artifacts):
    out, cache = demo_run
    scene = demo_scene(cache)
    scenery = Scenery(ImageStore(scene, background=scene.background), *scene.split(True))
    framing = scenery.framing()
    first = view_pose(framing.position, framing.pivot, framing.up, framing.fov)
    expected = centre(exact_view(out, scenery, first))
    assert drawn(expected), "the first view's centre is the model, not the background"
    assert not frustums_over_centre(scenery, first)
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
        wait_until(lambda: alike(centre(screenshot(page)), expected),
                   "the model drawn at the centre of the first view, as we render it")
        page.screenshot(path=artifacts / "viewer-view.png")

        page.goto(overview_address(port, scenery))
        page.get_by_text("Click a camera").wait_for()
        name, spot = camera_to_click(scenery, VIEWPORT)
        shown = wait_until(lambda: frustum_pixels(settled(page)), "the cameras drawn")
        page.get_by_label("Show cameras").uncheck()
        wait_until(lambda: frustum_pixels(screenshot(page)) < shown / 10, "the cameras hidden")
        page.get_by_label("Show cameras").check()
        wait_until(lambda: frustum_pixels(screenshot(page)) > shown / 2, "the cameras shown again")
        page.screenshot(path=artifacts / "viewer-overview.png")

        page.mouse.click(*spot)
        page.get_by_text(name).wait_for()
        text = page.inner_text("body")
        assert "training view" in text and "photo | exact render" in text
        assert re.search(r"PSNR\s+\d+\.\d\d dB", text)
        side_by_side = page.get_by_role("img").last.bounding_box()
        assert side_by_side["width"] > 2 * side_by_side["height"], side_by_side
        still_button = page.get_by_role("button", name="Render this view (exact)")
        assert within_screen(still_button)
        page.screenshot(path=artifacts / "viewer-camera.png")

        still_button.click()
        page.get_by_text("exact render, ").wait_for()
        assert within_screen(page.get_by_role("img").last)
        assert within_screen(page.get_by_role("button", name="Download PNG"))
        page.screenshot(path=artifacts / "viewer-still.png")

        page.get_by_role("button", name="Frame the scene").click()
        wait_until(lambda: alike(centre(screenshot(page)), expected), "the first view again")
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

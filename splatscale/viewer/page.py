"""The viewer's page: a model's splats drawn by the browser, the scene's cameras as
frustums, and exact renders by our renderer on request.

It opens on what was captured (``framing.py``): upright by the cameras' up, from
a training camera, turning about what the cameras were aimed at. The panel holds
the view's controls first (frame the scene, render this view, show the cameras and
what their colours mean), then a run's progress (``live.py``), then the latest
exact render: a camera's photo beside our render there, or a still of the view.

viser calls the page's callbacks on its own threads. Renders they only queue: they
run in ``Page.serve``, on the thread that owns the model (the main one), so the
numba kernels never run on two threads at once. What they change at once (a
browser's view, the cameras shown) they change under one lock: viser's setters,
run on two of its threads at once, can skip the later value.
"""

from __future__ import annotations

import io
import queue
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from PIL import Image

from splatscale.data.cameras import Camera
from splatscale.data.images import ImageStore
from splatscale.model.gaussians import GaussianModel
from splatscale.render import render
from splatscale.step.loss import psnr
from splatscale.viewer.framing import Framing, model_framing, scene_framing
from splatscale.viewer.poses import Pose, camera_at, pose_of
from splatscale.viewer.splats import browser_splats

# The panel's parts, top to bottom; a run's progress goes between the controls and
# the renders, so that neither the controls nor the latest render leave the screen.
SUMMARY_ORDER, CONTROLS_ORDER, RUN_ORDER, RENDERS_ORDER = 0.0, 1.0, 2.0, 3.0
RENDER_WIDTH = 640       # pixels: photos and renders are sent this wide at most (the
                         # panel shows them narrower; its expand button, up to this)
GAP = 8                  # pixels between a photo and its render
MAX_STILL_HEIGHT = 1080  # pixels: a still is rendered as tall as the browser's canvas, to this
THUMBNAIL_WIDTH = 96     # pixels: each camera's photo drawn in its frustum
FRUSTUM_LINE = 0.03      # a frustum's lines are this share of its depth thick
TRAIN_COLOR, TEST_COLOR = (40, 110, 220), (230, 120, 30)
HOVER_COLOR = (251, 255, 0)  # viser's own colour for the frustum under the pointer


@dataclass(frozen=True)
class Scenery:
    """The scene beside a model: its images and which views trained and tested it."""

    store: ImageStore
    train_ids: list[int]
    test_ids: list[int]

    @property
    def extent(self) -> float:
        return self.store.scene.camera_extent(self.train_ids + self.test_ids)

    def framing(self) -> Framing:
        return scene_framing([self.store.camera(i) for i in self.train_ids],
                             self.store.scene.points)


def _model_extent(model: GaussianModel) -> float:
    """The spread of a model's centres (median distance from their median), or 1."""
    means = model.means.detach().double()
    spread = float((means - means.median(dim=0).values).norm(dim=1).median()) if len(means) else 0
    return spread if spread > 1e-9 else 1.0


def _narrowed(image: np.ndarray, width: int) -> np.ndarray:
    """uint8 [H, W, 3] downscaled to ``width`` pixels wide (never up)."""
    height, wide = image.shape[:2]
    if wide <= width:
        return image
    size = (width, max(1, round(height * width / wide)))
    return np.asarray(Image.fromarray(image).resize(size, Image.Resampling.LANCZOS))


def _side_by_side(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Two uint8 images of one size, each at most ``RENDER_WIDTH`` wide, in one row
    on white, ``GAP`` pixels apart."""
    left, right = _narrowed(left, RENDER_WIDTH), _narrowed(right, RENDER_WIDTH)
    gap = np.full((left.shape[0], GAP, 3), 255, dtype=np.uint8)
    return np.concatenate([left, gap, right], axis=1)


def _move(client, position: np.ndarray, look_at: np.ndarray, up: np.ndarray | None,
          fov: float) -> None:
    """``client``'s view from ``position`` towards ``look_at``, which it then turns
    about, with ``up`` up (None: as it is)."""
    with client.atomic():
        client.camera.fov = fov
        client.camera.position = position
        client.camera.look_at = look_at
        if up is not None:
            client.camera.up_direction = up


def _uint8(rgb: torch.Tensor) -> np.ndarray:
    return (rgb.clamp(0, 1) * 255).round().to(torch.uint8).numpy()


def _swatch(color: tuple[int, int, int]) -> str:
    r, g, b = color
    return ("<span style='display:inline-block;width:0.8em;height:0.8em;margin-right:0.3em;"
            f"vertical-align:-0.05em;background:rgb({r},{g},{b});border:1px solid #999'></span>")


def _legend(has_test_views: bool) -> str:
    """What the frustums' colours mean, as HTML."""
    entries = [(TRAIN_COLOR, "training view")]
    if has_test_views:
        entries.append((TEST_COLOR, "test view (held out)"))
    entries.append((HOVER_COLOR, "under the pointer: click to look through it"))
    rows = "".join(f"<div>{_swatch(color)}{text}</div>" for color, text in entries)
    return f"<div style='font-size:0.875em;padding:0 0.75em 0.5em'>{rows}</div>"


class Page:
    """One page, shared by every browser that opens it. ``show_model`` hands it a model
    it may keep (a copy, never changed afterwards). ``up`` is a model's own up
    direction, for a page without a scene's cameras to take theirs."""

    def __init__(self, server, scenery: Scenery | None, background: torch.Tensor,
                 title: str, up: np.ndarray | None = None) -> None:
        self.server, self.scenery, self.background = server, scenery, background
        self.title = title
        self.model: GaussianModel | None = None
        self.unit = scenery.extent if scenery else None
        self.up = up
        self.framing: Framing | None = None
        self.jobs: queue.Queue[Callable[[], None]] = queue.Queue()
        self.settings = threading.Lock()  # what the callbacks change at once
        self.still_png: bytes | None = None
        self._build_panel()
        if scenery is not None:
            self.framing = framing = scenery.framing()
            assert framing.frustum_depth is not None, "a scene's framing places its photos"
            self._add_cameras(scenery, framing.frustum_depth)
            self._open_at(framing)

    # -- the model -----------------------------------------------------------------

    def show_model(self, model: GaussianModel) -> None:
        """Draw ``model`` in every browser (replacing the previous one); keep it for
        exact renders, which render it as it is (anti-aliased or not)."""
        self.model = model
        if self.unit is None:
            self.unit = _model_extent(model)
        if self.framing is None:
            self.framing = model_framing(model.means.detach().double().numpy(), self.unit,
                                         self.up)
            self._open_at(self.framing)
        splats = browser_splats(model, self.unit)
        self.server.scene.add_gaussian_splats(
            "/splats", splats.centers, splats.covariances, splats.rgbs, splats.opacities,
            scale=splats.unit)
        self.summary.content = f"**{self.title}** · {len(model):,} Gaussians" + (
            # viser's splats have no anti-aliased mode: its drawing is the plain one
            " · anti-aliased: exact renders show it, the splats here are drawn without"
            if model.antialiased else "")

    def exact(self, camera: Camera) -> np.ndarray:
        """uint8 render of the kept model at ``camera``, at its SH degree."""
        model = self.model
        assert model is not None, "the page is served only once it shows a model"
        with torch.no_grad():
            out = render(model, camera, background=self.background.to(model.means.dtype))
        return _uint8(out.rgb)

    # -- work asked for by the browsers ------------------------------------------------

    def serve(self, timeout: float = 0.0) -> None:
        """Do the work the browsers asked for: all of it that is queued, waiting up to
        ``timeout`` seconds for the first."""
        try:
            job = self.jobs.get(timeout=timeout) if timeout > 0 else self.jobs.get_nowait()
        except queue.Empty:
            return
        while True:
            job()
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                return

    def _frame(self, client) -> None:
        """Move ``client``'s view back to the first one."""
        framing = self.framing
        if framing is not None:
            with self.settings:
                _move(client, framing.position, framing.pivot, framing.up, framing.fov)

    def _look_through(self, client, index: int) -> None:
        """Move ``client``'s view to camera ``index`` now, turning about the point of its
        axis as far away as the scene's centre; queue its photo and render."""
        scenery, framing = self.scenery, self.framing
        assert scenery is not None and framing is not None, "cameras come with a scene"
        camera = scenery.store.camera(index)
        pose = pose_of(camera)
        axes = camera.viewmat[:3, :3].double().numpy()  # rows: right, down, forward
        distance = np.linalg.norm(framing.pivot - pose.position)
        with self.settings:
            _move(client, pose.position, pose.position + distance * axes[2], -axes[1],
                  pose.fov)
        self.jobs.put(lambda: self._compare(index))

    def _compare(self, index: int) -> None:
        scenery = self.scenery
        assert scenery is not None, "cameras come with a scene"
        store = scenery.store
        camera = store.camera(index)
        split = "test" if index in scenery.test_ids else "training"
        photo = store.image(index)[..., :3].numpy()
        rendered = self.exact(camera)
        score = psnr(torch.from_numpy(rendered).float() / 255, store.as_float(index))
        self._show_render(_side_by_side(photo, rendered), "photo | exact render",
                          f"**{camera.name}** ({split} view, {camera.width}x{camera.height}): "
                          f"PSNR **{score:.2f} dB**")
        self.download.visible = False

    def _still(self, client) -> None:
        """Queue an exact render of what ``client`` sees now."""
        view = client.camera
        pose = Pose(np.asarray(view.wxyz), np.asarray(view.position), float(view.fov),
                    float(view.aspect))
        height = min(int(view.image_height or MAX_STILL_HEIGHT), MAX_STILL_HEIGHT)
        self.jobs.put(lambda: self._show_still(camera_at(pose, height, "still")))

    def _show_still(self, camera: Camera) -> None:
        image = self.exact(camera)
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="PNG")
        self.still_png = buffer.getvalue()
        self._show_render(_narrowed(image, 2 * RENDER_WIDTH), "this view",  # as a pair is
                          f"exact render, {camera.width}x{camera.height}")
        self.download.visible = True

    def _show_render(self, image: np.ndarray, label: str, text: str) -> None:
        self.render_text.content = text
        self.rendered.label = label
        self.rendered.image = image
        self.rendered.visible = True

    # -- layout ------------------------------------------------------------------------

    def _build_panel(self) -> None:
        gui = self.server.gui
        gui.configure_theme(control_width="large", show_share_button=False)
        self.summary = gui.add_markdown(f"**{self.title}**", order=SUMMARY_ORDER)
        with gui.add_folder("View", order=CONTROLS_ORDER):
            frame = gui.add_button("Frame the scene", icon="focus-centered",
                                   hint="Back to the first view: a training camera's, "
                                        "turning about what the cameras look at")
            frame.on_click(lambda event: self._frame(event.client))
            still = gui.add_button("Render this view (exact)", icon="camera")
            still.on_click(lambda event: self._still(event.client))
            if self.scenery is not None:
                self.show_cameras = gui.add_checkbox("Show cameras", initial_value=True)
                self.show_cameras.on_update(lambda _: self._show_cameras())
                gui.add_html(_legend(bool(self.scenery.test_ids)))
        with gui.add_folder("Exact render", order=RENDERS_ORDER):
            self.render_text = gui.add_markdown(
                "Click a camera to look through it: its photo beside our exact render."
                if self.scenery else "No scene given (--data): no cameras to show.")
            self.rendered = gui.add_image(np.zeros((1, 1, 3), dtype=np.uint8), format="png",
                                          visible=False)
            self.download = gui.add_button("Download PNG", visible=False)
            self.download.on_click(
                lambda event: event.client.send_file_download("still.png", self.still_png))

    def _add_cameras(self, scenery: Scenery, depth: float) -> None:
        """Each camera's frustum, its photo ``depth`` in front of it (whatever its field
        of view), under one node that "Show cameras" hides."""
        self.cameras = self.server.scene.add_frame("/cameras", show_axes=False)
        for index in scenery.train_ids + scenery.test_ids:
            pose = pose_of(scenery.store.camera(index))
            frustum = self.server.scene.add_camera_frustum(
                f"/cameras/{index}", fov=pose.fov, aspect=pose.aspect,
                scale=depth * _frustum_scale(pose), thickness=FRUSTUM_LINE * depth,
                color=TEST_COLOR if index in scenery.test_ids else TRAIN_COLOR,
                wxyz=pose.wxyz, position=pose.position,
                image=_narrowed(scenery.store.image(index)[..., :3].numpy(), THUMBNAIL_WIDTH),
                format="jpeg")
            frustum.on_click(lambda event, index=index: self._look_through(event.client, index))

    def _show_cameras(self) -> None:
        with self.settings:  # the value read under the lock: the last holder's is the latest
            self.cameras.visible = self.show_cameras.value

    def _open_at(self, framing: Framing) -> None:
        """Where every browser's view starts (and viser's "Reset view" returns to)."""
        start = self.server.initial_camera
        if framing.up is not None:
            self.server.scene.set_up_direction(framing.up)  # and the orbit's axis with it
            start.up = framing.up
        if framing.near is not None:
            start.near, start.far = framing.near, framing.far
        start.fov = framing.fov
        start.position = framing.position
        start.look_at = framing.pivot


def _frustum_scale(pose: Pose) -> float:
    """viser's frustum ``scale`` that puts its photo at depth 1: viser keeps a
    frustum's volume whatever its field of view (its client's rule)."""
    half_height = np.tan(pose.fov / 2)
    return float(np.cbrt(half_height * half_height * pose.aspect / 3))

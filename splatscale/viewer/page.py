"""The viewer's page: a model's splats drawn by the browser, the scene's cameras as
frustums, and exact renders by our renderer on request.

viser calls the page's callbacks on its own threads; they only queue work. The
renders run in ``Page.serve``, on the thread that owns the model (the main one),
so the numba kernels never run on two threads at once.
"""

from __future__ import annotations

import io
import queue
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
from splatscale.viewer.poses import Pose, camera_at, overview, pose_of, up_direction
from splatscale.viewer.splats import browser_splats

PANEL_WIDTH = 480    # pixels: photos and renders are sent to the panel this wide
MAX_STILL_HEIGHT = 1080  # pixels: a still is rendered as tall as the browser's canvas, to this
FRUSTUM_SIZE = 0.04  # of the scene's extent
THUMBNAIL_WIDTH = 96  # pixels: each camera's photo drawn in its frustum
TRAIN_COLOR, TEST_COLOR = (40, 110, 220), (230, 120, 30)


@dataclass(frozen=True)
class Scenery:
    """The scene beside a model: its images and which views trained and tested it."""

    store: ImageStore
    train_ids: list[int]
    test_ids: list[int]

    @property
    def extent(self) -> float:
        return self.store.scene.camera_extent(self.train_ids + self.test_ids)


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


def _move(client, pose: Pose) -> None:
    with client.atomic():
        client.camera.fov = pose.fov
        client.camera.wxyz = pose.wxyz
        client.camera.position = pose.position


def _uint8(rgb: torch.Tensor) -> np.ndarray:
    return (rgb.clamp(0, 1) * 255).round().to(torch.uint8).numpy()


class Page:
    """One page, shared by every browser that opens it. ``show_model`` hands it a model
    it may keep (a copy, never changed afterwards)."""

    def __init__(self, server, scenery: Scenery | None, background: torch.Tensor,
                 title: str) -> None:
        self.server, self.scenery, self.background = server, scenery, background
        self.title = title
        self.model: GaussianModel | None = None
        self.unit = scenery.extent if scenery else None
        self.jobs: queue.Queue[Callable[[], None]] = queue.Queue()
        self.still_png: bytes | None = None
        self._build_panel()
        if scenery is not None:
            self._add_cameras(scenery)
        server.on_client_connect(self._greet)

    # -- the model -----------------------------------------------------------------

    def show_model(self, model: GaussianModel) -> None:
        """Draw ``model`` in every browser (replacing the previous one); keep it for
        exact renders."""
        self.model = model
        if self.unit is None:
            self.unit = _model_extent(model)
        splats = browser_splats(model, self.unit)
        self.server.scene.add_gaussian_splats(
            "/splats", splats.centers, splats.covariances, splats.rgbs, splats.opacities,
            scale=splats.unit)
        self.summary.content = f"**{self.title}** · {len(model):,} Gaussians"

    def exact(self, camera: Camera) -> np.ndarray:
        """uint8 render of the kept model at ``camera``, at its SH degree."""
        with torch.no_grad():
            out = render(self.model, camera, background=self.background.to(self.model.means.dtype))
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

    def _look_through(self, client, index: int) -> None:
        """Move ``client``'s view to camera ``index`` now; queue its photo and render."""
        _move(client, pose_of(self.scenery.store.camera(index)))
        self.jobs.put(lambda: self._compare(index))

    def _compare(self, index: int) -> None:
        store = self.scenery.store
        camera = store.camera(index)
        split = "test" if index in self.scenery.test_ids else "training"
        photo = store.image(index).numpy()
        rendered = self.exact(camera)
        score = psnr(torch.from_numpy(rendered).float() / 255, store.as_float(index))
        self.view_text.content = (f"**{camera.name}** ({split} view, {camera.width}x"
                                  f"{camera.height}): PSNR **{score:.2f} dB**")
        self.photo.image = _narrowed(photo, PANEL_WIDTH)
        self.render.image = _narrowed(rendered, PANEL_WIDTH)
        self.photo.visible = self.render.visible = True

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
        self.still.image = _narrowed(image, PANEL_WIDTH)
        self.still.visible = self.download.visible = True
        self.still_text.content = f"exact render, {camera.width}x{camera.height}"

    # -- layout ------------------------------------------------------------------------

    def _build_panel(self) -> None:
        gui = self.server.gui
        gui.configure_theme(control_width="large", show_share_button=False)
        self.summary = gui.add_markdown(f"**{self.title}**")
        blank = np.zeros((1, 1, 3), dtype=np.uint8)
        with gui.add_folder("Camera"):
            self.view_text = gui.add_markdown(
                "Click a camera to look through it: its photo, and our exact render."
                if self.scenery else "No scene given (--data): no cameras to show.")
            self.photo = gui.add_image(blank, label="photo", visible=False)
            self.render = gui.add_image(blank, label="exact render", visible=False)
        with gui.add_folder("Still"):
            button = gui.add_button("Render this view (exact)")
            button.on_click(lambda event: self._still(event.client))
            self.still_text = gui.add_markdown("")
            self.still = gui.add_image(blank, label="still", format="png", visible=False)
            self.download = gui.add_button("Download PNG", visible=False)
            self.download.on_click(
                lambda event: event.client.send_file_download("still.png", self.still_png))

    def _add_cameras(self, scenery: Scenery) -> None:
        size = FRUSTUM_SIZE * scenery.extent
        for index in scenery.train_ids + scenery.test_ids:
            camera = scenery.store.camera(index)
            pose = pose_of(camera)
            color = TEST_COLOR if index in scenery.test_ids else TRAIN_COLOR
            frustum = self.server.scene.add_camera_frustum(
                f"/cameras/{index}", fov=pose.fov, aspect=pose.aspect, scale=size,
                thickness=0.02 * size, color=color, wxyz=pose.wxyz, position=pose.position,
                image=_narrowed(scenery.store.image(index).numpy(), THUMBNAIL_WIDTH),
                format="jpeg")
            frustum.on_click(lambda event, index=index: self._look_through(event.client, index))
        cameras = [scenery.store.camera(i) for i in scenery.train_ids]
        self.server.scene.set_up_direction(up_direction(cameras))

    def _greet(self, client) -> None:
        """A new browser starts behind the first training view, seeing the cameras
        around the scene, or facing the model."""
        if self.scenery is not None:
            first = pose_of(self.scenery.store.camera(self.scenery.train_ids[0]))
            _move(client, overview(first, self.scenery.extent))
        elif self.model is not None:
            centre = self.model.means.detach().double().median(dim=0).values.numpy()
            client.camera.position = centre + np.array([0.0, 0.0, -3.0 * self.unit])
            client.camera.look_at = centre

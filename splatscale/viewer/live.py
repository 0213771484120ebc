"""A training run on the page: its progress, a plot of loss and PSNR, pause, resume
and checkpoint now; its splats refreshed as it trains. ``LiveRun`` is the serving
rank's ``train.watch.Watcher``.

The browsers' clicks arrive on viser's threads and only set flags and show the
buttons that follow (under one lock: ``page.py`` says why); everything else runs
between two steps on the training thread, and costs it little: the panel is
rewritten at most every ``PANEL_EVERY`` seconds, the splats only while a browser
watches and at most once per ``REFRESH_COST_RATIO`` times what the last refresh
took.
"""

from __future__ import annotations

import math
import threading
import time

import numpy as np

from splatscale.model.gaussians import GaussianModel
from splatscale.viewer.page import RUN_ORDER, Page

PANEL_EVERY = 0.5        # seconds between rewrites of the progress panel
PLOT_EVERY = 2.0         # seconds between updates of the plot
PLOT_POINTS = 1000       # the plot shows at most this many steps, evenly spread
MIN_REFRESH = 3.0        # seconds between two refreshes of the splats, at least
REFRESH_COST_RATIO = 50  # and at least this many times the last refresh's cost


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "-"
    minutes, seconds = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {seconds:02d} s"


class LiveRun:
    """The progress panel of a run on ``page``."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.history: list[tuple[int, float, float]] = []  # (images, loss, psnr)
        self.entry: dict | None = None
        self.total_images = 0
        self.state = "starting"
        self.note = ""
        self._pause_asked = False
        self._checkpoint_asked = False
        self._panel_at = self._plot_at = -math.inf
        self._model_at, self._model_cost, self._asked_at = -math.inf, 0.0, 0.0
        self.splats_sent = 0  # models drawn in the browsers
        # viser's visibility setters, run on two threads at once, can skip the later value
        self._buttons = threading.Lock()
        self._build()
        page.server.on_client_connect(self._new_browser)

    # -- train.watch.Watcher ------------------------------------------------------------

    def after_step(self, entry: dict, total_images: int) -> None:
        self.entry, self.total_images = entry, total_images
        self.history.append((entry["images"], entry["loss"], entry["psnr"]))
        self.state = "training"
        now = time.monotonic()
        if now - self._panel_at >= PANEL_EVERY:
            self._show_progress(now)
        if now - self._plot_at >= PLOT_EVERY:
            self._show_plot(now)

    def model_due(self) -> bool:
        now = time.monotonic()
        due = (bool(self.page.server.get_clients())
               and now - self._model_at >= max(MIN_REFRESH, REFRESH_COST_RATIO * self._model_cost))
        if due:
            self._asked_at = now
        return due

    def show_model(self, model: GaussianModel | None) -> None:
        # None goes to the ranks that do not write; the rank that serves the page writes
        assert model is not None, "the rank serving the page gathers the model"
        self.page.show_model(model)
        self.splats_sent += 1
        self._model_at = time.monotonic()
        self._model_cost = self._model_at - self._asked_at

    def checkpoint_requested(self) -> bool:
        asked, self._checkpoint_asked = self._checkpoint_asked, False
        return asked

    def checkpoint_saved(self, images: int) -> None:
        self.note = f"checkpoint saved after image {images:,}"
        self._show_progress(time.monotonic())

    def paused(self) -> bool:
        if self._pause_asked and self.state != "paused":
            self.state = "paused"
            self._show_progress(time.monotonic())
        return self._pause_asked

    def wait(self, seconds: float) -> None:
        self.page.serve(timeout=seconds)

    def serve(self) -> None:
        self.page.serve()

    def finished(self, images: int) -> None:
        self.state, self.note = "finished", f"the run's outputs are written after image {images:,}"
        with self._buttons:
            self.pause.visible = self.resume.visible = self.checkpoint.visible = False
        now = time.monotonic()
        self._show_progress(now)
        self._show_plot(now)

    # -- the panel -----------------------------------------------------------------------

    def _build(self) -> None:
        gui = self.page.server.gui
        with gui.add_folder("Training", order=RUN_ORDER):
            self.progress = gui.add_markdown("starting")
            self.pause = gui.add_button("Pause", icon="player-pause")
            self.resume = gui.add_button("Resume", icon="player-play", visible=False)
            self.checkpoint = gui.add_button("Checkpoint now", icon="device-floppy")
            self.plot = gui.add_uplot(
                data=(np.zeros(0), np.zeros(0), np.zeros(0)),
                series=({"label": "images"},
                        {"label": "loss", "stroke": "#d9480f", "scale": "loss"},
                        {"label": "PSNR (dB)", "stroke": "#1c7ed6", "scale": "psnr"}),
                scales={"x": {"time": False}, "loss": {"auto": True}, "psnr": {"auto": True}},
                axes=({}, {"scale": "loss"}, {"scale": "psnr", "side": 1, "grid": {"show": False}}),
                aspect=1.6)
        self.pause.on_click(lambda _: self._ask_pause(True))
        self.resume.on_click(lambda _: self._ask_pause(False))
        self.checkpoint.on_click(lambda _: self._ask_checkpoint())

    def _ask_pause(self, pause: bool) -> None:
        with self._buttons:  # the flag and the buttons from one click
            self._pause_asked = pause
            self.pause.visible, self.resume.visible = not pause, pause
        self.note = "pausing after this step" if pause else ""

    def _ask_checkpoint(self) -> None:
        self._checkpoint_asked = True
        self.note = "saving a checkpoint after this step"

    def _new_browser(self, client) -> None:
        self._model_at = -math.inf  # its first splats at the next step

    def _show_progress(self, now: float) -> None:
        self._panel_at = now
        entry = self.entry
        if entry is None:
            return
        rate = entry.get("images_per_second", 0.0)
        left = (self.total_images - entry["images"]) / rate if rate > 0 else math.inf
        rows = [("state", self.state),
                ("images", f"{entry['images']:,} / {self.total_images:,}"),
                ("loss", f"{entry['loss']:.4f}"), ("PSNR", f"{entry['psnr']:.2f} dB"),
                ("Gaussians", f"{entry['num_gaussians']:,}"), ("images/s", f"{rate:.1f}"),
                ("ETA", "-" if self.state == "finished" else _duration(left))]
        table = "\n".join(f"| {name} | {value} |" for name, value in rows)
        note = f"\n\n{self.note}" if self.note else ""
        self.progress.content = "| | |\n|---|---|\n" + table + note

    def _show_plot(self, now: float) -> None:
        self._plot_at = now
        if not self.history:
            return
        stride = math.ceil(len(self.history) / PLOT_POINTS)
        points = self.history[::stride]
        if points[-1] is not self.history[-1]:
            points.append(self.history[-1])
        shown = np.asarray(points)
        self.plot.data = (shown[:, 0], shown[:, 1], shown[:, 2])

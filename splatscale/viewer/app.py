"""The viewer's two uses: a model on its own (``splatscale view``) and a run as it
trains (``splatscale train --viewer``)."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch

from splatscale.errors import DataError
from splatscale.messages import notice
from splatscale.model.gaussians import GaussianModel
from splatscale.viewer.live import LiveRun
from splatscale.viewer.page import Page, Scenery
from splatscale.viewer.server import open_server, url

SERVE_POLL = 0.2  # seconds: how long a viewing process waits for work before looking again


def viewed_model(target: Path) -> tuple[Path, dict | None]:
    """The PLY that ``target`` names (a PLY, or a run folder's point_cloud.ply) and,
    for a run folder, its config.json (where its scene is)."""
    if not target.is_dir():
        return target, None
    model, config = target / "point_cloud.ply", target / "config.json"
    if not model.is_file():
        raise DataError(f"{target}: a folder without point_cloud.ply (a finished run's "
                        "model); name a PLY, or a run folder")
    if not config.is_file():
        return model, None
    try:
        record = json.loads(config.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DataError(f"{config}: not a run's config.json ({error})") from None
    return model, _checked_record(record, config)


# What view reads of a run's config.json, and what each may be.
RECORD_FIELDS = {"data": lambda v: v is None or isinstance(v, str),
                 "resolution": lambda v: v in (None, 1, 2, 4, 8),
                 "max_width": lambda v: v is None or (type(v) is int and v >= 16),
                 "eval": lambda v: isinstance(v, bool),
                 "white_background": lambda v: v is None or isinstance(v, bool)}


def _checked_record(record, config: Path) -> dict:
    if not isinstance(record, dict):
        raise DataError(f"{config}: not a run's config.json (not a JSON object)")
    for name, fits in RECORD_FIELDS.items():
        if name in record and not fits(record[name]):
            raise DataError(f"{config}: not a run's config.json ({name}: {record[name]!r})")
    return record


@contextmanager
def served(host: str, port: int) -> Iterator[object]:
    """viser's server on ``host:port`` while the block runs."""
    server = open_server(host, port)
    try:
        yield server
    finally:
        server.stop()


def view(server, model: GaussianModel, scenery: Scenery | None, background: torch.Tensor,
         title: str) -> None:
    """Show ``model`` until Ctrl-C."""
    page = Page(server, scenery, background, title)
    page.show_model(model)
    notice(f"viewing {title} at {url(server)} (Ctrl-C to stop)")
    try:
        while True:
            page.serve(timeout=SERVE_POLL)
    except KeyboardInterrupt:
        return


def live_run(server, scenery: Scenery, background: torch.Tensor, title: str) -> LiveRun:
    """The page of a run about to train: its watcher."""
    live = LiveRun(Page(server, scenery, background, title))
    notice(f"watch and steer the run at {url(server)}")
    return live

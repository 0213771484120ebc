"""The viewer's two uses: a model on its own (``splatscale view``) and a run as it
trains (``splatscale train --viewer``)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import numpy as np
import torch

from splatscale.messages import notice
from splatscale.model.gaussians import GaussianModel
from splatscale.viewer.live import LiveRun
from splatscale.viewer.page import Page, Scenery
from splatscale.viewer.server import open_server, url

SERVE_POLL = 0.2  # seconds: how long a viewing process waits for work before looking again


@contextmanager
def served(host: str | None, port: int | None) -> Iterator[object]:
    """viser's server on ``host:port`` (None: the defaults) while the block runs."""
    server = open_server(host, port)
    try:
        yield server
    finally:
        server.stop()


def view(server, model: GaussianModel, scenery: Scenery | None, background: torch.Tensor,
         title: str, up: np.ndarray | None = None) -> None:
    """Show ``model`` until Ctrl-C; upright by ``up`` (its file's) without a scene."""
    page = Page(server, scenery, background, title, up)
    page.show_model(model)
    notice(f"viewing {title} at {url(server)} (Ctrl-C to stop)")
    # Only a stop signal ends it, and it ends as every command's stop does, whenever
    # it lands (the scene still loading or the page served): the stop's
    # KeyboardInterrupt says "interrupted", exit status 130. A status 0 would tell a
    # script or a scheduler that the viewer finished, which it never does by itself.
    while True:
        page.serve(timeout=SERVE_POLL)


def live_run(server, scenery: Scenery, background: torch.Tensor, title: str) -> LiveRun:
    """The page of a run about to train: its watcher."""
    live = LiveRun(Page(server, scenery, background, title))
    notice(f"watch and steer the run at {url(server)}")
    return live

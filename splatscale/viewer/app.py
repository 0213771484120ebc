"""The viewer's two uses: a model on its own (``splatscale view``) and a run as it
trains (``splatscale train --viewer``)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from splatscale.messages import notice
from splatscale.model.gaussians import GaussianModel
from splatscale.viewer.live import LiveRun
from splatscale.viewer.page import Page, Scenery
from splatscale.viewer.server import open_server, url

SERVE_POLL = 0.2  # seconds: how long a viewing process waits for work before looking again


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

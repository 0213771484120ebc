"""The renderer contract: ``project`` (stage 1) then ``rasterize`` (stage 2).

Both stages are differentiable. ``render`` runs them for one camera.
"""

from __future__ import annotations

from torch import Tensor

from splatscale.data.cameras import Camera
from splatscale.model.gaussians import GaussianModel
from splatscale.backends import Backend
from splatscale.render.projection import project
from splatscale.render.rasterize import RenderOutput, rasterize
from splatscale.render.splats import Splats


def render(model: GaussianModel, camera: Camera, rows: tuple[int, int] | None = None,
           background: Tensor | None = None, backend: Backend | None = None,
           depth: bool = False) -> RenderOutput:
    """Project ``model`` into ``camera`` and rasterize rows ``[y0, y1)`` (default all),
    with ``backend`` (None: the backend of the model's device), the depth too with
    ``depth``."""
    splats = project(model, [camera], backend=backend)
    return rasterize(splats.of_camera(0), camera.width, camera.height, rows, background,
                     backend, depth)


__all__ = ["Backend", "RenderOutput", "Splats", "project", "rasterize", "render"]

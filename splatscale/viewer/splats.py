"""A model as viser's Gaussian splats: centres, covariances, colours (degree 0) and
opacities, in the frame the browser draws."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from splatscale.model.gaussians import SH_C0, GaussianModel
from splatscale.render.projection import covariance_factor


@dataclass(frozen=True)
class BrowserSplats:
    """What viser's ``add_gaussian_splats`` takes, divided by ``unit``: viser sends the
    covariances as float16, whose smallest normal number (6e-5) a small scene's
    Gaussians go below in world units. The node is drawn scaled by ``unit``."""

    centers: np.ndarray      # [N, 3] float32
    covariances: np.ndarray  # [N, 3, 3] float32
    rgbs: np.ndarray         # [N, 3] in [0, 1]
    opacities: np.ndarray    # [N, 1] in [0, 1]
    unit: float


def browser_splats(model: GaussianModel, unit: float) -> BrowserSplats:
    """``model`` in units of ``unit`` (a scene's size); colours are the view-independent
    part, as viser's splats carry no spherical harmonics."""
    with torch.no_grad():
        factors = covariance_factor(model.quats.float(), model.scales.float() / unit)
        covariances = factors @ factors.transpose(1, 2)
        rgbs = (SH_C0 * model.sh0[:, 0].float() + 0.5).clamp(0, 1)
        return BrowserSplats(centers=(model.means.float() / unit).numpy(),
                             covariances=covariances.numpy(),
                             rgbs=rgbs.numpy(),
                             opacities=model.opacities.float()[:, None].numpy(),
                             unit=unit)


"""The Gaussian model and its initialisation."""

from splatscale.model.gaussians import GaussianModel
from splatscale.model.init import init_from_points

__all__ = ["GaussianModel", "init_from_points"]

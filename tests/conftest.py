"""Shared test helpers: the test data folder and small synthetic scenes."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from splatscale.data.cameras import Camera
from splatscale.model.gaussians import SH_REST, GaussianModel

TEST_DATA = Path(__file__).resolve().parent / "data"


def data_path(*parts: str) -> Path:
    """A path under tests/data (see its README for what is there and the licences)."""
    path = TEST_DATA.joinpath(*parts)
    assert path.exists(), f"test data missing from the checkout: {path}"
    return path


def look_at_camera(eye, target, width: int, height: int, focal: float,
                   dtype=torch.float64, name: str = "") -> Camera:
    """An OpenCV-axes camera at ``eye`` looking at ``target``, principal point centred."""
    eye, target = np.asarray(eye, float), np.asarray(target, float)
    forward = target - eye
    forward /= np.linalg.norm(forward)
    right = np.cross(forward, [0.0, -1.0, 0.0])
    if np.linalg.norm(right) < 1e-8:
        right = np.array([1.0, 0.0, 0.0])
    right /= np.linalg.norm(right)
    down = np.cross(forward, right)
    rotation = np.stack([right, down, forward])  # rows: camera axes in world
    K = np.array([[focal, 0, width / 2], [0, focal, height / 2], [0, 0, 1]])
    camera = Camera.from_pose(torch.from_numpy(rotation), torch.from_numpy(-rotation @ eye),
                              torch.from_numpy(K), width, height, name)
    return Camera(camera.viewmat.to(dtype), camera.K.to(dtype), width, height, name)


def random_model(n: int, seed: int = 0, dtype=torch.float64, sh_degree: int = 3,
                 spread: float = 1.0, log_scale=(-3.0, -1.0), opacity=(0.2, 0.95)) -> GaussianModel:
    """Gaussians scattered around the origin with random shape, opacity and SH."""
    g = torch.Generator().manual_seed(seed)
    uniform = lambda *shape, lo=0.0, hi=1.0: lo + (hi - lo) * torch.rand(*shape, generator=g,  # noqa: E731
                                                                             dtype=dtype)
    opacities = uniform(n, lo=opacity[0], hi=opacity[1])
    return GaussianModel(
        means=(uniform(n, 3) - 0.5) * 2 * spread,
        quats=torch.randn(n, 4, generator=g, dtype=dtype),
        log_scales=uniform(n, 3, lo=log_scale[0], hi=log_scale[1]),
        opacity_logits=torch.log(opacities / (1 - opacities)),
        sh0=uniform(n, 1, 3, lo=-1.0, hi=1.0),
        shN=0.3 * torch.randn(n, SH_REST, 3, generator=g, dtype=dtype),
        sh_degree=sh_degree,
    )


def orbit_cameras(count: int, width: int, height: int, radius: float = 4.0,
                  dtype=torch.float64) -> list[Camera]:
    return [look_at_camera([radius * math.cos(a), 0.3 * radius, radius * math.sin(a)],
                           [0, 0, 0], width, height, focal=1.2 * width, dtype=dtype)
            for a in np.linspace(0, 2 * math.pi, count, endpoint=False)]

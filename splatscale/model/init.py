"""The standard 3DGS initialisation of a model from a coloured point cloud."""

from __future__ import annotations

import numpy as np
import torch
from scipy.spatial import cKDTree

from splatscale.model.gaussians import SH_C0, SH_REST, GaussianModel

INITIAL_OPACITY = 0.1


def nearest_neighbour_scales(points: np.ndarray, k: int = 3) -> np.ndarray:
    """sqrt of the mean squared distance to the k nearest other points."""
    if len(points) < 2:
        return np.full(len(points), 0.01)
    k = min(k, len(points) - 1)
    distances, _ = cKDTree(points).query(points, k=k + 1)
    mean_sq = np.mean(distances[:, 1:] ** 2, axis=1)
    return np.sqrt(np.maximum(mean_sq, 1e-7))


def init_from_points(points: np.ndarray, colors: np.ndarray,
                     dtype: torch.dtype = torch.float32) -> GaussianModel:
    """Isotropic Gaussians at the points, sized by their 3 nearest neighbours.

    ``colors`` are RGB in [0, 1] (float) or 0..255 (uint8). Rotation identity,
    opacity 0.1, SH degree 0 from the colours.
    """
    points = np.asarray(points, dtype=np.float64)
    if points.ndim != 2 or points.shape[1] != 3 or len(points) == 0:
        raise ValueError(f"need a non-empty [N, 3] point cloud, got shape {points.shape}")
    colors = np.asarray(colors)
    rgb = colors / 255.0 if colors.dtype == np.uint8 else colors.astype(np.float64)
    n = len(points)
    log_scale = np.log(nearest_neighbour_scales(points))
    quats = np.zeros((n, 4))
    quats[:, 0] = 1.0
    logit = np.log(INITIAL_OPACITY / (1.0 - INITIAL_OPACITY))
    as_tensor = lambda a: torch.as_tensor(a, dtype=dtype)  # noqa: E731
    return GaussianModel(
        means=as_tensor(points),
        quats=as_tensor(quats),
        log_scales=as_tensor(np.repeat(log_scale[:, None], 3, axis=1)),
        opacity_logits=torch.full((n,), logit, dtype=dtype),
        sh0=as_tensor((rgb - 0.5) / SH_C0)[:, None, :],
        shN=torch.zeros((n, SH_REST, 3), dtype=dtype),
        sh_degree=0,
    )


def random_points_in_view(cameras: list, count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``count`` random points with random colours that some camera sees.

    Points are drawn in a cube around the cameras' centroid, half as wide as
    the camera rig, and kept when they land in front of a camera and inside
    its image (3DGS draws them in a fixed cube instead, made for its synthetic scenes).
    """
    rng = np.random.default_rng(seed)
    centres = np.stack([c.center.numpy() for c in cameras])
    middle = centres.mean(axis=0)
    half = 0.5 * max(np.linalg.norm(centres - middle, axis=1).max(), 1e-3)
    kept: list[np.ndarray] = []
    total = 0
    for _ in range(100):
        candidates = middle + rng.uniform(-half, half, (count, 3))
        seen = np.zeros(count, dtype=bool)
        for camera in cameras:
            view = camera.viewmat.numpy()
            p = candidates @ view[:3, :3].T + view[:3, 3]
            uv = p @ camera.K.numpy().T
            z = p[:, 2]
            with np.errstate(divide="ignore", invalid="ignore"):
                u, v = uv[:, 0] / z, uv[:, 1] / z
            seen |= (z > 0.01) & (u >= 0) & (u < camera.width) & (v >= 0) & (v < camera.height)
        kept.append(candidates[seen])
        total += int(seen.sum())
        if total >= count:
            break
    points = np.concatenate(kept)[:count]
    return points, rng.integers(0, 256, (len(points), 3)).astype(np.uint8)

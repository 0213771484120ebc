"""The built-in demo scene: made procedurally, deterministic, no download.

A ring of coloured blobs around a striped sphere on a checkered floor, as
ground-truth Gaussians rendered by our own renderer from 32 orbiting views.
The initial point cloud is a sparse, noisy sample of the ground truth, so
training has to densify to reproduce the images.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from splatscale.data.cameras import Camera
from splatscale.cache_home import default_cache_dir
from splatscale.data.images import write_png
from splatscale.data.scene import Scene, View
from splatscale.model.gaussians import SH_C0, SH_REST, GaussianModel
from splatscale.render import render

VERSION = 1
WIDTH, HEIGHT, VIEWS = 128, 96, 32


def _ground_truth(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(means, colours in [0, 1], log scales) of the scene's Gaussians."""
    parts = []
    # Striped sphere.
    n = 900
    z = rng.uniform(-1, 1, n)
    phi = rng.uniform(0, 2 * math.pi, n)
    r = np.sqrt(1 - z * z)
    sphere = 0.6 * np.stack([r * np.cos(phi), z, r * np.sin(phi)], 1)
    stripes = (np.floor((z + 1) * 4) % 2)[:, None]
    parts.append((sphere, stripes * [0.9, 0.3, 0.2] + (1 - stripes) * [0.95, 0.9, 0.8], -3.3))
    # Checkered floor.
    xs, zs = np.meshgrid(np.linspace(-1.6, 1.6, 36), np.linspace(-1.6, 1.6, 36))
    floor = np.stack([xs.ravel(), np.full(xs.size, 0.75), zs.ravel()], 1)
    checks = ((np.floor(xs.ravel() * 2) + np.floor(zs.ravel() * 2)) % 2)[:, None]
    parts.append((floor, checks * [0.2, 0.3, 0.6] + (1 - checks) * [0.85, 0.85, 0.9], -3.0))
    # Ring of blobs.
    angles = np.linspace(0, 2 * math.pi, 12, endpoint=False)
    blobs = np.stack([1.2 * np.cos(angles), np.full(12, 0.35), 1.2 * np.sin(angles)], 1)
    hues = np.stack([0.5 + 0.5 * np.cos(angles + k * 2.1) for k in range(3)], 1)
    parts.append((blobs, hues, -2.0))
    means = np.concatenate([p[0] for p in parts])
    colors = np.concatenate([np.broadcast_to(np.asarray(p[1], float), p[0].shape) for p in parts])
    log_scales = np.concatenate([np.full(len(p[0]), p[2]) for p in parts])
    return means, colors, log_scales


def _cameras() -> list[Camera]:
    cameras = []
    for i in range(VIEWS):
        angle = 2 * math.pi * i / VIEWS
        height = -1.2 - 0.6 * math.sin(3 * angle)  # y is down: cameras look from above
        eye = np.array([3.2 * math.cos(angle), height, 3.2 * math.sin(angle)])
        forward = -eye / np.linalg.norm(eye)
        right = np.cross(forward, [0.0, -1.0, 0.0])
        right /= np.linalg.norm(right)
        down = np.cross(forward, right)
        rotation = np.stack([right, down, forward])
        K = np.array([[1.1 * WIDTH, 0, WIDTH / 2], [0, 1.1 * WIDTH, HEIGHT / 2], [0, 0, 1]])
        cameras.append(Camera.from_pose(torch.from_numpy(rotation),
                                        torch.from_numpy(-rotation @ eye), torch.from_numpy(K),
                                        WIDTH, HEIGHT, f"view_{i:03d}.png"))
    return cameras


def _model(means: np.ndarray, colors: np.ndarray, log_scales: np.ndarray) -> GaussianModel:
    n = len(means)
    quats = torch.zeros(n, 4)
    quats[:, 0] = 1
    return GaussianModel(
        means=torch.tensor(means, dtype=torch.float32), quats=quats,
        log_scales=torch.tensor(log_scales, dtype=torch.float32)[:, None].repeat(1, 3),
        opacity_logits=torch.full((n,), 3.0),
        sh0=torch.tensor((colors - 0.5) / SH_C0, dtype=torch.float32)[:, None],
        shN=torch.zeros(n, SH_REST, 3), sh_degree=0)


def demo_scene(cache_dir: Path | None = None) -> Scene:
    """The demo scene, its images written once under ``cache_dir``."""
    folder = (cache_dir or default_cache_dir()) / f"demo-v{VERSION}"
    rng = np.random.default_rng(2024)
    means, colors, log_scales = _ground_truth(rng)
    cameras = _cameras()
    if not all((folder / c.name).is_file() for c in cameras):
        model = _model(means, colors, log_scales)
        with torch.no_grad():
            for camera in cameras:
                rgb = render(model, camera, background=torch.ones(3)).rgb
                write_png((rgb.clamp(0, 1) * 255).round().to(torch.uint8).numpy(),
                           folder / camera.name)
    sample = rng.choice(len(means), len(means) // 6, replace=False)
    points = means[sample] + rng.normal(0, 0.03, (len(sample), 3))
    point_colors = np.clip(colors[sample] + rng.normal(0, 0.08, (len(sample), 3)), 0, 1)
    views = [View(c, folder / c.name) for c in cameras]
    return Scene(views, points, (point_colors * 255).round().astype(np.uint8), folder,
                 background=(1.0, 1.0, 1.0))

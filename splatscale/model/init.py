"""The standard 3DGS initialisation of a model from a coloured point cloud."""

from __future__ import annotations

import numpy as np
import torch
from scipy.spatial import cKDTree

from splatscale.model.gaussians import SH_C0, SH_REST, GaussianModel

INITIAL_OPACITY = 0.1
# Optical axes within about 10 degrees of one direction count as parallel: the
# smallest eigenvalue of sum(I - a a^T) is then below n sin^2(10 deg) / 3 = 0.01 n.
CONVERGENCE = 0.01


def nearest_neighbour_scales(points: np.ndarray, k: int = 3) -> np.ndarray:
    """sqrt of the mean squared distance to the k nearest other points."""
    if len(points) < 2:
        return np.full(len(points), 0.01)
    k = min(k, len(points) - 1)
    distances, _ = cKDTree(points).query(points, k=k + 1)
    mean_sq = np.mean(distances[:, 1:] ** 2, axis=1)
    return np.sqrt(np.maximum(mean_sq, 1e-7))


def init_from_points(points: np.ndarray, colors: np.ndarray,
                     dtype: torch.dtype = torch.float32, opacity: float = INITIAL_OPACITY,
                     scale: float = 1.0, antialiased: bool = False) -> GaussianModel:
    """Isotropic Gaussians at the points, sized by their 3 nearest neighbours times
    ``scale``.

    ``colors`` are RGB in [0, 1] (float) or 0..255 (uint8). Rotation identity,
    ``opacity`` (3DGS: 0.1), SH degree 0 from the colours; rendered anti-aliased
    where ``antialiased`` says.
    """
    points = np.asarray(points, dtype=np.float64)
    if points.ndim != 2 or points.shape[1] != 3 or len(points) == 0:
        raise ValueError(f"need a non-empty [N, 3] point cloud, got shape {points.shape}")
    colors = np.asarray(colors)
    rgb = colors / 255.0 if colors.dtype == np.uint8 else colors.astype(np.float64)
    n = len(points)
    log_scale = np.log(nearest_neighbour_scales(points) * scale)
    quats = np.zeros((n, 4))
    quats[:, 0] = 1.0
    logit = np.log(opacity / (1.0 - opacity))
    as_tensor = lambda a: torch.as_tensor(a, dtype=dtype)  # noqa: E731
    return GaussianModel(
        means=as_tensor(points),
        quats=as_tensor(quats),
        log_scales=as_tensor(np.repeat(log_scale[:, None], 3, axis=1)),
        opacity_logits=torch.full((n,), logit, dtype=dtype),
        sh0=as_tensor((rgb - 0.5) / SH_C0)[:, None, :],
        shN=torch.zeros((n, SH_REST, 3), dtype=dtype),
        sh_degree=0,
        antialiased=antialiased,
    )


BORDER = 0.03          # the border band's width, as a fraction of each side
PLAIN_TOLERANCE = 12   # uint8 levels from the band's median colour
PLAIN_FRACTION = 0.9   # of the band's pixels, in most images, for a plain background


def plain_background(images: list[np.ndarray]) -> bool:
    """Whether most images ([h, w, 3] uint8) have a border of one plain colour: an
    object shot on a plain (or transparent) background, where random points belong
    where the cameras look; a capture that shows the room around it has none."""
    def plain(image: np.ndarray) -> bool:
        h, w = image.shape[:2]
        dy, dx = max(1, round(BORDER * h)), max(1, round(BORDER * w))
        band = np.concatenate([image[:dy].reshape(-1, 3), image[-dy:].reshape(-1, 3),
                               image[:, :dx].reshape(-1, 3), image[:, -dx:].reshape(-1, 3)])
        distance = np.abs(band.astype(np.int16) - np.median(band, axis=0)).max(axis=1)
        return float((distance <= PLAIN_TOLERANCE).mean()) >= PLAIN_FRACTION
    return 2 * sum(plain(image) for image in images) > len(images)


CUBE_EXTENT = 3.0  # gsplat's init_extent: the cube's half side in scene scales


def random_points_in_cube(cameras: list, count: int, seed: int = 0
                          ) -> tuple[np.ndarray, np.ndarray]:
    """``count`` random points with random colours, uniform in the cube around the
    cameras' centroid whose half side is ``CUBE_EXTENT`` times the scene scale (the
    largest distance of a camera from the centroid): gsplat's ``init_type="random"``
    (its world is centred on the cameras). It covers the room around an object too."""
    rng = np.random.default_rng(seed)
    centres = np.stack([c.center.numpy() for c in cameras])
    centroid = centres.mean(axis=0)
    scale = max(float(np.linalg.norm(centres - centroid, axis=1).max()), 1e-3)
    points = centroid + CUBE_EXTENT * scale * rng.uniform(-1, 1, (count, 3))
    return points, rng.integers(0, 256, (count, 3)).astype(np.uint8)


def random_points_in_view(cameras: list, count: int,
                          seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``count`` random points with random colours where the cameras look.

    When the optical axes converge in front of the cameras (an inward-facing
    capture), the points fill a ball around the point nearest to all axes, as
    wide as a camera sees at its distance from that point: that is where the
    object is. Otherwise (axes nearly parallel, or diverging) they fill the
    cameras' frusta evenly up to a far bound of twice the rig's diameter.
    Every point lies in front of some camera and inside its image. (3DGS draws
    them in a fixed cube instead, made for its synthetic scenes.)
    """
    rng = np.random.default_rng(seed)
    centres = np.stack([c.center.numpy() for c in cameras])
    axes = np.stack([c.viewmat[2, :3].numpy() for c in cameras])  # +z of each camera, in world
    focus = focus_point(centres, axes)
    if focus is None:
        rig = max(np.linalg.norm(centres - centres.mean(axis=0), axis=1).max(), 1e-3)
        points = _points_in_frusta(cameras, count, 4 * rig, rng)
    else:
        points = _points_around(focus, cameras, count, rng)
    return points, rng.integers(0, 256, (len(points), 3)).astype(np.uint8)


def focus_point(centres: np.ndarray, axes: np.ndarray) -> np.ndarray | None:
    """The point nearest to every optical axis (least squares), or None when the
    axes do not converge in front of the cameras."""
    projectors = np.eye(3) - axes[:, :, None] * axes[:, None, :]  # onto each axis' normal plane
    normal = projectors.sum(axis=0)
    if np.linalg.eigvalsh(normal)[0] < CONVERGENCE * len(axes):
        return None  # nearly parallel axes meet nowhere in particular
    point = np.linalg.solve(normal, (projectors @ centres[:, :, None]).sum(axis=0)[:, 0])
    in_front = np.einsum("ij,ij->i", point - centres, axes) > 0
    return point if in_front.mean() > 0.5 else None


def _half_view_tangent(camera) -> float:
    """tan of the smaller half field of view."""
    K = camera.K.numpy()
    return min(camera.width / (2 * K[0, 0]), camera.height / (2 * K[1, 1]))


def _points_around(focus: np.ndarray, cameras: list, count: int,
                   rng: np.random.Generator) -> np.ndarray:
    distances = [np.linalg.norm(c.center.numpy() - focus) for c in cameras]
    radius = float(np.median([d * _half_view_tangent(c) for d, c in zip(distances, cameras)]))
    kept: list[np.ndarray] = []
    for _ in range(100):
        directions = rng.normal(size=(count, 3))
        directions /= np.linalg.norm(directions, axis=1, keepdims=True)
        candidates = focus + directions * radius * rng.uniform(0, 1, (count, 1)) ** (1 / 3)
        kept.append(candidates[_seen_by_any(cameras, candidates)])
        if sum(map(len, kept)) >= count:
            break
    return np.concatenate(kept)[:count]


def _points_in_frusta(cameras: list, count: int, far: float,
                      rng: np.random.Generator) -> np.ndarray:
    """Uniform by volume along random pixels' rays of random cameras, depth up to ``far``."""
    which = rng.integers(0, len(cameras), count)
    points = np.empty((count, 3))
    for i, camera in enumerate(cameras):
        rows = np.flatnonzero(which == i)
        pixels = rng.uniform(0, 1, (len(rows), 2)) * [camera.width, camera.height]
        rays = np.linalg.solve(camera.K.numpy(), np.c_[pixels, np.ones(len(rows))].T).T
        depths = far * rng.uniform(0.001, 1, (len(rows), 1)) ** (1 / 3)
        view = camera.viewmat.numpy()
        points[rows] = (rays * depths - view[:3, 3]) @ view[:3, :3]  # camera to world
    return points


def _seen_by_any(cameras: list, points: np.ndarray) -> np.ndarray:
    seen = np.zeros(len(points), dtype=bool)
    for camera in cameras:
        view = camera.viewmat.numpy()
        p = points @ view[:3, :3].T + view[:3, 3]
        uv = p @ camera.K.numpy().T
        z = p[:, 2]
        with np.errstate(divide="ignore", invalid="ignore"):
            u, v = uv[:, 0] / z, uv[:, 1] / z
        seen |= (z > 0.01) & (u >= 0) & (u < camera.width) & (v >= 0) & (v < camera.height)
    return seen

"""Camera paths for videos of a model: an orbit about the point a capture looked at."""

from __future__ import annotations

import math

import numpy as np
import torch

from splatscale.data.cameras import Camera


def looking_at(position: np.ndarray, target: np.ndarray, up: np.ndarray,
               like: Camera, name: str) -> Camera:
    """A camera with ``like``'s intrinsics and size at ``position``, looking at
    ``target`` with ``up`` up (OpenCV axes: x right, y down, z forward)."""
    forward = target - position
    forward /= np.linalg.norm(forward)
    right = np.cross(forward, up)
    right /= np.linalg.norm(right)
    down = np.cross(forward, right)
    rotation = np.stack([right, down, forward])  # rows: the camera's axes in the world
    return Camera.from_pose(torch.from_numpy(rotation), torch.from_numpy(-rotation @ position),
                            like.K, like.width, like.height, name)


def orbit(start: Camera, pivot: np.ndarray, up: np.ndarray, frames: int) -> list[Camera]:
    """``frames`` views on a full turn about the axis through ``pivot`` along ``up``,
    from ``start``'s position, at its height and distance, each looking at
    ``pivot``, with ``start``'s intrinsics. Refuses a start on the axis itself."""
    up = up / np.linalg.norm(up)
    offset = start.center.double().numpy() - pivot
    height = offset @ up
    across = offset - height * up
    radius = np.linalg.norm(across)
    if radius < 1e-9 * max(float(np.linalg.norm(offset)), 1.0):
        raise ValueError("the path's start lies on its axis")
    first = across / radius
    second = np.cross(up, first)
    cameras = []
    for k in range(frames):
        angle = 2 * math.pi * k / frames
        position = pivot + height * up + radius * (math.cos(angle) * first
                                                   + math.sin(angle) * second)
        cameras.append(looking_at(position, pivot, up, start, f"orbit_{k:04d}"))
    return cameras

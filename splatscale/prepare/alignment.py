"""How far SfM's cameras are from known ones, after the similarity that best aligns
them (SfM fixes a scene only up to scale, rotation and translation)."""

from __future__ import annotations

import numpy as np


def similarity(source: np.ndarray, target: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """Umeyama's (1991) least-squares similarity: ``(s, R, t)`` minimising
    ``sum |target_i - (s R source_i + t)|^2`` over points ``[N, 3]``, R a rotation."""
    mean_source, mean_target = source.mean(axis=0), target.mean(axis=0)
    centred_source, centred_target = source - mean_source, target - mean_target
    covariance = centred_target.T @ centred_source / len(source)
    u, singular, vt = np.linalg.svd(covariance)
    sign = np.eye(3)
    if np.linalg.det(u) * np.linalg.det(vt) < 0:
        sign[2, 2] = -1.0
    rotation = u @ sign @ vt
    scale = float(np.trace(np.diag(singular) @ sign) / (centred_source ** 2).sum(axis=1).mean())
    return scale, rotation, mean_target - scale * rotation @ mean_source


def pose_errors(found: dict[str, tuple[np.ndarray, np.ndarray]],
                known: dict[str, tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Per camera that both name, (rotation error in degrees, centre error in ``known``'s
    units) after aligning ``found`` to ``known``. Each maps a name to (world-to-camera
    rotation [3, 3], camera centre [3])."""
    names = sorted(found.keys() & known.keys())
    scale, rotation, shift = similarity(np.stack([found[n][1] for n in names]),
                                        np.stack([known[n][1] for n in names]))
    angles, distances = [], []
    for name in names:
        found_rotation, found_centre = found[name]
        known_rotation, known_centre = known[name]
        relative = known_rotation @ (found_rotation @ rotation.T).T
        cosine = np.clip((np.trace(relative) - 1.0) / 2.0, -1.0, 1.0)
        angles.append(np.degrees(np.arccos(cosine)))
        distances.append(np.linalg.norm(scale * rotation @ found_centre + shift - known_centre))
    return np.array(angles), np.array(distances)

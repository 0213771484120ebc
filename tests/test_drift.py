"""The drift bound's numba kernel against its torch code (render/drift.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from splatscale.render.drift import candidates_cpu, candidates_torch
from tests.conftest import look_at_camera, orbit_cameras, random_model


def cameras_of(kind: str):
    cameras = orbit_cameras(3, 48, 36, radius=5.0) + [
        look_at_camera([0.2, 0.1, 0.4], [0, 0, 0], 64, 40, focal=50.0)]  # inside the cloud
    if kind == "fisheye":
        return [dataclasses.replace(c, model="fisheye") for c in cameras]
    if kind == "mixed":
        return [dataclasses.replace(c, model="fisheye") if i % 2 else c
                for i, c in enumerate(cameras)]
    return cameras


@pytest.mark.parametrize("kind", ["pinhole", "fisheye", "mixed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_kernel_keeps_what_the_torch_bound_keeps(kind, dtype):
    """Gaussians near and far, in front of and behind the cameras, with no reach, a
    little and a lot: the kernel's verdict is the torch code's, Gaussian by Gaussian."""
    model = random_model(4000, seed=3, spread=8.0, log_scale=(-6.0, 0.5), dtype=dtype)
    generator = torch.Generator().manual_seed(5)
    reach_means = torch.rand(len(model), generator=generator, dtype=torch.float64) ** 4
    reach_scales = 0.5 * torch.rand(len(model), generator=generator, dtype=torch.float64)
    reach_means[::3] = 0.0
    cameras = cameras_of(kind)
    ours = candidates_cpu(model.means, model.log_scales, reach_means, reach_scales, cameras)
    theirs = candidates_torch(model.means, model.log_scales, reach_means, reach_scales, cameras)
    assert 0.05 < theirs.float().mean() < 0.95  # the bound decides, both ways
    assert torch.equal(ours, theirs)

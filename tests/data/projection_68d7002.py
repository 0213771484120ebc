"""Writes projection_68d7002.npz: the pinhole, non-anti-aliased projection of a small
random model (visibility, the splats, their gradients; the torch reference's too), as
the code computed them at commit 68d7002, before fisheye cameras and anti-aliased
splats. tests/test_projection.py checks that today's code gives them bit for bit.

Run in a checkout of that commit, from its root:
    PYTHONPATH=. python tests/data/projection_68d7002.py projection_68d7002.npz
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from splatscale.model.gaussians import GaussianModel
from splatscale.render import project
from splatscale.render.projection import _ewa_pairs, visibility_cpu, visibility_torch
from splatscale.render.splats import camera_tensors
from tests.conftest import look_at_camera, orbit_cameras, random_model


def weights_like(t: torch.Tensor, k: int) -> torch.Tensor:
    return torch.sin(torch.arange(t.numel(), dtype=torch.float64) * 0.37 + k).reshape(
        t.shape).to(t.dtype)


def outputs(model: GaussianModel, cameras: list) -> dict:
    parameters = list(model.parameters().values())
    found: dict = {}
    for name, seen in (("vis_kernel", visibility_cpu(model, cameras)),
                       ("vis_torch", visibility_torch(model, cameras))):
        found[f"{name}/0"], found[f"{name}/1"] = seen.radii, seen.visible
    splats = project(model, cameras)
    columns = [splats.means2d, splats.conics, splats.depths, splats.colors, splats.opacities]
    for k, column in enumerate(columns + [splats.radii, splats.camera_ids, splats.gaussian_ids]):
        found[f"splats/{k}"] = column
    weights = [weights_like(c, k) for k, c in enumerate(columns)]
    grads = torch.autograd.grad(sum((c * w).sum() for c, w in zip(columns, weights)), parameters)
    found.update({f"splat_grads/{k}": g for k, g in enumerate(grads)})
    viewmats, Ks, sizes = camera_tensors(cameras, model.means)
    c, g = splats.camera_ids, splats.gaussian_ids
    reference = _ewa_pairs(*(t[g] for t in parameters[:3]), viewmats[c], Ks[c], sizes[c])[:3]
    found.update({f"ewa_torch/{k}": t for k, t in enumerate(reference)})
    grads = torch.autograd.grad(sum((o * w).sum() for o, w in zip(reference, weights[:3])),
                                parameters[:3])
    found.update({f"ewa_torch_grads/{k}": t for k, t in enumerate(grads)})
    return found


def main(path: str) -> None:
    model = random_model(60, seed=9, spread=3.0, log_scale=(-1.5, 0.3), sh_degree=1)
    with torch.no_grad():
        model.opacity_logits[::7] = -6.0  # below 1/255: culled whatever the box
    cameras = orbit_cameras(2, 27, 21, radius=3.0) + [
        look_at_camera([0.3, 0.2, 3.0], [0, 0, 0], 19, 17, 18.0)]
    arrays = {f"inputs/params/{n}": t for n, t in model.parameters().items()}
    arrays["inputs/viewmats"] = torch.stack([c.viewmat for c in cameras])
    arrays["inputs/Ks"] = torch.stack([c.K for c in cameras])
    for i, camera in enumerate(cameras):
        arrays[f"inputs/sizes/{i}/0"] = torch.tensor(camera.width)
        arrays[f"inputs/sizes/{i}/1"] = torch.tensor(camera.height)
    for dtype in (torch.float64, torch.float32):
        trial = model.to(dtype).requires_grad_(True)
        arrays.update({f"{dtype}/{k}": t for k, t in outputs(trial, cameras).items()})
    np.savez_compressed(path, **{k: t.detach().numpy() for k, t in arrays.items()})


if __name__ == "__main__":
    main(sys.argv[1])

"""gsplat 1.5.3's pure-torch projection as the reference of the projection tests, and a
brute-force render built on it: every splat the reference's rule keeps, at every pixel,
in float64."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import Tensor

from splatscale.data.cameras import Camera
from splatscale.model.gaussians import GaussianModel
from tests.conftest import gsplat_kernel_boxes
from tests.test_composite import brute_force_composite

gsplat_torch = pytest.importorskip("gsplat.cuda._torch_impl",
                                   reason="gsplat==1.5.3 (test extra) is the reference")


@dataclass
class Reference:
    """Every (camera, Gaussian) pair [C, N, ...] as gsplat's torch functions project it,
    with its CUDA kernel's visibility rule (``gsplat_kernel_boxes``) and its gradient of
    the compensations (``cuda_gradient``)."""

    means2d: Tensor
    conics: Tensor
    depths: Tensor
    opacities: Tensor       # times the compensation, for an anti-aliased model
    compensations: Tensor | None
    box: Tensor             # unrounded half-extents
    visible: Tensor


def cuda_gradient(compensations: Tensor) -> Tensor:
    """The compensations, their gradient that of gsplat's CUDA kernel (add_blur_vjp):
    it divides by compensation + 1e-6 where the exact derivative divides by the
    compensation, so it is the exact one times comp / (comp + 1e-6)."""
    factor = (compensations / (compensations + 1e-6)).detach()
    return compensations.detach() + (compensations - compensations.detach()) * factor


def gsplat_projection(model: GaussianModel, cameras: list[Camera]) -> Reference:
    """``model`` through ``cameras`` (one size, one camera model), differentiable."""
    covars, _ = gsplat_torch._quat_scale_to_covar_preci(model.quats, model.scales,
                                                        compute_preci=False)
    width, height = cameras[0].width, cameras[0].height
    radii, means2d, depths, conics, compensations = gsplat_torch._fully_fused_projection(
        model.means, covars, torch.stack([c.viewmat for c in cameras]),
        torch.stack([c.K for c in cameras]), width, height,
        calc_compensations=model.antialiased, camera_model=cameras[0].model)
    opacities = model.opacities.expand(len(cameras), -1)
    if compensations is not None:
        compensations = cuda_gradient(compensations)
        opacities = opacities * compensations
    box, visible = gsplat_kernel_boxes(radii, means2d.detach(), conics.detach(),
                                       opacities.detach(), width, height)
    return Reference(means2d, conics, depths, opacities, compensations, box, visible)


def brute_force_render(model: GaussianModel, camera: Camera,
                       background: Tensor) -> tuple[Tensor, Tensor]:
    """rgb [H, W, 3] and alpha [H, W] of every splat gsplat's rule keeps, each at every
    pixel, nearest first; differentiable."""
    ref = gsplat_projection(model, [camera])
    keep = ref.visible[0]
    dirs = model.means[keep] - camera.center.to(model.means)
    colors = torch.clamp_min(gsplat_torch._spherical_harmonics(model.sh_degree, dirs,
                                                               model.sh[keep]) + 0.5, 0.0)
    return brute_force_composite(ref.means2d[0][keep], ref.conics[0][keep], colors,
                                 ref.opacities[0][keep], background, ref.depths[0][keep],
                                 camera.width, camera.height)

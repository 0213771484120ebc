"""Real spherical harmonics up to degree 3, with the 3DGS constants and signs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from splatscale.model.gaussians import SH_C0

SH_C1 = 0.4886025119029199
SH_C2 = (1.0925484305920792, -1.0925484305920792, 0.31539156525252005,
         -1.0925484305920792, 0.5462742152960396)
SH_C3 = (-0.5900435899266435, 2.890611442640554, -0.4570457994644658,
         0.3731763325901154, -0.4570457994644658, 1.445305721320277,
         -0.5900435899266435)


def sh_basis(degree: int, dirs: Tensor) -> Tensor:
    """The (degree + 1)^2 basis functions at unit directions ``dirs`` [..., 3]."""
    x, y, z = dirs.unbind(-1)
    basis = [torch.full_like(x, SH_C0)]
    if degree >= 1:
        basis += [-SH_C1 * y, SH_C1 * z, -SH_C1 * x]
    if degree >= 2:
        xx, yy, zz, xy, yz, xz = x * x, y * y, z * z, x * y, y * z, x * z
        basis += [SH_C2[0] * xy, SH_C2[1] * yz, SH_C2[2] * (2 * zz - xx - yy),
                  SH_C2[3] * xz, SH_C2[4] * (xx - yy)]
    if degree >= 3:
        basis += [SH_C3[0] * y * (3 * xx - yy), SH_C3[1] * xy * z,
                  SH_C3[2] * y * (4 * zz - xx - yy), SH_C3[3] * z * (2 * zz - 3 * xx - 3 * yy),
                  SH_C3[4] * x * (4 * zz - xx - yy), SH_C3[5] * z * (xx - yy),
                  SH_C3[6] * x * (xx - 3 * yy)]
    return torch.stack(basis, dim=-1)


def sh_to_color(coeffs: Tensor, view_dirs: Tensor | None) -> Tensor:
    """RGB of SH ``coeffs`` [..., K, 3] seen along ``view_dirs`` [..., 3].

    The degree follows from K = (degree + 1)^2; degree 0 needs no directions.
    As in 3DGS the result is offset by 0.5 and clamped at 0.
    """
    degree = round(coeffs.shape[-2] ** 0.5) - 1
    if (degree + 1) ** 2 != coeffs.shape[-2]:
        raise ValueError(f"SH coefficient count {coeffs.shape[-2]} is not a square")
    if degree == 0:
        raw = SH_C0 * coeffs[..., 0, :]
    else:
        if view_dirs is None:
            raise ValueError(f"SH degree {degree} needs view directions")
        basis = sh_basis(degree, F.normalize(view_dirs, dim=-1))
        raw = (basis[..., :, None] * coeffs).sum(dim=-2)
    return torch.clamp_min(raw + 0.5, 0.0)

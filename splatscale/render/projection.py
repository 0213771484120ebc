"""Stage 1 of the renderer: EWA projection of Gaussians into a batch of cameras.

``project`` and ``visibility`` run the backend of the tensors' device
(``splatscale.backends``). The cpu backend's are here: numba kernels
(``projection_kernels``, ``sh_kernels``), with plain differentiable torch as their
reference; the torch visibility test serves devices without those kernels.
Visibility is decided once for every (camera, Gaussian) pair without autograd;
the differentiable quantities are then computed for the visible pairs only, so
nothing invalid enters the graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch
from torch import Tensor

from splatscale.data.cameras import Camera
from splatscale.model.gaussians import GaussianModel, sh_rest, sigmoid
from splatscale.render.conventions import (ALPHA_MIN, EPS2D, FAR_PLANE, FISHEYE_EPS,
                                           FRUSTUM_CLAMP, NEAR_PLANE, RADIUS_SIGMAS)
from splatscale.backends import Backend, backend_for
from splatscale.render import projection_kernels, sh_kernels
from splatscale.render.dense_gradients import empty_like
from splatscale.render.sh import sh_to_color
from splatscale.render.splats import (Splats, camera_centres, camera_offsets, camera_tensors,
                                     fisheye_or_none)


def quat_to_rotmat(quats: Tensor) -> Tensor:
    """Rotation matrices [..., 3, 3] of quaternions wxyz (normalised here)."""
    w, x, y, z = torch.nn.functional.normalize(quats, dim=-1).unbind(-1)
    rows = [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
            2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
            2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]
    return torch.stack(rows, dim=-1).reshape(quats.shape[:-1] + (3, 3))


def covariance_factor(quats: Tensor, scales: Tensor) -> Tensor:
    """M = R S, [..., 3, 3]: the world covariance is M M^T."""
    return quat_to_rotmat(quats) * scales[..., None, :]


@dataclass
class _Projected:
    means2d: Tensor
    cov2d: Tensor      # [..., 3] (xx, xy, yy) with eps2d added
    depths: Tensor
    # Anti-aliased splats' opacity factor, sqrt(det cov2d before eps2d / det after),
    # where asked for (gsplat's compensations); None otherwise.
    compensations: Tensor | None = None


# Products with 3x3 matrices are spelled out: on CPU, batched 3x3 matmuls and
# reductions over a dimension of size 3 cost several times more.

def _row_times(row: Tensor, matrix: Tensor) -> Tensor:
    """row [..., 3] times matrix [..., 3, 3]."""
    return (row[..., 0:1] * matrix[..., 0, :] + row[..., 1:2] * matrix[..., 1, :]
            + row[..., 2:3] * matrix[..., 2, :])


def _matrix_times(matrix: Tensor, vector: Tensor) -> Tensor:
    """matrix [..., 3, 3] times vector [..., 3]."""
    return (matrix[..., :, 0] * vector[..., 0:1] + matrix[..., :, 1] * vector[..., 1:2]
            + matrix[..., :, 2] * vector[..., 2:3])


def _dot3(a: Tensor, b: Tensor) -> Tensor:
    return a[..., 0] * b[..., 0] + a[..., 1] * b[..., 1] + a[..., 2] * b[..., 2]


def _pinhole(x: Tensor, y: Tensor, z: Tensor, rotation: Tensor, Ks: Tensor,
             sizes: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """means2d and the rows of J W of camera-space points through pinhole cameras."""
    fx, fy, cx, cy = Ks[..., 0, 0], Ks[..., 1, 1], Ks[..., 0, 2], Ks[..., 1, 2]
    width, height = sizes[..., 0], sizes[..., 1]
    # Clamp to 1.3x the frustum (gsplat's limits) so the Jacobian stays sane far off-image.
    margin = FRUSTUM_CLAMP - 1.0
    lim_x_pos = (width - cx) / fx + margin * 0.5 * width / fx
    lim_x_neg = cx / fx + margin * 0.5 * width / fx
    lim_y_pos = (height - cy) / fy + margin * 0.5 * height / fy
    lim_y_neg = cy / fy + margin * 0.5 * height / fy
    tx = z * torch.maximum(torch.minimum(x / z, lim_x_pos), -lim_x_neg)
    ty = z * torch.maximum(torch.minimum(y / z, lim_y_pos), -lim_y_neg)
    # J = [[fx/z, 0, -fx tx/z^2], [0, fy/z, -fy ty/z^2]]; rows of J W:
    jw0 = ((fx / z)[..., None] * rotation[..., 0, :]
           - (fx * tx / (z * z))[..., None] * rotation[..., 2, :])
    jw1 = ((fy / z)[..., None] * rotation[..., 1, :]
           - (fy * ty / (z * z))[..., None] * rotation[..., 2, :])
    return torch.stack([fx * x / z + cx, fy * y / z + cy], dim=-1), jw0, jw1


def _fisheye(x: Tensor, y: Tensor, z: Tensor, rotation: Tensor,
             Ks: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """means2d and the rows of J W of camera-space points through fisheye cameras: the
    equidistant projection r = f theta and its Jacobian, as gsplat's ``_fisheye_proj``
    (no frustum clamp; its eps in |(x, y)|, z and x^2)."""
    fx, fy, cx, cy = Ks[..., 0, 0], Ks[..., 1, 1], Ks[..., 0, 2], Ks[..., 1, 2]
    xy_len = torch.sqrt(x * x + y * y) + FISHEYE_EPS
    theta = torch.atan2(xy_len, z + FISHEYE_EPS)
    means2d = torch.stack([x * fx * theta / xy_len + cx, y * fy * theta / xy_len + cy], dim=-1)
    x2, y2, xy = x * x + FISHEYE_EPS, y * y, x * y
    x2y2 = x2 + y2
    x2y2z2_inv = 1.0 / (x2y2 + z * z)
    b = torch.atan2(xy_len, z) / xy_len / x2y2
    a = z * x2y2z2_inv / x2y2
    rows = ((fx * (x2 * a + y2 * b), fx * xy * (a - b), -fx * x * x2y2z2_inv),
            (fy * xy * (a - b), fy * (y2 * a + x2 * b), -fy * y * x2y2z2_inv))
    jw0, jw1 = (j0[..., None] * rotation[..., 0, :] + j1[..., None] * rotation[..., 1, :]
                + j2[..., None] * rotation[..., 2, :] for j0, j1, j2 in rows)
    return means2d, jw0, jw1


def _project_pairs(means: Tensor, factors: Tensor, viewmats: Tensor, Ks: Tensor,
                   sizes: Tensor, antialiased: bool = False,
                   fisheye: Tensor | None = None) -> _Projected:
    """EWA projection, elementwise over broadcastable leading dimensions; with
    ``antialiased``, the compensations too. ``fisheye`` (bool, broadcastable to the
    pairs) marks the pairs of fisheye cameras; None: every camera is a pinhole.

    The 2D covariance J W M (J W M)^T is formed from its 2x3 factor J W M
    (W the camera rotation, M = R S), which costs less than J W M M^T W^T J^T.
    """
    rotation, translation = viewmats[..., :3, :3], viewmats[..., :3, 3]
    x, y, z = (_matrix_times(rotation, means) + translation).unbind(-1)
    means2d, jw0, jw1 = _pinhole(x, y, z, rotation, Ks, sizes)
    if fisheye is not None:
        wide = fisheye[..., None]
        means2d, jw0, jw1 = (torch.where(wide, theirs, ours) for theirs, ours in
                             zip(_fisheye(x, y, z, rotation, Ks), (means2d, jw0, jw1)))
    b0, b1 = _row_times(jw0, factors), _row_times(jw1, factors)
    xx, xy, yy = _dot3(b0, b0), _dot3(b0, b1), _dot3(b1, b1)
    cov2d = torch.stack([xx + EPS2D, xy, yy + EPS2D], dim=-1)
    compensations = None
    if antialiased:
        dilated_det = (xx + EPS2D) * (yy + EPS2D) - xy * xy
        compensations = torch.sqrt(torch.clamp((xx * yy - xy * xy) / dilated_det, min=0.0))
    return _Projected(means2d, cov2d, z, compensations)


def box_sigmas(opacities: Tensor) -> Tensor:
    """Half-extent of a splat's box in sigmas: min(3.33, sqrt(2 ln(255 opacity))).

    Beyond it opacity exp(-sigma) < 1/255, so no pixel outside the box takes
    the splat (gsplat's opacity-aware box); below opacity 1/255 it is culled.
    """
    return torch.sqrt(2 * torch.log(opacities.clamp_min(ALPHA_MIN) / ALPHA_MIN)).clamp_max(
        RADIUS_SIGMAS)


def _radii_and_visibility(proj: _Projected, opacities: Tensor,
                          sizes: Tensor) -> tuple[Tensor, Tensor]:
    """The box and the test of ``proj``'s pairs. An anti-aliased splat is drawn with
    opacity times its compensation, so its box and the opacity cull take that product
    (as gsplat's packed kernel does)."""
    if proj.compensations is not None:
        opacities = opacities * proj.compensations
    cxx, cxy, cyy = proj.cov2d.unbind(-1)
    det = cxx * cyy - cxy * cxy
    sigmas = box_sigmas(opacities)
    radii = torch.stack([torch.ceil(sigmas * torch.sqrt(cxx)),
                         torch.ceil(sigmas * torch.sqrt(cyy))], dim=-1)
    mx, my = proj.means2d.unbind(-1)
    rx, ry = radii.unbind(-1)
    visible = ((det > 0) & (proj.depths > NEAR_PLANE) & (proj.depths < FAR_PLANE)
               & (opacities >= ALPHA_MIN) & ((rx > 0) | (ry > 0))
               & (mx + rx > 0) & (mx - rx < sizes[..., 0])
               & (my + ry > 0) & (my - ry < sizes[..., 1]))
    return torch.nan_to_num(radii).to(torch.int32), visible


@dataclass
class Visibility:
    """Of every (camera, Gaussian) pair: the box's radii [C, N, 2] and whether the
    pair passes the visibility test [C, N]."""

    radii: Tensor
    visible: Tensor

    def of_gaussians(self, rows: Tensor) -> "Visibility":
        return Visibility(self.radii[:, rows], self.visible[:, rows])


def _ewa_pairs(means: Tensor, quats: Tensor, log_scales: Tensor, viewmats: Tensor, Ks: Tensor,
               sizes: Tensor, antialiased: bool = False, fisheye: Tensor | None = None
               ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """means2d, conics, depths and (``antialiased``; else None) compensations of pairs,
    in torch: the reference of ``_EwaPairs`` (``fisheye`` [pairs] bool, or None for
    pinholes only)."""
    factors = covariance_factor(quats, torch.exp(log_scales))
    proj = _project_pairs(means, factors, viewmats, Ks, sizes, antialiased, fisheye)
    cxx, cxy, cyy = proj.cov2d.unbind(-1)
    det = cxx * cyy - cxy * cxy
    return (proj.means2d, torch.stack([cyy / det, -cxy / det, cxx / det], dim=-1), proj.depths,
            proj.compensations)


class _EwaPairs(torch.autograd.Function):
    """``_ewa_pairs`` of the pairs (gaussian_ids, camera_ids), by numba kernels: one
    pass over the pairs each way, only the inputs saved. ``fisheye``: the cameras with
    the equidistant projection, as ``fisheye_or_none``. Pre: at least one camera, and
    the pairs camera by camera, Gaussians ascending within a camera (``visible_pairs``'
    order): the backward writes its gradients, unset before, by that order."""

    @staticmethod
    def forward(ctx, means, quats, log_scales, gaussian_ids, camera_ids, viewmats, Ks, sizes,
                fisheye, antialiased):
        count, dtype = len(gaussian_ids), means.dtype
        means2d, conics = torch.empty(count, 2, dtype=dtype), torch.empty(count, 3, dtype=dtype)
        depths = torch.empty(count, dtype=dtype)
        compensations = torch.empty(count if antialiased else 0, dtype=dtype)
        inputs = [t.detach().contiguous() for t in (means, quats, log_scales, gaussian_ids,
                                                    camera_ids, viewmats, Ks, sizes)]
        projection_kernels.project_forward(*(t.numpy() for t in inputs), _numpy_or_none(fisheye),
                                           antialiased, means2d.numpy(), conics.numpy(),
                                           depths.numpy(), compensations.numpy())
        ctx.save_for_backward(*inputs)
        ctx.fisheye, ctx.antialiased = fisheye, antialiased
        return means2d, conics, depths, compensations if antialiased else None

    @staticmethod
    def backward(ctx, v_means2d, v_conics, v_depths, v_compensations):
        means, quats, log_scales, gaussian_ids, camera_ids, viewmats, Ks, sizes = (
            ctx.saved_tensors)
        pairs = len(gaussian_ids)
        zero = torch.zeros((), dtype=means.dtype)
        grads = [(g if g is not None else zero.expand(shape)).contiguous().numpy()
                 for g, shape in ((v_means2d, (pairs, 2)), (v_conics, (pairs, 3)),
                                  (v_depths, (pairs,)),
                                  (v_compensations, (pairs if ctx.antialiased else 0,)))]
        v_means, v_quats, v_log_scales = (empty_like(t) for t in (means, quats, log_scales))
        projection_kernels.project_backward(
            means.numpy(), quats.numpy(), log_scales.numpy(), gaussian_ids.numpy(),
            camera_offsets(camera_ids, len(viewmats)).numpy(), viewmats.numpy(), Ks.numpy(),
            sizes.numpy(), _numpy_or_none(ctx.fisheye), ctx.antialiased, *grads, v_means.numpy(),
            v_quats.numpy(), v_log_scales.numpy())
        return v_means, v_quats, v_log_scales, None, None, None, None, None, None, None


def _numpy_or_none(t: Tensor | None):
    return None if t is None else t.contiguous().numpy()


def _sh_colors(means: Tensor, sh0: Tensor, shN: Tensor, gaussian_ids: Tensor,
               camera_ids: Tensor, centres: Tensor, degree: int) -> Tensor:
    """Colours of pairs in torch: the reference of ``_ShColors``."""
    used = sh_rest(degree)
    coeffs = torch.cat([sh0.index_select(0, gaussian_ids),
                        shN[:, :used].index_select(0, gaussian_ids)], dim=1)
    view_dirs = None
    if degree > 0:
        view_dirs = means.index_select(0, gaussian_ids) - centres.index_select(0, camera_ids)
    return sh_to_color(coeffs, view_dirs)


class _ShColors(torch.autograd.Function):
    """``_sh_colors`` by numba kernels: one pass over the pairs each way, the inputs and
    where the clamp at 0 held each colour saved. Pre: as ``_EwaPairs``'."""

    @staticmethod
    def forward(ctx, means, sh0, shN, gaussian_ids, camera_ids, centres, degree):
        if shN.shape[1] < sh_rest(degree):  # the kernels read that many, unchecked
            raise ValueError(f"SH degree {degree} needs {sh_rest(degree)} coefficients of "
                             f"shN, the model holds {shN.shape[1]}")
        colors = torch.empty(len(gaussian_ids), 3, dtype=means.dtype)
        clamped = torch.empty(len(gaussian_ids), 3, dtype=torch.bool)
        inputs = [t.detach().contiguous() for t in (means, sh0, shN, gaussian_ids, camera_ids,
                                                    centres)]
        arrays = [t.numpy() for t in inputs]
        sh_kernels.sh_forward(*arrays[:3], degree, *arrays[3:], colors.numpy(), clamped.numpy())
        ctx.save_for_backward(*inputs, clamped)
        ctx.degree = degree
        return colors

    @staticmethod
    def backward(ctx, v_colors):
        means, sh0, shN, gaussian_ids, camera_ids, centres, clamped = ctx.saved_tensors
        # Degree 0 has no direction and uses no coefficient of shN: the kernel writes
        # neither gradient, and none is returned (empty arrays in their place). Adam
        # then knows shN's gradient is zero without a pass over it (``GaussianAdam``).
        directed = ctx.degree > 0
        grads = [empty_like(means) if directed else means.new_empty((0, 3)), empty_like(sh0),
                 empty_like(shN) if directed else shN.new_empty((0, *shN.shape[1:]))]
        sh_kernels.sh_backward(means.numpy(), sh0.numpy(), shN.numpy(), ctx.degree,
                               gaussian_ids.numpy(),
                               camera_offsets(camera_ids, len(centres)).numpy(),
                               centres.numpy(), v_colors.contiguous().numpy(),
                               clamped.numpy(), *(g.numpy() for g in grads))
        if not directed:
            return None, grads[1], None, None, None, None, None
        return grads[0], grads[1], grads[2], None, None, None, None


class Geometry(Protocol):
    """What ``visibility`` reads of the Gaussians (a ``GaussianModel`` has it)."""

    means: Tensor
    quats: Tensor
    log_scales: Tensor
    opacity_logits: Tensor
    antialiased: bool


def visibility(model: Geometry, cameras: Sequence[Camera]) -> Visibility:
    """Which Gaussians each camera keeps: ``project``'s test, without projecting, by
    the backend of the model's device."""
    return backend_for(model.means.device).visibility(model, list(cameras))


def _geometry_tensors(model: Geometry, cameras: list[Camera]
                      ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    viewmats, Ks, sizes = camera_tensors(cameras, model.means)
    return (model.means, model.quats, model.log_scales, model.opacity_logits, viewmats, Ks,
            sizes)


@torch.no_grad()
def visibility_cpu(model: Geometry, cameras: list[Camera]) -> Visibility:
    """``visibility`` by the numba kernel (CPU tensors)."""
    return _visibility_kernel(*_geometry_tensors(model, cameras),
                              fisheye=fisheye_or_none(cameras, model.means.device),
                              antialiased=model.antialiased)


@torch.no_grad()
def visibility_torch(model: Geometry, cameras: list[Camera]) -> Visibility:
    """``visibility`` in torch operations, on any device: every pair projected at once."""
    return _visibility_torch(*_geometry_tensors(model, cameras),
                             fisheye=fisheye_or_none(cameras, model.means.device),
                             antialiased=model.antialiased)


def _visibility_torch(means: Tensor, quats: Tensor, log_scales: Tensor, opacity_logits: Tensor,
                      viewmats: Tensor, Ks: Tensor, sizes: Tensor, fisheye: Tensor | None = None,
                      antialiased: bool = False) -> Visibility:
    """``fisheye`` [C] bool, or None for pinholes only."""
    factors = covariance_factor(quats, torch.exp(log_scales))
    dense = _project_pairs(means[None], factors[None], viewmats[:, None], Ks[:, None],
                           sizes[:, None], antialiased,
                           None if fisheye is None else fisheye[:, None])
    return Visibility(*_radii_and_visibility(dense, sigmoid(opacity_logits),
                                             sizes[:, None]))


def _visibility_kernel(*tensors: Tensor, fisheye: Tensor | None = None,
                       antialiased: bool = False) -> Visibility:
    """``fisheye`` [C] bool, or None for pinholes only."""
    cameras, count = len(tensors[4]), len(tensors[0])
    radii = torch.empty(cameras, count, 2, dtype=torch.int32)
    visible = torch.empty(cameras, count, dtype=torch.bool)
    projection_kernels.visibility(*(t.detach().contiguous().numpy() for t in tensors),
                                  _numpy_or_none(fisheye), antialiased, radii.numpy(),
                                  visible.numpy())
    return Visibility(radii, visible)


def project(model: GaussianModel, cameras: Sequence[Camera] | Camera,
            seen: Visibility | None = None, backend: Backend | None = None) -> Splats:
    """Project every Gaussian of ``model`` into every camera; keep the visible pairs
    (``seen``, when the caller has already run the test on this model; the cuda
    backend decides visibility inside its kernel and does not need it). ``backend``
    None: the backend of the model's device."""
    if isinstance(cameras, Camera):
        cameras = [cameras]
    backend = backend or backend_for(model.means.device)
    return backend.project(model, list(cameras), seen)


def project_cpu(model: GaussianModel, cameras: list[Camera],
                seen: Visibility | None) -> Splats:
    """``project`` by the numba kernels (CPU tensors)."""
    viewmats, Ks, sizes = camera_tensors(cameras, model.means)
    seen = seen or visibility_cpu(model, cameras)
    radii, visible = seen.radii, seen.visible
    camera_ids, gaussian_ids = (torch.from_numpy(ids) for ids in
                                projection_kernels.visible_pairs(visible.contiguous().numpy()))
    offsets = camera_offsets(camera_ids, len(cameras)).tolist()
    # The differentiable pass sees only the visible pairs, so its cost (forward and
    # backward) follows what is on screen, not the size of the model.
    means2d, conics, depths, compensations = _EwaPairs.apply(
        model.means, model.quats, model.log_scales, gaussian_ids, camera_ids, viewmats, Ks,
        sizes, fisheye_or_none(cameras, model.means.device), model.antialiased)
    colors = _ShColors.apply(model.means, model.sh0, model.shN, gaussian_ids, camera_ids,
                             camera_centres(viewmats), model.sh_degree)
    opacities = sigmoid(model.opacity_logits.index_select(0, gaussian_ids))
    if compensations is not None:
        opacities = opacities * compensations
    # Rows of the radii taken at once: indexing by the two ids costs several times more.
    pair_radii = radii.reshape(-1, 2).index_select(
        0, gaussian_ids.add(camera_ids, alpha=radii.shape[1]))
    return Splats(camera_ids, gaussian_ids, means2d, conics, depths, pair_radii, colors, opacities,
                  model.keys.index_select(0, gaussian_ids), offsets, cameras)

"""GaussianModel: the raw parameters of a 3DGS scene and their activations."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor

MAX_SH_DEGREE = 3
SH_REST = (MAX_SH_DEGREE + 1) ** 2 - 1
SH_C0 = 0.28209479177387814  # the degree-0 basis function: colour = SH_C0 * sh0 + 0.5


def sh_rest(degree: int) -> int:
    """How many coefficients of ``shN`` SH of ``degree`` uses (all but sh0's)."""
    return (degree + 1) ** 2 - 1


HELD_REST = tuple(sh_rest(degree) for degree in range(MAX_SH_DEGREE + 1))


class _Sigmoid(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor) -> Tensor:
        values = torch.reciprocal(torch.exp(-logits) + 1)
        ctx.save_for_backward(values)
        return values

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        values, = ctx.saved_tensors
        return grad * (1 - values) * values  # torch's sigmoid_backward, term by term


def sigmoid(logits: Tensor) -> Tensor:
    """1 / (1 + exp(-logits)), each element rounded alike wherever it is stored.
    torch.sigmoid's CPU loop rounds the elements past its last full vector otherwise
    than the rest, which made a float32 result depend on the storage order."""
    return _Sigmoid.apply(logits)


@dataclass(init=False)
class GaussianModel:
    """Struct of per-Gaussian tensors, stored as the optimiser sees them.

    means [N,3]; quats [N,4] wxyz, unnormalised; log_scales [N,3];
    opacity_logits [N]; sh0 [N,1,3]; shN [N,K,3], K = ``sh_rest(d)`` of a degree d
    from ``sh_degree`` to 3 (0, 3, 8 or 15). ``sh_degree`` is the degree in use
    (0..3); coefficients of higher degrees, where held, are kept but ignored.

    ``keys`` [N] int64 name each Gaussian whatever its storage position (default
    0..N-1): they travel with it through densification and between ranks, and
    decide what storage order must not (depth ties, the samples of a split).

    ``antialiased``: the model is rendered with gsplat's anti-aliased splats (each
    splat's opacity times sqrt(det cov2d / det(cov2d + eps2d I)), the compensation
    for the 2D dilation), as it was trained; it travels with the model.
    """

    means: Tensor
    quats: Tensor
    log_scales: Tensor
    opacity_logits: Tensor
    sh0: Tensor
    shN: Tensor
    sh_degree: int
    keys: Tensor
    antialiased: bool

    PARAMETERS = ("means", "quats", "log_scales", "opacity_logits", "sh0", "shN")

    # Written out, not the dataclass's, so that ``keys`` may be omitted (or None) here
    # while every model has them.
    def __init__(self, means: Tensor, quats: Tensor, log_scales: Tensor,
                 opacity_logits: Tensor, sh0: Tensor, shN: Tensor,
                 sh_degree: int = MAX_SH_DEGREE, keys: Tensor | None = None,
                 antialiased: bool = False) -> None:
        self.means, self.quats, self.log_scales = means, quats, log_scales
        self.opacity_logits, self.sh0, self.shN = opacity_logits, sh0, shN
        self.sh_degree = sh_degree
        self.antialiased = antialiased
        n = self.means.shape[0]
        if not 0 <= self.sh_degree <= MAX_SH_DEGREE:
            raise ValueError(f"sh_degree must be in 0..{MAX_SH_DEGREE}, got {self.sh_degree}")
        held = shN.shape[1] if shN.dim() == 3 else -1
        widths = [k for k in HELD_REST if k >= sh_rest(self.sh_degree)]
        expected = {"means": (n, 3), "quats": (n, 4), "log_scales": (n, 3),
                    "opacity_logits": (n,), "sh0": (n, 1, 3),
                    "shN": (n, held if held in widths else SH_REST, 3)}
        for name, shape in expected.items():
            got = tuple(getattr(self, name).shape)
            if got != shape:
                wanted = (f"({n}, K, 3), K one of {widths} at SH degree {self.sh_degree}"
                          if name == "shN" else str(shape))
                raise ValueError(f"GaussianModel.{name} has shape {got}, expected {wanted}")
        self.keys = torch.arange(n, device=self.means.device) if keys is None else keys
        if tuple(self.keys.shape) != (n,) or self.keys.dtype != torch.int64:
            raise ValueError(f"GaussianModel.keys must be int64 of shape ({n},)")

    def __len__(self) -> int:
        return self.means.shape[0]

    @property
    def scales(self) -> Tensor:
        return torch.exp(self.log_scales)

    @property
    def opacities(self) -> Tensor:
        return sigmoid(self.opacity_logits)

    @property
    def rotations(self) -> Tensor:
        """Unit quaternions, wxyz."""
        return F.normalize(self.quats, dim=-1)

    @property
    def sh(self) -> Tensor:
        """The coefficients in use, [N, (sh_degree + 1)^2, 3]."""
        return torch.cat([self.sh0, self.shN[:, :sh_rest(self.sh_degree)]], dim=1)

    def non_finite_rows(self) -> Tensor:
        """Indices of the Gaussians with a NaN or infinite parameter."""
        bad = torch.zeros(len(self), dtype=torch.bool, device=self.means.device)
        for tensor in self.parameters().values():
            finite = torch.isfinite(tensor.detach()).reshape(len(self), math.prod(tensor.shape[1:]))
            bad |= ~finite.all(dim=1)
        return bad.nonzero()[:, 0]

    def parameters(self) -> dict[str, Tensor]:
        return {name: getattr(self, name) for name in self.PARAMETERS}

    def set_parameters(self, params: dict[str, Tensor]) -> None:
        """Take ``params`` (all or some of the parameters) as this model's tensors."""
        for name, tensor in params.items():
            setattr(self, name, tensor)

    def to(self, dtype: torch.dtype | None = None,
           device: torch.device | str | None = None) -> GaussianModel:
        moved = {name: t.to(dtype=dtype, device=device) for name, t in self.parameters().items()}
        return GaussianModel(**moved, sh_degree=self.sh_degree, keys=self.keys.to(device=device),
                             antialiased=self.antialiased)

    def requires_grad_(self, flag: bool = True) -> "GaussianModel":
        for tensor in self.parameters().values():
            tensor.requires_grad_(flag)
        return self

    def detach(self) -> "GaussianModel":
        return GaussianModel(**{n: t.detach().clone() for n, t in self.parameters().items()},
                             sh_degree=self.sh_degree, keys=self.keys.clone(),
                             antialiased=self.antialiased)

    def rows(self, index: Tensor | slice) -> "GaussianModel":
        """The Gaussians at ``index`` (indices, a mask or a slice), copied, with their keys."""
        return GaussianModel(**{n: t.detach()[index].clone() for n, t in self.parameters().items()},
                             sh_degree=self.sh_degree, keys=self.keys[index].clone(),
                             antialiased=self.antialiased)


def concatenated(parts: Iterable[GaussianModel], sh_degree: int) -> GaussianModel:
    """One model, copied, of consecutive ``parts`` (as ``Engine.model_parts`` yields them),
    at ``sh_degree``."""
    parts = [part.detach() for part in parts]
    if not parts:
        raise ValueError("concatenated: no parts")
    joined = {name: torch.cat([getattr(p, name) for p in parts])
              for name in GaussianModel.PARAMETERS}
    return GaussianModel(**joined, sh_degree=sh_degree,
                         keys=torch.cat([p.keys for p in parts]),
                         antialiased=parts[0].antialiased)

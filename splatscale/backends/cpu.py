"""The cpu backend: numba kernels throughout, and the host's own memory.

The renderer's kernels are ``render/``'s (projection, SH, binning,
compositing), the loss's and SSIM's fused passes and the densification statistic's
sums ``step/``'s, and Adam's step ``step/adam_kernels.py``'s, each beside its torch
reference. The device is host memory: nothing is copied, and work is done when its
call returns.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from splatscale.backends import Backend
from splatscale.render.drift import candidates_cpu
from splatscale.render.projection import project_cpu, visibility_cpu
from splatscale.render.rasterize import composite_cpu
from splatscale.step import adam_kernels
from splatscale.step.loss import abs_difference_sum_cpu, squared_error_sum_cpu
from splatscale.step.ssim import ssim_cpu
from splatscale.step.view_norms import add_view_norms_cpu


def adam_step(param: Tensor, m: Tensor, v: Tensor, grad: Tensor, scale: float,
              root_bias2: float, beta1: float, beta2: float, eps: float) -> None:
    """``adam_kernels.adam_step``, its scalars in the tensors' precision."""
    arrays = [x.numpy() for x in (param, m, v, grad)]
    dtype = arrays[0].dtype
    adam_kernels.adam_step(*arrays, dtype.type(scale), dtype.type(root_bias2),
                           adam_kernels.adam_constants(beta1, beta2, eps, dtype))


def pixels_as_float(pixels: Tensor, dtype: torch.dtype) -> Tensor:
    return pixels.to(dtype) / 255.0


def free_memory(device: torch.device) -> int:
    """The host memory no process holds, not counting what the kernel would give back
    from its caches."""
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def synchronize(device: torch.device) -> None:
    """Nothing to wait for: the CPU's work is done when its call returns."""


BACKEND = Backend(
    name="cpu", project=project_cpu, visibility=visibility_cpu, candidates=candidates_cpu,
    composite=composite_cpu,
    abs_difference_sum=abs_difference_sum_cpu, squared_error_sum=squared_error_sum_cpu,
    ssim=ssim_cpu, add_view_norms=add_view_norms_cpu, adam_step=adam_step,
    pixels_as_float=pixels_as_float,
    shares_host_memory=True, gathers_seen_rows=True, free_memory=free_memory,
    synchronize=synchronize, streams=None)

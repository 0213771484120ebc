"""What differs by device: one ``Backend`` per device type, chosen once from the device.

Everything whose code depends on where the tensors are goes through a backend:
the renderer's two stages, the loss's kernels, Adam's step, turning pixels into
floats, and the device's memory, queues and clock. The rest of the code asks
``backend_for(device)`` (or is handed a backend) and never tests a device type.

A backend is a ``Backend`` record of functions, made by one module per device
type (``cpu.py``: numba kernels; ``cuda.py``: gsplat's kernels and torch). This
module is the contract and the registry only: it imports no other splatscale
module, so every layer may ask for a backend, while the backends themselves sit
above the renderer and the step code they assemble. A backend module is imported
the first time its device is asked for. Adding a device is one module that makes
its ``BACKEND``, and one entry in ``BACKENDS``.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Any, Callable, ContextManager

import torch
from torch import Tensor


@dataclass(frozen=True)
class Streams:
    """A device's queues, which run behind the host: what the offload engine overlaps
    its copies with (``engine/offload/transfers.py``). Streams and events have
    ``torch.cuda.Stream``'s and ``torch.cuda.Event``'s methods (``wait_event``,
    ``record``, ``synchronize``, ``elapsed_time`` in milliseconds), and a tensor
    made on one stream is handed to another by ``Tensor.record_stream``."""

    new: Callable[[torch.device], Any]           # a stream of its own on the device
    current: Callable[[torch.device], Any]       # the stream work is queued on now
    using: Callable[[Any], ContextManager]       # work queued inside goes to the stream
    event: Callable[[bool], Any]                 # a new event; True: it can be timed


@dataclass(frozen=True)
class Backend:
    """The device-dependent functions, for tensors on one type of device.

    The renderer (the types are ``render``'s and ``data``'s, layers above this one):

    - ``project(model, cameras, seen) -> Splats``: ``render.project`` of a
      ``GaussianModel`` into a list of ``Camera``; ``seen``, the ``Visibility``
      the caller has already taken of this model, or None.
    - ``visibility(geometry, cameras) -> Visibility``: ``project``'s visibility test
      of every (camera, Gaussian) pair, without autograd.
    - ``candidates(means, log_scales, reach_means, reach_scales, cameras) -> Tensor``:
      bool [N], the Gaussians that may pass that test in some camera when their
      means and log-scales may have drifted within the reaches [N]
      (``render/drift.py``).
    - ``composite(splats, background, width, rows, depth) -> (rgb, depth_sum, alpha)``:
      one camera's splats composited into rows ``[y0, y1)``: rgb [h, W, 3] over
      ``background``, the alpha-weighted depth sum [h, W] (None unless ``depth``) and
      alpha [h, W]; differentiable, and where ``splats.absgrad`` is not None its
      gradient is the sum over the band's pixels of each pixel's |d loss / d means2d|,
      x and y apart.

    The loss, of [h, W, 3] images:

    - ``abs_difference_sum(image, target) -> Tensor``: sum |image - target|, its
      gradient in ``image`` the signs;
    - ``squared_error_sum(image, target) -> float``: sum (clamp(image, 0, 1) -
      target)^2, accumulated in float64 (PSNR's);
    - ``ssim(image, target, rows, count, weights) -> Tensor``: the SSIM map summed over
      rows ``[r0, r1)`` (each pixel's values times its weight in ``weights`` [h, W], or
      None: 1) and divided by ``count``, differentiable in ``image``.

    The rest:

    - ``add_view_norms(sums, counts, rows, grads, scale)``: the densification
      statistic's sums, sums[rows[i]] += |grads[i] * scale| and counts[rows[i]] += 1
      (``step/view_norms.py``), the norms taken on the gradients' device;
    - ``adam_step(param, m, v, grad, scale, root_bias2, beta1, beta2, eps)``: one
      Adam step of flat tensors, in place (``step/adam_kernels.py``'s formula);
    - ``pixels_as_float(pixels, dtype) -> Tensor``: uint8 pixels as ``dtype`` in
      [0, 1], equal on every device to the host's division by 255;
    - ``shares_host_memory``: the device's tensors are host memory, so a host
      tensor is used where it is, never copied or kept apart;
    - ``gathers_seen_rows``: a resident engine renders from the rows its views see,
      gathered, where a whole-model gradient would cost more than the gather (on
      the CPU: faulting in, filling and reading gradient buffers of every row; a
      GPU's projection culls inside its kernels);
    - ``free_memory(device) -> int``: the bytes free on the device now;
    - ``synchronize(device)``: the host waits for all work queued on the device;
    - ``streams``: the device's queues, None where it has none (work is done when
      the call that asks for it returns).
    """

    name: str
    project: Callable[..., Any]
    visibility: Callable[..., Any]
    candidates: Callable[..., Tensor]
    composite: Callable[..., tuple[Tensor, Tensor | None, Tensor]]
    abs_difference_sum: Callable[[Tensor, Tensor], Tensor]
    squared_error_sum: Callable[[Tensor, Tensor], float]
    ssim: Callable[[Tensor, Tensor, tuple[int, int], int, Tensor | None], Tensor]
    add_view_norms: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], None]
    adam_step: Callable[[Tensor, Tensor, Tensor, Tensor, float, float, float, float, float],
                        None]
    pixels_as_float: Callable[[Tensor, torch.dtype], Tensor]
    shares_host_memory: bool
    gathers_seen_rows: bool
    free_memory: Callable[[torch.device], int]
    synchronize: Callable[[torch.device], None]
    streams: Streams | None


# Each device type's backend: the module whose ``BACKEND`` it is.
BACKENDS = {"cpu": "splatscale.backends.cpu", "cuda": "splatscale.backends.cuda"}


@functools.cache  # asked on every step's hot path: the module is looked up once
def backend_named(name: str) -> Backend:
    """The backend registered as ``name`` (a device type: "cpu", "cuda")."""
    if name not in BACKENDS:
        raise ValueError(f"no backend named {name!r}: the backends are "
                         f"{', '.join(BACKENDS)}")
    backend: Backend = importlib.import_module(BACKENDS[name]).BACKEND
    return backend


def backend_for(device: str | torch.device) -> Backend:
    """The backend of ``device``'s type ("cuda:1" is the cuda backend's)."""
    kind = torch.device(device).type
    if kind not in BACKENDS:
        raise ValueError(f"no backend for device {str(device)!r}: the backends are "
                         f"{', '.join(BACKENDS)}")
    return backend_named(kind)

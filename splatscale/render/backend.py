"""Which backend renders: the cpu backend (numba kernels) or the cuda backend
(gsplat's kernels). By default the tensors' device decides; a caller may name
one (the tests run the cuda backend's own code on the CPU that way)."""

from __future__ import annotations

from typing import Literal

from torch import Tensor

Backend = Literal["cpu", "cuda"]
BACKENDS: tuple[Backend, ...] = ("cpu", "cuda")


def backend_for(tensor: Tensor, backend: Backend | None = None) -> Backend:
    """``backend`` when given, else the backend of ``tensor``'s device."""
    if backend is not None:
        if backend not in BACKENDS:
            raise ValueError(f"unknown render backend {backend!r}: one of {BACKENDS}")
        return backend
    return "cuda" if tensor.device.type == "cuda" else "cpu"

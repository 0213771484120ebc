"""The densification statistic's sums: the norm of each view-space gradient added to
the row of its Gaussian, and the view counted there (3DGS's ``xyz_gradient_accum``
and ``denom``).

``add_view_norms`` is the backend's (``splatscale.backends``): torch's operations
on a GPU (a norm and two scattered additions, three passes), and on the CPU one
pass of a numba kernel over the view's splats. The kernel takes each norm as
torch's vectorised CPU norm does, sqrt(fma(y, y, x x)), so that both add the same
values; the tests hold them to a float64 reference.
"""

from __future__ import annotations

import numba as nb
import numpy as np
import torch
from numba.extending import intrinsic
from torch import Tensor

CHUNK = 4096  # splats per parallel task


def add_view_norms_torch(sums: Tensor, counts: Tensor, rows: Tensor, grads: Tensor,
                         scale: Tensor) -> None:
    """sums[rows[i]] += |grads[i] * scale| (the norm on the gradients' device) and
    counts[rows[i]] += 1, for ``rows`` [P] each at most once, ``grads`` [P, 2] and
    ``scale`` [2]; ``sums`` and ``counts`` may be on another device."""
    norms = (grads * scale).norm(dim=-1)
    rows = rows.to(sums.device)
    sums.index_add_(0, rows, norms.to(sums))
    counts.index_add_(0, rows, torch.ones_like(norms, dtype=counts.dtype, device=counts.device))


def add_view_norms_cpu(sums: Tensor, counts: Tensor, rows: Tensor, grads: Tensor,
                       scale: Tensor) -> None:
    """``add_view_norms_torch`` by the numba kernel (every tensor on the CPU)."""
    _add_view_norms(sums.numpy(), counts.numpy(), rows.contiguous().numpy(),
                    grads.detach().contiguous().numpy(), scale.to(grads.dtype).numpy())


@intrinsic
def _fused_multiply_add(typingctx, a, b, c):
    """a b + c rounded once (LLVM's fma: the CPU's instruction, or libm's where it has
    none)."""
    if not a == b == c:
        return None

    def codegen(context, builder, signature, args):
        return builder.fma(*args)

    return a(a, b, c), codegen


@nb.njit(parallel=True, cache=True)
def _add_view_norms(sums, counts, rows, grads, scale):  # pragma: no cover - compiled
    """``add_view_norms_torch``'s sums; no two splats share a row, so the tasks never
    write the same one."""
    count = rows.shape[0]
    for chunk in nb.prange((count + CHUNK - 1) // CHUNK):
        for i in range(chunk * CHUNK, min(count, (chunk + 1) * CHUNK)):
            x, y = grads[i, 0] * scale[0], grads[i, 1] * scale[1]
            row = rows[i]
            sums[row] += np.sqrt(_fused_multiply_add(y, y, x * x))
            counts[row] += 1

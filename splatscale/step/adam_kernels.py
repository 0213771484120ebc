"""Adam's update, row by row, as numba kernels (in the arrays' own precision).

``adam_step`` is the dense step every engine takes: every row, one step, in
place. ``adam_replay`` brings chosen rows forward over several steps, the last
one with a gradient and the others without, and writes them elsewhere (the
offload engine's deferred rows). Both run the same per-row code,
``_one_step``, so a row replayed later rounds exactly as it would have rounded
stepped at once: the engines agree bit for bit, in float32 too.

One step, with ``scale = -lr / (1 - beta1^t)`` and ``root_bias2 = sqrt(1 - beta2^t)``
(``torch.optim.Adam``'s formula)::

    m <- m + (1 - beta1) (g - m)
    v <- beta2 v + (1 - beta2) g g
    p <- p + scale m / (sqrt(v) / root_bias2 + eps)
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange


@numba.njit(inline="always")
def _one_step(p, m, v, g, scale, root_bias2, constants):  # pragma: no cover - compiled
    one_minus_beta1, beta2, one_minus_beta2, eps = constants[0], constants[1], constants[2], \
        constants[3]
    for c in range(p.shape[0]):
        m[c] = m[c] + one_minus_beta1 * (g[c] - m[c])
        v[c] = v[c] * beta2 + one_minus_beta2 * g[c] * g[c]
        p[c] = p[c] + scale * m[c] / (np.sqrt(v[c]) / root_bias2 + eps)


@numba.njit(parallel=True, nogil=True, cache=True)
def adam_step(param, m, v, grad, scale, root_bias2, constants):  # pragma: no cover - compiled
    """One step of every row of [N, C] arrays, in place."""
    for r in prange(param.shape[0]):
        _one_step(param[r], m[r], v[r], grad[r], scale, root_bias2, constants)


@numba.njit(parallel=True, nogil=True, cache=True)
def adam_replay(param, m, v, rows, since, grad, until, stepped, scale, root_bias2, constants,
                out_param, out_m, out_v):  # pragma: no cover - compiled
    """Rows ``rows`` of [N, C] arrays taken from step ``since[i]`` to step ``until``
    into ``out_*[i]``: the steps ``s`` with ``stepped[s]``, each with its own
    ``scale[s]`` and ``root_bias2[s]``; gradient ``grad[i]`` at step ``until``,
    zero before. The inputs are only read."""
    zeros = np.zeros(param.shape[1], param.dtype)
    for i in prange(rows.shape[0]):
        r = rows[i]
        p, mm, vv = out_param[i], out_m[i], out_v[i]
        p[:], mm[:], vv[:] = param[r], m[r], v[r]
        for s in range(since[i] + 1, until + 1):
            if stepped[s]:
                g = grad[i] if s == until else zeros
                _one_step(p, mm, vv, g, scale[s], root_bias2[s], constants)


def adam_constants(beta1: float, beta2: float, eps: float, dtype: np.dtype) -> np.ndarray:
    """The kernels' per-run constants, rounded to ``dtype`` as torch rounds a scalar."""
    return np.array([1 - beta1, beta2, 1 - beta2, eps], dtype=dtype)

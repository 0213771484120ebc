"""Adam's update, row by row, as numba kernels (in the arrays' own precision).

``adam_step`` is the dense step every engine takes: every element of a
parameter group, one step, in place. ``adam_replay`` brings chosen rows forward
over several steps, the last one with a gradient and the others without, and
writes them elsewhere (the offload engine's deferred rows). Both run the same
per-element code, ``_moved``, so a row replayed later rounds exactly as it
would have rounded stepped at once: the engines agree bit for bit, in float32
too.

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
def _moved(p, m, v, g, scale, root_bias2, constants):  # pragma: no cover - compiled
    """One element after one step: (p, m, v)."""
    m = m + constants[0] * (g - m)
    v = v * constants[1] + constants[2] * g * g
    return p + scale * m / (np.sqrt(v) / root_bias2 + constants[3]), m, v


@numba.njit(parallel=True, nogil=True, cache=True)
def adam_step(param, m, v, grad, scale, root_bias2, constants):  # pragma: no cover - compiled
    """One step of every element of flat arrays, in place: one pass, which LLVM
    vectorises (a [N, C] loop of rows does not, with C of 1 to 45)."""
    for i in prange(param.shape[0]):
        param[i], m[i], v[i] = _moved(param[i], m[i], v[i], grad[i], scale, root_bias2,
                                      constants)


@numba.njit(parallel=True, nogil=True, cache=True)
def adam_replay(param, m, v, rows, since, grad, until, stepped, scale, root_bias2, constants,
                out_param, out_m, out_v, targets):  # pragma: no cover - compiled
    """Rows ``rows`` of [N, C] arrays taken from step ``since[i]`` to step ``until``
    into ``out_*[targets[i]]``: the steps ``s`` with ``stepped[s]``, each with its own
    ``scale[s]`` and ``root_bias2[s]``; gradient ``grad[i]`` at step ``until``, zero
    before. In place when the outputs are the inputs and ``targets`` is ``rows``."""
    zero = constants[4]
    for i in prange(rows.shape[0]):
        r, t = rows[i], targets[i]
        if since[i] == until - 1 and stepped[until]:  # the common case: one step, vectorised
            for c in range(param.shape[1]):
                out_param[t, c], out_m[t, c], out_v[t, c] = _moved(
                    param[r, c], m[r, c], v[r, c], grad[i, c], scale[until], root_bias2[until],
                    constants)
            continue
        for c in range(param.shape[1]):
            p, mm, vv = param[r, c], m[r, c], v[r, c]
            for s in range(since[i] + 1, until):
                if stepped[s]:
                    p, mm, vv = _moved(p, mm, vv, zero, scale[s], root_bias2[s], constants)
            if since[i] < until and stepped[until]:
                p, mm, vv = _moved(p, mm, vv, grad[i, c], scale[until], root_bias2[until],
                                   constants)
            out_param[t, c], out_m[t, c], out_v[t, c] = p, mm, vv


def adam_constants(beta1: float, beta2: float, eps: float, dtype: np.dtype) -> np.ndarray:
    """The kernels' per-run constants, rounded to ``dtype`` as torch rounds a scalar."""
    return np.array([1 - beta1, beta2, 1 - beta2, eps, 0.0], dtype=dtype)

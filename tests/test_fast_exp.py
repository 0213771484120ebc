"""The float32 polynomial exp of the compositing kernels against float64 exp."""

import numba as nb
import numpy as np

from splatscale.render.cpu_kernels import SIGMA_CAP, _exp_neg


@nb.njit(fastmath=True)
def _apply(sigmas, out):
    for i in range(sigmas.shape[0]):
        out[i] = _exp_neg(sigmas[i])


def test_fast_exp_relative_error_is_float32_rounding():
    sigmas = np.linspace(0.0, SIGMA_CAP, 200_001, dtype=np.float32)
    out = np.empty_like(sigmas)
    _apply(sigmas, out)
    exact = np.exp(-sigmas.astype(np.float64))
    assert np.max(np.abs(out - exact) / exact) < 2e-7


def test_float64_exp_is_exact():
    sigmas = np.linspace(0.0, 30.0, 1001)
    out = np.empty_like(sigmas)
    _apply(sigmas, out)
    np.testing.assert_array_equal(out, np.exp(-sigmas))

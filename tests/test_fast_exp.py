"""The exp of the compositing kernels: float32 polynomial, float64 libm.

What each promises: the float32 polynomial is within float32 rounding of the
true exp; the float64 path is a correctly rounded-or-nearly exp (libm's, within
1 ulp), not bitwise any particular library's. numpy's ``np.exp`` is a different
implementation (vectorised on AVX-512 hosts, where it differs from libm by one
ulp on some inputs), so it is compared to within 1 ulp, never bitwise.
"""

import math

import numba as nb
import numpy as np

from splatscale.render.compositing_kernels import SIGMA_CAP, _exp_neg


@nb.njit(fastmath=True)
def _apply(sigmas, out):
    for i in range(sigmas.shape[0]):
        out[i] = _exp_neg(sigmas[i])


def test_fast_exp_relative_error_is_float32_rounding():
    sigmas = np.linspace(0.0, SIGMA_CAP, 200_001, dtype=np.float32)
    out = np.empty_like(sigmas)
    _apply(sigmas, out)
    exact = np.array([math.exp(-float(s)) for s in sigmas])
    assert np.max(np.abs(out - exact) / exact) < 2e-7


def test_float64_exp_is_within_one_ulp_of_exp():
    sigmas = np.linspace(0.0, 30.0, 1001)
    out = np.empty_like(sigmas)
    _apply(sigmas, out)
    np.testing.assert_array_max_ulp(out, np.exp(-sigmas), maxulp=1)
    np.testing.assert_array_max_ulp(out, np.array([math.exp(-s) for s in sigmas]), maxulp=1)

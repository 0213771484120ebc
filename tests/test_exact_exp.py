"""The projection's float32 exp (render/exact_exp.py): glibc's expf, bit for bit, on the
vector units.

Where the C library is glibc on an x86 core with FMA, the kernels' exp must return
what numba's ``math.exp`` (a call of that ``expf``) returns, for every float32: the
projection then computes what it did with the calls. Everywhere, it must be within
one ulp of exp in float64, rounded.
"""

from __future__ import annotations

import math
import platform
from pathlib import Path

import numba as nb
import numpy as np
import pytest

from splatscale.render.exact_exp import OVERFLOW, UNDERFLOW, exp, expf

STRIDE = 5  # of the 2^32 bit patterns, every fifth: each exponent, sign and table entry


def _glibc_fma_expf() -> bool:
    """Whether numba's float32 ``math.exp`` is glibc's ``__expf_fma`` (chosen at load
    time where the core has FMA and AVX2)."""
    libc, version = platform.libc_ver()
    cpuinfo = Path("/proc/cpuinfo")
    flags = cpuinfo.read_text().split() if cpuinfo.exists() else []
    # With Intel's SVML installed, numba would vectorise the test's own math.exp to it.
    return (libc == "glibc" and tuple(map(int, version.split(".")[:2])) >= (2, 28)
            and platform.machine() == "x86_64" and "fma" in flags and "avx2" in flags
            and not nb.config.USING_SVML)


@nb.njit(parallel=True)
def _mismatches_in(xs):
    count = 0
    for i in nb.prange(xs.shape[0]):
        ours, theirs = expf(xs[i]), math.exp(xs[i])
        same = (ours == theirs and math.copysign(1.0, ours) == math.copysign(1.0, theirs)
                or (ours != ours and theirs != theirs))
        count += 0 if same else 1
    return count


def _mismatches(start: int, stop: int, stride: int) -> int:
    """How many float32s with bit patterns in range(start, stop, stride) ``expf`` and
    ``math.exp`` answer differently (a NaN equals a NaN; signed zeros differ)."""
    block = stride << 24
    return sum(_mismatches_in(np.arange(lo, min(lo + block, stop), stride,
                                        dtype=np.uint32).view(np.float32))
               for lo in range(start, stop, block))


@nb.njit
def _exps(xs, out):
    for i in range(xs.shape[0]):
        out[i] = exp(xs[i])


@pytest.mark.skipif(not _glibc_fma_expf(), reason="the C library's expf is not glibc's FMA one")
def test_expf_is_the_c_librarys_for_every_fifth_float32():
    assert _mismatches(0, 1 << 32, STRIDE) == 0


@pytest.mark.skipif(not _glibc_fma_expf(), reason="the C library's expf is not glibc's FMA one")
def test_expf_is_the_c_librarys_around_its_limits():
    """Every float32 near 0, the overflow and the underflow limit, and the infinities."""
    centres = [0.0, -0.0, OVERFLOW, UNDERFLOW, np.inf, -np.inf, 88.0, -88.0]
    for centre in np.array(centres, np.float32).view(np.uint32):
        assert _mismatches(max(int(centre) - 4096, 0), min(int(centre) + 4096, 1 << 32), 1) == 0


def test_exp_is_within_one_ulp_of_the_float64_exp_rounded():
    xs = np.random.default_rng(0).uniform(-103.0, 88.7, 1_000_000).astype(np.float32)
    xs = np.concatenate([xs, np.array([0.0, -0.0, 1e-30, -1e-30, OVERFLOW, UNDERFLOW],
                                      np.float32)])
    ours = np.empty_like(xs)
    _exps(xs, ours)
    reference = np.exp(xs.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_max_ulp(ours, reference, maxulp=1)


def test_exp_of_the_limits_and_of_nan():
    xs = np.array([np.inf, -np.inf, np.nan, 89.0, -104.0], np.float32)
    ours = np.empty_like(xs)
    _exps(xs, ours)
    assert ours[0] == np.inf and ours[1] == 0.0 and np.isnan(ours[2])
    assert ours[3] == np.inf and ours[4] == 0.0


def test_exp_of_a_float64_is_maths():
    xs = np.linspace(-50.0, 50.0, 1001)
    ours = np.empty_like(xs)
    _exps(xs, ours)
    assert np.array_equal(ours, [math.exp(x) for x in xs])

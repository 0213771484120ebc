"""exp of float32 values as glibc computes it, in operations LLVM vectorises.

The projection and visibility kernels take the exponential of each Gaussian's three
log-scales and its opacity logit. numba calls the C library's ``expf`` for each one:
a call keeps a lane loop off the vector units and spills the vector registers
around it. ``exp`` computes, for float32, what glibc's ``expf`` computes on an x86
core with FMA (its ``__expf_fma``: Szabolcs Nagy's algorithm of ARM's optimized
routines, a 32-entry table of 2^(i/32) and a cubic in double precision), operation
for operation with the same fused multiply-adds, so a kernel returns the same bits
either way (``tests/test_exact_exp.py`` compares every float32). Where the C library
computes otherwise (another libc, or a core without FMA) it is still that algorithm:
error below 0.502 ulp. float64 takes ``math.exp``.

numba's cache checks only the source file of a cached kernel: after an edit here, a
kernel that calls ``exp`` is compiled afresh only once its cache is cleared.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload


@intrinsic
def _fma(typingctx, a, b, c):
    """a b + c rounded once (LLVM's fma: one instruction on a core with FMA)."""

    def codegen(context, builder, signature, args):
        double = ir.DoubleType()
        fma = builder.module.declare_intrinsic(
            "llvm.fma", [double], ir.FunctionType(double, [double, double, double]))
        return builder.call(fma, args)

    return types.float64(types.float64, types.float64, types.float64), codegen


@intrinsic
def _bits(typingctx, x):
    """The float64 x's bits as an int64."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return types.int64(types.float64), codegen


@intrinsic
def _from_bits(typingctx, n):
    """The float64 whose bits are the int64 n."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen


def _double(bits: int) -> float:
    return float(np.array([bits], np.uint64).view(np.float64)[0])


# glibc's __exp2f_data: 2^(i/32) as bits, less i << 47 (added back from the result's k).
TABLE = np.array([
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
    0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
    0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
    0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
], np.uint64).view(np.int64)
INV_LN2_N = _double(0x40471547652b82fe)  # 32 / ln 2
SHIFT = _double(0x4338000000000000)  # 1.5 2^52: adding it rounds to an integer
C0, C1, C2 = (_double(b) for b in (0x3ebc6af84b912394, 0x3f2ebfce50fac4f3, 0x3f962e42ff0c52d6))
OVERFLOW = np.float32(float.fromhex("0x1.62e42ep6"))  # above: inf
UNDERFLOW = np.float32(-float.fromhex("0x1.9fe368p6"))  # below: 0


@nb.njit
def expf(x):  # pragma: no cover - compiled
    """exp of the float32 x, as a float32: glibc's ``__expf_fma``, its branches to the
    overflow and underflow results as selects."""
    xd = np.float64(x)
    # x = (k + r) ln 2 / 32, k an integer (in the low bits of shifted), |r| <= 1/2
    shifted = _fma(INV_LN2_N, xd, SHIFT)
    k = _bits(shifted)
    r = _fma(INV_LN2_N, xd, -(shifted - SHIFT))
    scale = _from_bits(TABLE[k & 31] + (k << 47))  # 2^(k/32)
    y = _fma(_fma(r, C0, C1), r * r, _fma(r, C2, 1.0))  # 2^(r/32)
    result = np.float32(y * scale)
    result = np.float32(np.inf) if x > OVERFLOW else result
    return np.float32(0.0) if x < UNDERFLOW else result


def exp(x):
    """exp(x): ``expf`` for a float32, else ``math.exp``."""
    return math.exp(x)


@overload(exp)
def _exp_overload(x):
    if x == types.float32:
        return lambda x: expf(x)
    return lambda x: math.exp(x)

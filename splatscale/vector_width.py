"""The compiled kernels' vector width on x86 cores with AVX-512.

LLVM tunes code for Intel's AVX-512 cores to 256-bit vectors (its ``prefer-256-bit``),
because the early ones lowered their clock under 512-bit work. The compositing kernels
evaluate a block's pixels 16 float32 lanes at a time and run markedly faster in
512-bit vectors (docs/benchmarks.md has the figures). So on a host with AVX-512,
numba compiles for the host's own features less that preference. A target named in
numba's own variables (NUMBA_CPU_NAME, NUMBA_CPU_FEATURES) wins.

numba reads its target once, before it compiles or loads its first kernel, so this
runs when splatscale is imported. The features travel in NUMBA_CPU_FEATURES to the
processes splatscale starts on this machine (ranks, the compile helper), which then
compile and cache for the same target.
"""

from __future__ import annotations

import os
import platform
import sys

WITHOUT_PREFERENCE = "-prefer-256-bit"
# The features this process put in NUMBA_CPU_FEATURES, if it did: a process it starts
# that runs other code (an older checkout, for a benchmark) should not inherit them.
chosen: str | None = None


def prefer_full_vectors() -> None:
    """Ask numba for the host's features without ``prefer-256-bit`` where the host has
    AVX-512, unless NUMBA_CPU_NAME or NUMBA_CPU_FEATURES is set."""
    if "NUMBA_CPU_NAME" in os.environ or "NUMBA_CPU_FEATURES" in os.environ:
        return
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return
    features = full_vector_features()
    if features is None:
        return
    global chosen
    os.environ["NUMBA_CPU_FEATURES"] = chosen = features
    config = sys.modules.get("numba.core.config")
    if config is not None:  # numba was imported first: its configuration is read already
        # numba makes its options module globals at run time, so its types lack them
        setattr(config, "CPU_FEATURES", features)


def full_vector_features() -> str | None:
    """The host's LLVM features without ``prefer-256-bit``, or None where the host has
    no AVX-512 or LLVM cannot tell its features."""
    import llvmlite.binding as llvm

    try:
        features = llvm.get_host_cpu_features()
    except RuntimeError:  # LLVM knows no way to ask this host
        return None
    if not features.get("avx512f", False):
        return None
    return f"{features.flatten()},{WITHOUT_PREFERENCE}"

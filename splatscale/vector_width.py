"""The compiled kernels' vector width on x86 cores with AVX-512.

LLVM tunes code for Intel's AVX-512 cores to 256-bit vectors (its ``prefer-256-bit``),
because the early ones lowered their clock under 512-bit work. The compositing kernels
evaluate a block's pixels 16 float32 lanes at a time and run markedly faster in
512-bit vectors (docs/benchmarks.md has the figures). So on a host with AVX-512,
numba compiles for the host's own features less that preference. A target named in
numba's environment variables (NUMBA_CPU_NAME, NUMBA_CPU_FEATURES, NUMBA_ENABLE_AVX)
wins.

numba reads its target once, when it makes its CPU target (at the first kernel
decorated), so this runs when splatscale is imported. The features travel in
NUMBA_CPU_FEATURES to the processes splatscale starts (ranks, the compile helper), so
they compile and cache for the same target; ``CHOSEN`` beside it marks them as
splatscale's, which a process recomputes for its own host (a job's environment may
be forwarded to another machine) and a benchmark's older checkout drops.
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Mapping

from splatscale.numba_config import set_read_option

WITHOUT_PREFERENCE = "-prefer-256-bit"
CHOSEN = "SPLATSCALE_NUMBA_CPU_FEATURES"  # the NUMBA_CPU_FEATURES splatscale chose
USERS_TARGET = ("NUMBA_CPU_NAME", "NUMBA_ENABLE_AVX")


def prefer_full_vectors() -> None:
    """Ask numba for this host's features without ``prefer-256-bit`` where the host has
    AVX-512 (else numba's own target), unless the user named a target or numba has
    made its target already."""
    if any(name in os.environ for name in USERS_TARGET) or _target_made():
        return
    if "NUMBA_CPU_FEATURES" in os.environ and not chosen_by_splatscale(os.environ):
        return
    # Elsewhere LLVM is not loaded to ask: there is no AVX-512.
    on_x86 = platform.machine().lower() in ("x86_64", "amd64")
    features = full_vector_features() if on_x86 else None
    if features is None:
        os.environ.pop("NUMBA_CPU_FEATURES", None)
        os.environ.pop(CHOSEN, None)
    else:
        os.environ["NUMBA_CPU_FEATURES"] = os.environ[CHOSEN] = features
    set_read_option("CPU_FEATURES", features)


def chosen_by_splatscale(environment: Mapping[str, str]) -> bool:
    """Whether NUMBA_CPU_FEATURES in ``environment`` is splatscale's choice, not the
    user's."""
    features = environment.get("NUMBA_CPU_FEATURES")
    return features is not None and features == environment.get(CHOSEN)


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


def _target_made() -> bool:
    """Whether numba has made its CPU target (a kernel was decorated before splatscale
    was imported): it keeps the features it was made with, and so do we."""
    registry = sys.modules.get("numba.core.registry")
    return registry is not None and "_toplevel_target_context" in vars(registry.cpu_target)

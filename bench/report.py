"""How the benchmarks print their result: one JSON line, with the CPU threading and
target that produced it (numba's layer and LLVM's tuning differ by machine, and with
them the speed). It reads numba alone, so that ``bench/train.py --baseline`` runs it
with older splatscales."""

from __future__ import annotations

import json
import os

import llvmlite.binding as llvm
import numba


def emit(result: dict) -> None:
    """Prints ``result`` with this process' threading and target, unless ``result``
    says which its figures were measured with (in other processes)."""
    try:
        layer = numba.threading_layer()
    except ValueError:  # no parallel kernel ran
        layer = "none"
    print(json.dumps({**result, "threading_layer": result.get("threading_layer", layer),
                      "numba_threads": result.get("numba_threads", numba.get_num_threads()),
                      "cpu_target": result.get("cpu_target", cpu_target())}))


def cpu_target() -> str:
    """The CPU numba compiles for in this process, with "-prefer-256-bit" where its
    256-bit preference is dropped (``splatscale/vector_width.py``), or "NUMBA_CPU_FEATURES"
    where other features are named."""
    name = numba.config.CPU_NAME or llvm.get_host_cpu_name()
    features = numba.config.CPU_FEATURES
    if features is None:
        return name
    named = "-prefer-256-bit" if "-prefer-256-bit" in features else "NUMBA_CPU_FEATURES"
    return f"{name} {named}"


def commands_target() -> str:
    """What the splatscale commands a benchmark starts compile for: splatscale's choice
    (``splatscale/vector_width.py``), unless numba's variables name a target."""
    named = [n for n in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "NUMBA_ENABLE_AVX")
             if n in os.environ]
    return " ".join(named) or "splatscale's choice"

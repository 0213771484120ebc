"""The CPU kernels a benchmark's Trainer calls, compiled before its first step as
``splatscale train`` compiles them: in child processes, where numba's cache lacks them.

A kernel a process compiles for itself rounds otherwise, in its last bits, than one
loaded from the cache (``splatscale/backends/cpu_compile.py``): a benchmark that
let its first step compile would, on an empty cache, train another model than the
same command trains later, and count the compile in its rate."""

from __future__ import annotations

import sys


def compiled_for(trainer) -> None:
    """Every kernel ``trainer``'s steps call is in the cache when this returns, but
    those whose compile failed apart (said on stderr: the run compiles them itself)."""
    try:
        from splatscale.backends.cpu_compile import (compiling, kernels_cached,
                                                     missing_variants)
    except ImportError:  # a splatscale from before (``--baseline``): its steps compile
        return
    failed: list[str] = []
    if not kernels_cached():
        with compiling() as first_compile:
            failed = first_compile()
    fisheye = any(view.camera.model == "fisheye" for view in trainer.scene.views)
    with compiling(missing_variants(trainer.strategy.absgrad, fisheye)) as variants:
        failed += variants()
    if failed:
        print(f"bench: the compile of {', '.join(failed)} failed apart: the run compiles "
              "it, and may round otherwise than later runs", file=sys.stderr)

"""How the benchmarks print their result: one JSON line, with the CPU threading that
produced it (numba's layer differs by machine, and with it the speed). It reads
numba alone, so that ``bench/train.py --baseline`` runs it with older splatscales."""

from __future__ import annotations

import json

import numba


def emit(result: dict) -> None:
    """Prints ``result`` with this process' threading, unless ``result`` says which
    threading its figures were measured with (in other processes)."""
    try:
        layer = numba.threading_layer()
    except ValueError:  # no parallel kernel ran
        layer = "none"
    print(json.dumps({**result, "threading_layer": result.get("threading_layer", layer),
                      "numba_threads": result.get("numba_threads", numba.get_num_threads())}))

"""How the benchmarks print their result: one JSON line, with the CPU threading that
produced it (numba's layer differs by machine, and with it the speed)."""

from __future__ import annotations

import json

import numba

from splatscale.threads import threading_layer


def emit(result: dict) -> None:
    print(json.dumps({**result, "threading_layer": threading_layer(),
                      "numba_threads": numba.get_num_threads()}))

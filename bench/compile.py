"""A first run's compile: seconds of a short training run with numba's cache empty,
then again with it full; prints one JSON line.

``splatscale train tests/data/snowmiku --iterations 20 --resolution 4`` is run
``--repeat`` times with an empty cache folder of its own (``NUMBA_CACHE_DIR``) and
once more on the last one's full cache; ``cold_seconds`` are the wall-clock
seconds of each cold run, ``warm_seconds`` the warm run's. ``--baseline DIR``
(a checkout of an earlier splatscale) measures that code first, the same way.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from report import emit

ROOT = Path(__file__).resolve().parents[1]


def timed_run(code: Path, cache: Path, output: Path) -> float:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), PYTHONPATH=str(code))
    command = [sys.executable, "-m", "splatscale", "train", str(ROOT / "tests/data/snowmiku"),
               "--iterations", "20", "--resolution", "4", "--quiet", "--output", str(output)]
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, cwd=code)
    return round(time.perf_counter() - start, 1)


def measure(code: Path, repeat: int) -> dict:
    cold = []
    with tempfile.TemporaryDirectory() as folder:
        for i in range(repeat):
            cache = Path(folder) / f"cache{i}"
            cold.append(timed_run(code, cache, Path(folder) / f"cold{i}"))
        warm = timed_run(code, cache, Path(folder) / "warm")
    return {"cold_seconds": cold, "warm_seconds": warm}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=2, help="cold runs of each code")
    parser.add_argument("--baseline", type=Path, help="a checkout to compare against")
    args = parser.parse_args()
    result = {"cores": len(os.sched_getaffinity(0)),
              "threading_layer": os.environ.get("NUMBA_THREADING_LAYER", "splatscale's choice")}
    if args.baseline is not None:
        result["baseline"] = measure(args.baseline.resolve(), args.repeat)
    result["this"] = measure(ROOT, args.repeat)
    emit(result)


if __name__ == "__main__":
    main()

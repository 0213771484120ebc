"""A first run's compile: seconds of a short training run with numba's cache empty,
then again with it full; prints one JSON line.

``splatscale train DATA --iterations 20 --resolution R`` (``--data``, default
tests/data/snowmiku; ``--resolution``, default 4) is run ``--repeat`` times with
empty cache folders of its own (``NUMBA_CACHE_DIR`` and ``--cache-dir``) and once
more on the last one's full caches; ``cold_seconds`` are the wall-clock seconds of
each cold run, ``warm_seconds`` the warm run's. ``--baseline DIR`` (a checkout of an
earlier splatscale) measures that code first, the same way.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from report import commands_target, emit

ROOT = Path(__file__).resolve().parents[1]


def timed_run(code: Path, run: argparse.Namespace, cache: Path, output: Path) -> float:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), PYTHONPATH=str(code))
    command = [sys.executable, "-m", "splatscale", "train", str(run.data.resolve()),
               "--iterations", "20", "--resolution", str(run.resolution), "--quiet",
               "--cache-dir", str(cache / "images"), "--output", str(output)]
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, cwd=code)
    return round(time.perf_counter() - start, 1)


def measure(code: Path, run: argparse.Namespace) -> dict:
    cold = []
    with tempfile.TemporaryDirectory() as folder:
        for i in range(run.repeat):
            cache = Path(folder) / f"cache{i}"
            cold.append(timed_run(code, run, cache, Path(folder) / f"cold{i}"))
        warm = timed_run(code, run, cache, Path(folder) / "warm")
    return {"cold_seconds": cold, "warm_seconds": warm}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=2, help="cold runs of each code")
    parser.add_argument("--baseline", type=Path, help="a checkout to compare against")
    parser.add_argument("--data", type=Path, default=ROOT / "tests/data/snowmiku",
                        help="the scene to train (default: tests/data/snowmiku)")
    parser.add_argument("--resolution", type=int, default=4,
                        help="its images downscaled by this (default: 4)")
    args = parser.parse_args()
    result = {"data": str(args.data), "resolution": args.resolution,
              "cores": len(os.sched_getaffinity(0)),
              "threading_layer": os.environ.get("NUMBA_THREADING_LAYER", "splatscale's choice"),
              "cpu_target": commands_target()}
    if args.baseline is not None:
        result["baseline"] = measure(args.baseline.resolve(), args)
    result["this"] = measure(ROOT, args)
    emit(result)


if __name__ == "__main__":
    main()

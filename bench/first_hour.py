"""What a new user's two runs cost on this machine: the quick look the README and
``prepare``'s hint give first, then (``--full``) the full 3DGS run. Each is the
command a user types (``splatscale train SCENE -o OUT ...``, as a subprocess),
with every 8th view held out so that its quality is measured too; prints one
JSON line: each run's wall seconds (the whole command: reading the images,
training, testing, writing), training seconds, test PSNR and SSIM, Gaussians.

The numba kernels are compiled before the first timed run (a warm-up of a few
images), as they are for every run but a machine's first.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from report import commands_target, emit

DEFAULT_SCENE = Path(__file__).resolve().parents[1] / "tests" / "data" / "snowmiku"
QUICK_LOOK = ("--schedule-scale", "0.1", "--max-pixels", "500K")


def train(scene: Path, out: Path, cache: Path, *flags: str) -> dict:
    """One ``splatscale train`` command's report, with its wall seconds."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "splatscale", "train", str(scene), "-o", str(out),
                    "--eval", "--quiet", "--cache-dir", str(cache), *flags],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    report = json.loads((out / "report.json").read_text())
    return {"flags": " ".join(flags), "threading_layer": report["threading_layer"],
            "wall_seconds": round(wall, 1),
            "train_seconds": round(report["wall_seconds"], 1),
            "test_psnr": round(report["test"]["psnr"], 2),
            "test_ssim": round(report["test"]["ssim"], 4),
            "gaussians": report["num_gaussians"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("scene", type=Path, nargs="?", default=DEFAULT_SCENE)
    parser.add_argument("--full", action="store_true",
                        help="also the full 3DGS run (30,000 images: hours on 2 cores)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        train(args.scene, base / "warm-up", base / "cache", "--iterations", "2",
              "--schedule-scale", "1")
        runs = {"quick_look": train(args.scene, base / "quick", base / "cache", *QUICK_LOOK)}
        if args.full:
            runs["full"] = train(args.scene, base / "full", base / "cache")
    emit({"scene": str(args.scene), **runs,
          "threading_layer": runs["quick_look"]["threading_layer"],
          "cpu_target": commands_target()})


if __name__ == "__main__":
    main()

"""Training quality and speed on a real scene; prints one JSON line.

Default: tests/data/snowmiku at 495x371 (``--resolution 2``: half) with every
8th image held out, default 3DGS settings, test PSNR/SSIM after 600 and 2000
images, for batch sizes 1 and 4. Rates count training time only (evaluation
excluded).

``--baseline DIR`` (a checkout of an earlier splatscale, e.g. a ``git
worktree``) first runs the same measurement with that code, in a subprocess,
then this one, never both at once, and prints a before/after table on stderr;
the JSON line holds both runs and the speed ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from splatscale.data import load_scene
from splatscale.data.images import ImageStore
from splatscale.train.config import TrainConfig
from splatscale.train.trainer import RunOptions, Trainer

from report import emit

DEFAULT_SCENE = Path(__file__).resolve().parents[1] / "tests" / "data" / "snowmiku"


def run(scene, batch_size: int, marks: list[int], resolution: int, seed: int) -> dict:
    store = ImageStore(scene, resolution=resolution, background=scene.background)
    config = TrainConfig(iterations=marks[-1], batch_size=batch_size, seed=seed)
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(scene, store, config, RunOptions(Path(out), eval_split=True,
                                                           progress=False, checkpoint_every=0))
        result, seconds, start_gaussians = {"batch_size": batch_size}, 0.0, trainer.engine.num_gaussians()
        for mark in marks:
            start = time.perf_counter()
            while trainer.images_seen < mark:
                trainer.train_step()
            seconds += time.perf_counter() - start
            test = trainer.evaluate()
            print(f"batch {batch_size}: {mark} images, {seconds:.0f} s, test PSNR {test['psnr']:.2f}",
                  file=sys.stderr)
            result[str(mark)] = {
                "test_psnr": round(test["psnr"], 3), "test_ssim": round(test["ssim"], 4),
                "iterations_per_second": round(trainer.images_seen / seconds, 3),
                "steps_per_second": round(trainer.steps / seconds, 3),
                "num_gaussians": trainer.engine.num_gaussians(),
            }
        result["initial_gaussians"] = start_gaussians
    return result


def measure(args) -> dict:
    scene = load_scene(args.scene)
    runs = [run(scene, b, sorted(args.marks), args.resolution, args.seed)
            for b in args.batch_sizes]
    return {"scene": args.scene, "resolution": args.resolution, "seed": args.seed,
            "views": len(scene.views),
            "runs": runs,
            "peak_memory_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def baseline_measure(args) -> dict:
    """This script's measurement with the splatscale of ``args.baseline``."""
    command = [sys.executable, __file__, args.scene, "--resolution", str(args.resolution),
               "--seed", str(args.seed),
               "--batch-sizes", *map(str, args.batch_sizes), "--marks", *map(str, args.marks)]
    env = dict(os.environ, PYTHONPATH=str(args.baseline.resolve()))
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def compared(before: dict, after: dict) -> dict:
    """Per batch size and mark: speed after / before and the PSNR change."""
    table = {}
    for old, new in zip(before["runs"], after["runs"]):
        for mark in (k for k in new if k.isdigit()):
            table[f"batch_{new['batch_size']}_{mark}"] = {
                "it_s_before": old[mark]["iterations_per_second"],
                "it_s_after": new[mark]["iterations_per_second"],
                "speedup": round(new[mark]["iterations_per_second"]
                                 / old[mark]["iterations_per_second"], 3),
                "psnr_before": old[mark]["test_psnr"], "psnr_after": new[mark]["test_psnr"]}
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("scene", nargs="?", default=str(DEFAULT_SCENE))
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--marks", type=int, nargs="+", default=[600, 2000],
                        help="images seen at which to evaluate")
    parser.add_argument("--resolution", type=int, default=1, help="downscale factor")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--baseline", type=Path, help="a checkout to compare against")
    args = parser.parse_args()
    if args.baseline is None:
        emit(measure(args))
        return
    before = baseline_measure(args)
    after = measure(args)
    table = compared(before, after)
    for name, row in table.items():
        print(f"{name}: {row['it_s_before']} -> {row['it_s_after']} it/s "
              f"({row['speedup']}x), test PSNR {row['psnr_before']} -> {row['psnr_after']}",
              file=sys.stderr)
    emit({"before": before, "after": after, "compared": table})


if __name__ == "__main__":
    main()

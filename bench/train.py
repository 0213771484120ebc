"""Training quality and speed on a real scene; prints one JSON line.

Default: tests/data/snowmiku at 495x371 with every 8th image held out,
default 3DGS settings, test PSNR/SSIM after 600 and 2000 images, for batch
sizes 1 and 4. Rates count training time only (evaluation excluded).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

from splatscale.data import load_scene
from splatscale.data.images import ImageStore
from splatscale.train.config import TrainConfig
from splatscale.train.trainer import RunOptions, Trainer

DEFAULT_SCENE = Path(__file__).resolve().parents[1] / "tests" / "data" / "snowmiku"


def run(scene, batch_size: int, marks: list[int]) -> dict:
    store = ImageStore(scene, background=scene.background)
    config = TrainConfig(iterations=marks[-1], batch_size=batch_size)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("scene", nargs="?", default=str(DEFAULT_SCENE))
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--marks", type=int, nargs="+", default=[600, 2000],
                        help="images seen at which to evaluate")
    args = parser.parse_args()
    scene = load_scene(args.scene)
    runs = [run(scene, b, sorted(args.marks)) for b in args.batch_sizes]
    print(json.dumps({"scene": args.scene, "views": len(scene.views), "runs": runs,
                      "peak_memory_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))


if __name__ == "__main__":
    main()

"""Test quality over a whole schedule; prints one JSON line and writes one PNG plot.

Trains a scene (default tests/data/snowmiku) for ``--images`` images and, just
before every ``--every`` images and at the end, measures PSNR and SSIM (and LPIPS
where its package is installed) on the test views, PSNR on a fixed sample of training views, and the
Gaussian count. A test curve that falls while the training curve rises is the
model overfitting. The split holds out every 8th view; ``--sparse`` trains on
every 4th view and tests on all the others, as a small capture would.

Each densification's clones, splits and prunes (or MCMC's relocations and
additions) are recorded beside the curve. Rates count training time only.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

import numpy as np

from splatscale.data import load_scene
from splatscale.data.images import ImageStore
from splatscale.demo import demo_scene
from splatscale.train.config import TrainConfig
from splatscale.step.schedule import crosses
from splatscale.train.trainer import RunOptions, Trainer

from report import emit
from scenes import DATA
from warm import compiled_for

TRAIN_SAMPLE = 12  # training views whose PSNR is tracked


def split(views: int, sparse: bool) -> tuple[list[int], list[int]]:
    """(train, test): every 4th view trained and the rest tested with ``sparse``;
    otherwise every 8th view tested."""
    if sparse:
        return ([i for i in range(views) if i % 4 == 0], [i for i in range(views) if i % 4])
    return [i for i in range(views) if i % 8], [i for i in range(views) if i % 8 == 0]


def curve(trainer: Trainer, images: int, every: int) -> tuple[list[dict], list[dict], float]:
    """The measurements before each step that reaches a multiple of ``every`` images
    (so an opacity reset at that multiple is not what they see) and at the end, the
    changes to the set of Gaussians, and the training seconds."""
    step = max(1, len(trainer.train_ids) // TRAIN_SAMPLE)
    sample = trainer.train_ids[::step][:TRAIN_SAMPLE]
    batch = trainer.config.batch_size
    points, changes, seconds = [], [], 0.0

    def measure() -> None:
        points.append({"images": trainer.images_seen, "gaussians": trainer.engine.num_gaussians(),
                       "test": trainer.evaluate(),
                       "train_psnr": trainer.evaluate(sample)["psnr"]})
    while trainer.images_seen < images:
        if trainer.images_seen and crosses(trainer.images_seen, trainer.images_seen + batch,
                                           every):
            measure()
        start = time.perf_counter()
        entry = trainer.train_step()
        seconds += time.perf_counter() - start
        if entry["changes"]:
            changes.append({"images": entry["images"], **entry["changes"],
                            "gaussians": entry["num_gaussians"]})
    measure()
    return points, changes, seconds


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    points = result["curve"]
    images = [p["images"] for p in points]
    figure, (quality, count) = pyplot.subplots(2, 1, figsize=(7, 6), sharex=True)
    quality.plot(images, [p["test"]["psnr"] for p in points], "o-", label="test PSNR")
    quality.plot(images, [p["train_psnr"] for p in points], "s--", label="train PSNR")
    quality.set_ylabel("PSNR (dB)")
    quality.legend()
    quality.grid(alpha=0.3)
    quality.set_title(result["title"], fontsize=9)
    count.plot(images, [p["gaussians"] for p in points], "o-", color="tab:green")
    count.set_ylabel("Gaussians")
    count.set_xlabel("images seen")
    count.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("scene", nargs="?", default=str(DATA / "snowmiku"),
                        help="a scene folder or transforms.json, or demo (the built-in one)")
    parser.add_argument("--images", type=int, default=7000)
    parser.add_argument("--every", type=int, default=500, help="measure every N images")
    parser.add_argument("--sparse", action="store_true",
                        help="train on every 4th view, test on the rest")
    parser.add_argument("--strategy", choices=("3dgs", "mcmc"), default="3dgs")
    parser.add_argument("--max-gaussians", type=int, default=None)
    parser.add_argument("--absgrad", action="store_true", help="3dgs with AbsGS's statistic")
    parser.add_argument("--schedule-scale", type=float, default=1.0,
                        help="every schedule this many times as long (train's flag)")
    parser.add_argument("--resolution", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--random-init", choices=("auto", "cameras", "cube"), default=None,
                        help="start from random points by this rule, not the scene's")
    parser.add_argument("--plot", type=Path, default=None,
                        help="the PNG (default quality-<scene>-<variant>-<strategy>.png here)")
    args = parser.parse_args()
    scene = demo_scene(None) if args.scene == "demo" else load_scene(args.scene)
    if args.random_init:
        scene = dataclasses.replace(scene, points=np.zeros((0, 3)),
                                    colors=np.zeros((0, 3), np.uint8))
    store = ImageStore(scene, resolution=args.resolution, background=scene.background)
    config = TrainConfig(seed=args.seed, strategy=args.strategy,
                         max_gaussians=args.max_gaussians, absgrad=args.absgrad,
                         random_init=args.random_init or "auto").scaled(args.schedule_scale)
    config = dataclasses.replace(config, iterations=args.images)
    variant = "sparse" if args.sparse else "every8"
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(scene, store, config,
                          RunOptions(Path(out), progress=False, checkpoint_every=0,
                                     split=split(len(scene.views), args.sparse)))
        compiled_for(trainer)
        points, changes, seconds = curve(trainer, args.images, args.every)
    name = Path(args.scene).name
    cap = f", at most {args.max_gaussians}" if args.max_gaussians else ""
    cap += f", random init: {args.random_init}" if args.random_init else ""
    cap += ", absgrad" if args.absgrad else ""
    cap += f", schedule x{args.schedule_scale:g}" if args.schedule_scale != 1 else ""
    result = {"scene": args.scene, "variant": variant, "strategy": args.strategy,
              "absgrad": args.absgrad, "schedule_scale": args.schedule_scale,
              "random_init": args.random_init,
              "max_gaussians": args.max_gaussians, "resolution": args.resolution,
              "train_views": len(trainer.train_ids), "test_views": len(trainer.test_ids),
              "images_per_second": round(args.images / seconds, 3),
              "best_test": max(points, key=lambda p: p["test"]["psnr"]),
              "curve": points, "changes": changes,
              "title": f"{name}, {variant} ({len(trainer.train_ids)} train / "
                       f"{len(trainer.test_ids)} test views), {args.strategy}{cap}"}
    strategy = args.strategy + ("-absgrad" if args.absgrad else "")
    path = args.plot or Path(f"quality-{name}-{variant}-{strategy}.png")
    plot(result, path)
    result["plot"] = str(path)
    emit(result)


if __name__ == "__main__":
    main()

"""Anti-aliased splats seen nearer and farther than they were trained; prints one JSON line.

Trains a scene (default tests/data/snowmiku) at ``--resolution R`` with and without
``--antialiased``, and without it at R / 2 (twice the size), holding out every 8th
view. Each model renders the test views at the size it trained at, at a quarter of
that width (farther away: splats smaller than a pixel) and at twice it (nearer:
the R / 2 photos), each scored (PSNR, SSIM) against the photos downscaled to that
size; the model trained at twice the size is the reference for the 2x views.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

import torch

from splatscale.data import load_scene
from splatscale.data.images import ImageStore
from splatscale.data.scene import Scene
from splatscale.model.gaussians import GaussianModel, concatenated
from splatscale.render import render
from splatscale.train.config import TrainConfig
from splatscale.train.metrics import ImageMetrics
from splatscale.train.trainer import RunOptions, Trainer

from report import emit
from scenes import DATA
from warm import compiled_for


def every_8th(views: int) -> tuple[list[int], list[int]]:
    return [i for i in range(views) if i % 8], [i for i in range(views) if i % 8 == 0]


def trained(scene: Scene, resolution: int, antialiased: bool, scale: float,
            images: int | None) -> GaussianModel:
    """The model of a run at ``resolution`` with every schedule ``scale`` times as long."""
    store = ImageStore(scene, resolution=resolution, background=scene.background)
    config = dataclasses.replace(TrainConfig(), antialiased=antialiased).scaled(scale)
    if images is not None:
        config = dataclasses.replace(config, iterations=images)
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(scene, store, config,
                          RunOptions(Path(out), progress=False, checkpoint_every=0,
                                     split=every_8th(len(scene.views))))
        compiled_for(trainer)
        while trainer.images_seen < config.iterations:
            trainer.train_step()
        return concatenated(list(trainer.engine.model_parts()), trainer.sh_degree)


def scores(model: GaussianModel, store: ImageStore, test_ids: list[int]) -> dict:
    """PSNR and SSIM of ``model``'s renders of the test views at ``store``'s size."""
    metrics = ImageMetrics()
    background = torch.tensor(store.background, dtype=model.means.dtype)
    for i in test_ids:
        with torch.no_grad():
            rgb = render(model, store.camera(i), background=background).rgb.clamp(0, 1)
        metrics.add(rgb, store.as_float(i))
    return {name: round(value, 4) for name, value in metrics.summary().items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("scene", nargs="?", default=str(DATA / "snowmiku"))
    parser.add_argument("--resolution", type=int, choices=(2, 4, 8), default=4,
                        help="the size the models train at (the photos' 1/R)")
    parser.add_argument("--schedule-scale", type=float, default=0.1)
    parser.add_argument("--images", type=int, default=None,
                        help="images each run trains on (default 30000 x the scale)")
    args = parser.parse_args()
    scene = load_scene(args.scene)
    _, test_ids = every_8th(len(scene.views))
    full = ImageStore(scene, resolution=args.resolution, background=scene.background)
    width = full.camera(0).width
    stores = {"1x": full,
              "1/4x": ImageStore(scene, max_width=max(1, width // 4),
                                 background=scene.background),
              "2x": ImageStore(scene, resolution=args.resolution // 2,
                               background=scene.background)}
    runs = {"plain": (args.resolution, False), "antialiased": (args.resolution, True),
            "plain trained at 2x": (args.resolution // 2, False)}
    results = {}
    for name, (resolution, antialiased) in runs.items():
        model = trained(scene, resolution, antialiased, args.schedule_scale, args.images)
        sizes = ("2x",) if resolution != args.resolution else tuple(stores)
        results[name] = {"gaussians": len(model),
                         **{size: scores(model, stores[size], test_ids) for size in sizes}}
    emit({"scene": args.scene, "resolution": args.resolution,
          "schedule_scale": args.schedule_scale, "test_views": len(test_ids),
          "sizes": {size: [store.camera(0).width, store.camera(0).height]
                    for size, store in stores.items()},
          "models": results})


if __name__ == "__main__":
    main()

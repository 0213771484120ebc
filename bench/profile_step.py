"""Where one CPU training step's time goes, by stage; prints one JSON line.

A step of ``make_engine``'s engine at B = 1 (the Trainer's step, taken apart with the
same calls), timed stage by stage, median of ``--steps`` steps after a
warm-up, for snowmiku's SfM points jittered up to each model size in
``--sizes`` (or a trained model, ``--model``), at full and half resolution; or,
with ``--scene garden``, for ``bench/growth.py``'s Gaussian sweep (the garden
view at ``--megapixels``, models of ``--sizes`` from ``scenes.garden_scene``):

image (fetch and convert the target), projection (forward), binning,
compositing (forward), loss (forward), loss backward, compositing backward,
projection backward, statistics (densification's view-space gradient norms),
adam, and ``step`` (the whole step as the engine runs it, separately);
``overhead`` is ``step`` minus the stages' sum (can be below zero: the stages
are timed one by one, with synchronisation points the step does not have).

``--space-order`` stores each model's rows in the order training keeps them once
it has edited them (``step/spatial_order.py``) instead of as they were built.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from scipy.spatial import cKDTree

from splatscale.data.colmap import read_colmap
from splatscale.data.images import ImageStore
from splatscale.engine import TrainView
from splatscale.engine.composed import ComposedEngine
from splatscale.engine.factory import make_engine
from splatscale.model import init_from_points
from splatscale.model.ply import read_ply
from splatscale.render import project
from splatscale.render.binning import bin_tiles
from splatscale.render.dense_gradients import reusing
from splatscale.render.rasterize import composite
from splatscale.step.loss import photometric_loss
from splatscale.step.observer import Seen, SeenView
from splatscale.strategy.default import GradientNorms

from growth import scaled, stored
from report import emit
from scenes import DATA, garden_scene

RATES = {"means": 1.6e-4, "sh0": 2.5e-3, "shN": 1.25e-4, "opacity_logits": 0.05,
         "log_scales": 5e-3, "quats": 1e-3}
SPLAT_INPUTS = ("means2d", "conics", "colors", "depths", "opacities")


def jittered(points: np.ndarray, colors: np.ndarray, count: int, seed: int = 0):
    """The SfM points, each copied with a jitter of its nearest-neighbour distance."""
    if count <= len(points):
        return points[:count], colors[:count]
    rng = np.random.default_rng(seed)
    spacing = cKDTree(points).query(points, k=2)[0][:, 1]
    copies = rng.integers(0, len(points), count - len(points))
    return (np.concatenate([points, points[copies] + rng.normal(size=(len(copies), 3))
                            * spacing[copies, None]]),
            np.concatenate([colors, colors[copies]]))


class Stages:
    def __init__(self) -> None:
        self.times: dict[str, list[float]] = defaultdict(list)

    def run(self, name: str, call):
        start = time.perf_counter()
        out = call()
        self.times[name].append(1e3 * (time.perf_counter() - start))
        return out


def staged_step(engine: ComposedEngine, store: ImageStore, index: int, stages: Stages) -> None:
    """One step, stage by stage (the engine's own calls, taken apart)."""
    camera = store.camera(index)
    target = stages.run("image", lambda: store.as_float(index))
    splats = stages.run("projection", lambda: project(engine.model, [camera]).of_camera(0))
    splats.means2d.retain_grad()
    rows = (0, camera.height)
    bins = stages.run("binning", lambda: bin_tiles(splats.means2d, splats.radii, splats.depths,
                                                   splats.keys, camera.width, rows,
                                                   splats.conics, splats.opacities))
    rgb, _, _ = stages.run("compositing", lambda: composite(
        *(getattr(splats, n) for n in SPLAT_INPUTS), engine.compute.background, bins, camera.width,
        rows))
    loss = stages.run("loss", lambda: photometric_loss(rgb, target, engine.compute.ssim_weight))
    rgb_grad, = stages.run("loss_backward", lambda: torch.autograd.grad(loss, rgb))
    inputs = [getattr(splats, n) for n in SPLAT_INPUTS]
    # The graph is kept: these inputs are views of the projection's outputs.
    grads = stages.run("compositing_backward",
                       lambda: torch.autograd.grad(rgb, inputs, rgb_grad, allow_unused=True,
                                                   retain_graph=True))
    used = [(t, g) for t, g in zip(inputs, grads) if g is not None]
    with reusing(engine.rows.spare_gradients()):  # as the engine's backward does
        stages.run("projection_backward",
                   lambda: torch.autograd.backward([t for t, _ in used], [g for _, g in used]))
    seen = Seen([SeenView(splats.gaussian_ids, splats.means2d.grad, None, camera.width,
                          camera.height)])
    stages.run("statistics", lambda: GradientNorms().observe(engine.row_set, seen))
    stages.run("adam", lambda: engine.optimizer_step(RATES))


def profile(store: ImageStore, model, steps: int, space_order: bool = False) -> dict:
    engine = make_engine(stored(model, space_order), 1, torch.zeros(3))
    engine.set_sh_degree(model.sh_degree)  # as the Trainer does: the SH bands in use held
    stages = Stages()
    views = list(range(len(store)))
    for step in range(steps + 2):  # two warm-up steps
        staged_step(engine, store, views[step % len(views)], stages)
        index = views[(step + 1) % len(views)]
        batch = [TrainView(store.camera(index), store.as_float(index))]
        stages.run("step", lambda: (engine.forward_backward(batch, GradientNorms()),
                                    engine.optimizer_step(RATES)))
    medians = {name: statistics.median(t[2:]) for name, t in stages.times.items()}
    medians["overhead"] = medians["step"] - sum(v for n, v in medians.items() if n != "step")
    return {name: round(value, 2) for name, value in medians.items()}


class GardenView:
    """``bench/growth.py``'s Gaussian sweep view as a store of one image (black)."""

    def __init__(self, camera) -> None:
        self.view = camera

    def __len__(self) -> int:
        return 1

    def camera(self, index: int):
        return self.view

    def as_float(self, index: int) -> torch.Tensor:
        return torch.zeros(self.view.height, self.view.width, 3)


def garden_run(size: int, megapixels: float, steps: int, space_order: bool) -> dict:
    model, cameras = garden_scene(size)
    store = GardenView(scaled(cameras[0], megapixels))
    return {"gaussians": size, "width": store.view.width, "height": store.view.height,
            "ms": profile(store, model, steps, space_order)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[25_784, 100_000, 300_000])
    parser.add_argument("--resolutions", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--model", type=Path, help="a trained snowmiku model (PLY) to profile "
                        "instead of the jittered SfM points (its SH degree: 3, or --sh-degree)")
    parser.add_argument("--scene", choices=("snowmiku", "garden"), default="snowmiku")
    parser.add_argument("--megapixels", type=float, default=1.0, help="of the garden view")
    parser.add_argument("--space-order", action="store_true",
                        help="each model's rows in the order training keeps them")
    parser.add_argument("--sh-degree", type=int, choices=range(4),
                        help="the snowmiku models' SH degree in use (default: their own; "
                        "a 3DGS run uses 0 for its first 1000 images, then one more each 1000)")
    args = parser.parse_args()
    if args.scene == "garden":
        emit({"scene": "garden", "space_order": args.space_order,
              "runs": [garden_run(size, args.megapixels, args.steps, args.space_order)
                       for size in args.sizes]})
        return
    scene = read_colmap(DATA / "snowmiku")
    runs = []
    models = ([read_ply(args.model)] if args.model else
              (init_from_points(*jittered(scene.points, scene.colors, size))
               for size in args.sizes))
    for model in models:
        if args.sh_degree is not None:
            model.sh_degree = args.sh_degree
        for resolution in args.resolutions:
            store = ImageStore(scene, resolution=resolution, background=scene.background)
            camera = store.camera(0)
            runs.append({"gaussians": len(model), "sh_degree": model.sh_degree,
                         "width": camera.width,
                         "height": camera.height,
                         "ms": profile(store, model, args.steps, args.space_order)})
    emit({"scene": "snowmiku", "space_order": args.space_order, "runs": runs})


if __name__ == "__main__":
    main()

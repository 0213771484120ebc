"""How training's cost grows on this machine; prints one JSON line, writes docs/growth.png.

Three sweeps (``--sweeps`` picks some; the plot needs all three), each point in
a process of its own (so that its peak resident memory, ``VmHWM``, is its own):

- ``gaussians``: one training step of the local engine (forward, backward,
  Adam, densification statistics) at B = 1 on a garden view of ``--megapixels``,
  for models of ``--gaussian-counts`` (``scenes.garden_scene``: a random choice
  of the garden splats' points below their 138,766, all of them and jittered
  copies above; 3DGS initialisation, so the denser the model, the smaller its
  Gaussians; with ``--space-order``, stored as training keeps them once it has
  edited its rows, ``step/spatial_order.py``). Per point: the
  median step seconds after a warm-up step, and the process' peak resident
  bytes over the timed steps (the model, its Adam state and the step).
- ``pixels``: the same at ``--model-gaussians`` for views of ``--pixel-counts``
  megapixels (the garden camera with its focal length and size scaled).
- ``images``: a training run (the Trainer, 3DGS schedule, ``--run-images``
  images) on snowmiku's photos listed ``--view-counts`` times in all, with
  ``--image-memory`` and with every image kept: the process' peak resident
  bytes, image check and decode included.

Each sweep of two points or more is fitted by least squares with a line
(``per_unit``: the slope, ``fixed``: the intercept); ``exponent`` is the log-log
slope between its two largest points (1: the cost grows in proportion there).
With the budget on, the image memory stops growing at ``bend_views`` (the budget
over one image's bytes); its line is fitted to the points past it. A user reads
from ``per_unit`` what their capture costs.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from report import emit

DOCS = Path(__file__).resolve().parents[1] / "docs"
SWEEPS = ("gaussians", "pixels", "images")
GARDEN_PIXELS = 648 * 420


def peak_resident() -> int:
    """This process' peak resident bytes since the last ``reset_peak``."""
    status = Path("/proc/self/status").read_text().splitlines()
    return int(next(line for line in status if line.startswith("VmHWM")).split()[1]) * 1024


def reset_peak() -> None:
    """Start the peak resident count again from the present (Linux's clear_refs 5)."""
    Path("/proc/self/clear_refs").write_text("5")


def scaled(camera, megapixels: float):
    """``camera`` with its size and focal length scaled to ``megapixels``."""
    from splatscale.data.cameras import Camera

    scale = (megapixels * 1e6 / (camera.width * camera.height)) ** 0.5
    K = camera.K.clone()
    K[:2] *= scale
    return Camera(camera.viewmat, K, round(camera.width * scale), round(camera.height * scale),
                  camera.name)


def stored(model, space_order: bool):
    """A copy of ``model``; with ``space_order``, its rows in the order training keeps
    them once it has edited them (``step/spatial_order.py``)."""
    from splatscale.step.spatial_order import spatial_order

    return model.rows(spatial_order(model.means)) if space_order else model.detach()


def step_point(gaussians: int, megapixels: float, steps: int, space_order: bool) -> dict:
    """One process' measurement of the local engine's step (with ``space_order``, on
    the model's rows in the order training keeps them once it has edited them)."""
    import numba
    import torch

    from splatscale.engine import TrainView
    from splatscale.engine.factory import make_engine
    from splatscale.strategy.default import GradientNorms
    from memory import rates
    from scenes import garden_scene

    model, cameras = garden_scene(gaussians)
    model = stored(model, space_order)
    camera = scaled(cameras[0], megapixels)
    views = [TrainView(camera, torch.zeros(camera.height, camera.width, 3))]
    engine = make_engine(model, 1, torch.zeros(3))
    del model

    def step() -> None:
        engine.forward_backward(views, GradientNorms())
        engine.optimizer_step(rates())
    step()  # warm-up: kernels loaded, buffers sized
    reset_peak()
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
    return {"gaussians": gaussians, "megapixels": round(camera.width * camera.height / 1e6, 3),
            "step_seconds": round(statistics.median(seconds), 4),
            "peak_bytes": peak_resident(), "threading_layer": numba.threading_layer()}


def images_point(views: int, budget: int | None, images: int, cache: str) -> dict:
    """One process' peak resident bytes over a short training run on ``views`` views."""
    from splatscale.data.colmap import read_colmap
    from splatscale.data.images import ImageStore
    from splatscale.data.scene import View
    from splatscale.train.config import TrainConfig
    from splatscale.train.trainer import RunOptions, Trainer
    from scenes import DATA

    scene = read_colmap(DATA / "snowmiku")
    photos = scene.views
    scene.views = [View(dataclasses.replace(photos[i % len(photos)].camera,
                                            name=f"{i:05d}_{photos[i % len(photos)].camera.name}"),
                        photos[i % len(photos)].image_path)
                   for i in range(views)]
    reset_peak()
    store = ImageStore(scene, cache_dir=Path(cache), background=scene.background,
                       memory_budget=budget)
    with tempfile.TemporaryDirectory() as out:
        config = TrainConfig(iterations=images)
        trainer = Trainer(scene, store, config, RunOptions(Path(out), progress=False,
                                                           checkpoint_every=0))
        for _ in range(images):
            trainer.train_step()
    return {"views": views, "decoded_bytes": store.decoded_bytes(),
            "peak_bytes": peak_resident()}


def fit(x: list[float], y: list[float]) -> dict:
    """Least-squares line (``per_unit``, ``fixed``) and the log-log slope between the two
    largest points (``exponent``)."""
    per_unit, fixed = np.polyfit(x, y, 1)
    exponent = np.log(y[-1] / y[-2]) / np.log(x[-1] / x[-2])
    return {"per_unit": float(per_unit), "fixed": float(fixed),
            "exponent": round(float(exponent), 3)}


def measured(pool, function, argument_lists) -> list[dict]:
    return [pool.apply(function, arguments) for arguments in argument_lists]


def images_sweep(pool, args, cache: str) -> dict:
    """Peak resident bytes against the number of views, with the budget and without."""
    result = {"budget_bytes": args.image_memory}
    for setting, budget in (("budget", args.image_memory), ("all_kept", None)):
        points = measured(pool, images_point, [(n, budget, args.run_images, cache)
                                               for n in args.view_counts])
        result[setting] = {"points": points}
        image_bytes = points[0]["decoded_bytes"] / points[0]["views"]
        result["bend_views"] = round(args.image_memory / image_bytes)
        past = [p for p in points if setting == "all_kept" or p["views"] > result["bend_views"]]
        if len(past) > 1:
            result[setting]["peak_bytes"] = fit([p["views"] for p in past],
                                                [p["peak_bytes"] for p in past])
    return result


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(3, 2, figsize=(10, 10))
    gib = 2.0 ** 30
    panels = [("gaussians", "gaussians", 1e6, "Gaussians (millions)", "million Gaussians"),
              ("pixels", "megapixels", 1.0, "megapixels per image", "megapixel")]
    for row, (sweep, key, unit, label, per) in enumerate(panels):
        points = result[sweep]["points"]
        x = [p[key] / unit for p in points]
        for axis, value, scale, name, slope in (
                (axes[row][0], "step_seconds", 1.0, "step seconds", "{:.2f} s"),
                (axes[row][1], "peak_bytes", gib, "peak resident GiB", "{:.0f} MiB")):
            fitted = result[sweep][value]
            per_unit = fitted["per_unit"] * unit / (1.0 if scale == 1.0 else 2 ** 20)
            axis.plot(x, [p[value] / scale for p in points], "o", label="measured")
            line = np.linspace(0, max(x), 50)
            axis.plot(line, (fitted["fixed"] + fitted["per_unit"] * line * unit) / scale, "--",
                      label=f"fit: {slope.format(per_unit)} per {per}")
            axis.set_xlabel(label)
            axis.set_ylabel(name)
            axis.set_xlim(left=0)
            axis.set_ylim(bottom=0)
            axis.legend()
    grid = axes[2][0].get_gridspec()
    for axis in axes[2]:
        axis.remove()
    views = figure.add_subplot(grid[2, :])
    images = result["images"]
    labels = {"budget": f"--image-memory {images['budget_bytes'] / 2 ** 20:.0f}M",
              "all_kept": "every image kept"}
    for setting, style in (("budget", "o-"), ("all_kept", "s--")):
        points, fitted = images[setting]["points"], images[setting].get("peak_bytes")
        slope = f": {fitted['per_unit'] / 2 ** 10:.0f} KiB per view" if fitted else ""
        views.plot([p["views"] for p in points], [p["peak_bytes"] / gib for p in points], style,
                   label=labels[setting] + (slope if setting == "all_kept" else ""))
    views.axvline(result["images"]["bend_views"], color="grey", linestyle=":",
                  label="the budget is full")
    views.set_xlabel("views in the scene (snowmiku's 495x371 photos, repeated)")
    views.set_ylabel("peak resident GiB")
    views.set_xlim(left=0)
    views.set_ylim(bottom=0)
    views.legend()
    figure.suptitle(f"splatscale on {result['cores']} CPU cores: how a step's cost grows")
    figure.tight_layout()
    figure.savefig(path, dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gaussian-counts", type=int, nargs="+",
                        default=[100_000, 300_000, 1_000_000, 3_000_000])
    parser.add_argument("--megapixels", type=float, default=1.0,
                        help="of the view in the Gaussian sweep")
    parser.add_argument("--pixel-counts", type=float, nargs="+", default=[0.25, 0.5, 1.0, 2.0],
                        help="megapixels of the pixel sweep")
    parser.add_argument("--model-gaussians", type=int, default=1_000_000,
                        help="of the pixel sweep")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per point")
    parser.add_argument("--view-counts", type=int, nargs="+",
                        default=[100, 300, 1000, 3000, 5000])
    parser.add_argument("--image-memory", type=int, default=256 * 2 ** 20, metavar="BYTES")
    parser.add_argument("--run-images", type=int, default=20, help="trained per view count")
    parser.add_argument("--plot", type=Path, default=DOCS / "growth.png",
                        help="written when every sweep runs")
    parser.add_argument("--sweeps", nargs="+", choices=SWEEPS, default=list(SWEEPS))
    parser.add_argument("--space-order", action="store_true",
                        help="the models' rows in the order training keeps them")
    args = parser.parse_args()

    import numba
    result = {"cores": numba.config.NUMBA_NUM_THREADS, "numba_threads": numba.get_num_threads(),
              "space_order": args.space_order}
    # A fresh process per point: each peak is its own, and nothing else computes beside it.
    pool = multiprocessing.get_context("spawn").Pool(1, maxtasksperchild=1)
    try:
        for sweep, points in (
                ("gaussians", [(n, args.megapixels, args.steps, args.space_order)
                               for n in args.gaussian_counts]),
                ("pixels", [(args.model_gaussians, mp, args.steps, args.space_order)
                            for mp in args.pixel_counts])):
            if sweep not in args.sweeps:
                continue
            points = measured(pool, step_point, points)
            x = [p["gaussians" if sweep == "gaussians" else "megapixels"] for p in points]
            result[sweep] = {"points": points}
            if len(points) > 1:  # a line needs two points
                result[sweep].update({value: fit(x, [p[value] for p in points])
                                      for value in ("step_seconds", "peak_bytes")})
            result["threading_layer"] = "/".join(sorted({p.pop("threading_layer")
                                                          for p in points}))
        if "images" in args.sweeps:
            with tempfile.TemporaryDirectory() as cache:
                result["images"] = images_sweep(pool, args, cache)
        pool.close()
    finally:
        pool.join()
    if set(args.sweeps) == set(SWEEPS) and all("step_seconds" in result[sweep]
                                                for sweep in ("gaussians", "pixels")):
        plot(result, args.plot)
    emit(result)


if __name__ == "__main__":
    main()

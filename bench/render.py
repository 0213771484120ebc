"""Renderer speed: forward and backward milliseconds per view on a real scene.

Prints one JSON line. Default: tests/data/snowmiku, Gaussians initialised
the standard 3DGS way from its SfM points, 10 cameras, loss L1 against zeros.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numba
import torch

from splatscale.data.colmap import read_colmap
from splatscale.model import init_from_points
from splatscale.render import project, rasterize
from splatscale.render.binning import bin_tiles

from report import emit

DEFAULT_SCENE = Path(__file__).resolve().parents[1] / "tests" / "data" / "snowmiku"


def time_view(model, camera) -> tuple[float, float, int]:
    """(forward ms, backward ms, tile intersections) of one view."""
    model.requires_grad_(True)
    start = time.perf_counter()
    splats = project(model, [camera]).of_camera(0)
    out = rasterize(splats, camera.width, camera.height)
    loss = out.rgb.abs().mean()
    middle = time.perf_counter()
    loss.backward()
    end = time.perf_counter()
    bins = bin_tiles(splats.means2d, splats.radii, splats.depths, splats.keys, camera.width,
                     (0, camera.height), splats.conics, splats.opacities)  # as rasterize bins
    for tensor in model.parameters().values():
        tensor.grad = None
    return (middle - start) * 1e3, (end - middle) * 1e3, int(bins.offsets[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("scene", nargs="?", default=str(DEFAULT_SCENE),
                        help="COLMAP scene folder (default: %(default)s)")
    parser.add_argument("--views", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3, help="passes over the views")
    parser.add_argument("--threads", type=int, default=None, help="numba threads")
    parser.add_argument("--torch-threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        numba.set_num_threads(args.threads)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)

    scene = read_colmap(args.scene)
    model = init_from_points(scene.points, scene.colors)
    step = max(1, len(scene.views) // args.views)
    cameras = [view.camera for view in scene.views[::step][: args.views]]
    time_view(model, cameras[0])  # compile and warm up
    forward, backward, isects = [], [], []
    for _ in range(args.repeats):
        for camera in cameras:
            f, b, n = time_view(model, camera)
            forward.append(f)
            backward.append(b)
            isects.append(n)
    total = [f + b for f, b in zip(forward, backward)]
    mean_isects = statistics.mean(isects)
    emit({
        "scene": str(args.scene), "gaussians": len(model), "views": len(cameras),
        "width": cameras[0].width, "height": cameras[0].height,
        "forward_ms": round(statistics.median(forward), 2),
        "backward_ms": round(statistics.median(backward), 2),
        "total_ms": round(statistics.median(total), 2),
        "intersections": round(mean_isects),
        "total_ms_per_million_intersections":
            round(statistics.median(total) / mean_isects * 1e6, 2),
        "threads": numba.get_num_threads(),
    })


if __name__ == "__main__":
    main()

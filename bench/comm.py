"""Distributed training's traffic and balance, W ranks simulated in one process.

Prints one JSON line. The model (snowmiku's SfM points at 3DGS
initialisation, or a trained one given with ``--model``) is sharded over W ranks
as the distributed engine shards it; for each of ``--steps`` batches of B random
training views, the engine's own partition and routing code decides what each
rank sends, and each rank's bands are rendered (forward and backward) one rank
after another, so their times do not disturb each other. Per step:

- ``sparse_bytes``: what the sparse exchange sends between ranks (the splats,
  and their gradients on the way back);
- ``band_dense_bytes``: every projected splat of a camera sent to every rank
  that renders part of that camera;
- ``whole_image_bytes``: every visible splat of a camera sent to the one rank
  rendering that whole image (gsplat's distributed mode; image c on rank c mod W);
- ``imbalance_uniform`` / ``imbalance_balanced`` / ``imbalance_whole_image``:
  max / mean of the ranks' render times with equal row counts, with the
  cost-balanced cut, and with whole images.

The balanced cut's cost per pixel and per intersection is fitted to the
measured render times as the engine fits it (``cost_model``); the fitted
coefficients are printed, relative to an intersection's.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from splatscale.data.colmap import read_colmap
from splatscale.engine.distributed.cost_model import FittedRowCost
from splatscale.engine.distributed.engine import shard_of
from splatscale.engine.distributed.exchange import (pack, render_rows, rendered_workload, route,
                                                    unpack)
from splatscale.engine.distributed.partition import Band, partition, tile_row_work
from splatscale.model import init_from_points
from splatscale.model.ply import read_ply
from splatscale.render import project, rasterize
from splatscale.step.loss import photometric_loss

from report import emit

DEFAULT_SCENE = Path(__file__).resolve().parents[1] / "tests" / "data" / "snowmiku"


def row_bytes(floats: torch.Tensor, ints: torch.Tensor) -> int:
    """A splat's bytes there (floats and ints) and back (the floats' gradient)."""
    return 2 * floats.element_size() * floats.shape[1] + ints.element_size() * ints.shape[1]


def whole_images(cameras, world: int) -> list[list[Band]]:
    return [[Band(c, (0, camera.height)) for c, camera in enumerate(cameras) if c % world == r]
            for r in range(world)]


def rank_times(shard_splats, bands, cameras) -> list[float]:
    """Each rank's time to render its bands and take their loss, forward and backward,
    one rank at a time."""
    routed = [route(splats, bands, cameras) for splats in shard_splats]
    packed = [pack(splats) for splats in shard_splats]
    times = []
    for rank, rank_bands in enumerate(bands):
        floats, ints = [], []
        for (send, counts), (f, i) in zip(routed, packed):
            start = sum(counts[:rank])
            rows = send[start:start + counts[rank]]
            floats.append(f.detach()[rows])
            ints.append(i[rows])
        floats = torch.cat(floats).requires_grad_(True)
        ints = torch.cat(ints)
        began = time.perf_counter()
        for band in rank_bands:
            camera = cameras[band.camera]
            y0, y1 = render_rows(band, camera)
            out = rasterize(unpack(floats, ints, band.camera, camera), camera.width,
                            camera.height, rows=(y0, y1))
            # The engine's loss of the band's own rows, against a black image.
            photometric_loss(out.rgb, torch.zeros_like(out.rgb), 0.2,
                             rows=(band.rows[0] - y0, band.rows[1] - y0),
                             count=3 * camera.width * camera.height).backward()
        times.append(time.perf_counter() - began)
    return times


def imbalance(times: list[float]) -> float:
    return max(times) / statistics.mean(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("scene", nargs="?", default=str(DEFAULT_SCENE))
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--model", type=Path, default=None,
                        help="a point_cloud.ply of the scene (default: its SfM points)")
    args = parser.parse_args()

    scene = read_colmap(args.scene)
    model = (read_ply(args.model) if args.model
             else init_from_points(scene.points, scene.colors))
    shards = [shard_of(model, r, args.world) for r in range(args.world)]
    generator = torch.Generator().manual_seed(0)
    fitted = FittedRowCost()
    totals = {"sparse_bytes": [], "band_dense_bytes": [], "whole_image_bytes": [],
              "imbalance_uniform": [], "imbalance_balanced": [], "imbalance_whole_image": []}
    for step in range(args.steps + 1):  # the first step warms the kernels up, unrecorded
        ids = torch.randperm(len(scene.views), generator=generator)[:args.batch_size].tolist()
        cameras = [scene.views[i].camera for i in ids]
        shard_splats = [project(shard.requires_grad_(True), cameras) for shard in shards]
        work = sum(tile_row_work(splats, cameras) for splats in shard_splats)
        per_row = row_bytes(*pack(shard_splats[0]))
        cuts = {"uniform": partition(work, cameras, args.world, None),
                "whole_image": whole_images(cameras, args.world),
                "balanced": partition(work, cameras, args.world, fitted.current)}
        for name, bands in cuts.items():
            times = rank_times(shard_splats, bands, cameras)
            totals["imbalance_" + name].append(imbalance(times))
            fitted.add(torch.tensor([[*rendered_workload(work, rank_bands, cameras), t]
                                     for rank_bands, t in zip(bands, times)],
                                    dtype=torch.float64))
        bands = cuts["balanced"]
        sparse = dense = whole = 0
        for rank, splats in enumerate(shard_splats):
            _, counts = route(splats, bands, cameras)
            sparse += per_row * (sum(counts) - counts[rank])
            per_camera = torch.bincount(splats.camera_ids, minlength=len(cameras)).tolist()
            for other, other_bands in enumerate(bands):
                if other != rank:
                    dense += per_row * sum(per_camera[b.camera] for b in other_bands)
            whole += per_row * sum(n for c, n in enumerate(per_camera)
                                   if c % args.world != rank)
        if step == 0:
            for values in totals.values():
                values.clear()
            continue
        totals["sparse_bytes"].append(sparse)
        totals["band_dense_bytes"].append(dense)
        totals["whole_image_bytes"].append(whole)
    cost = fitted.current
    emit({"scene": args.scene, "model": str(args.model or "sfm points"),
                      "gaussians": len(model), "world": args.world,
                      "batch_size": args.batch_size, "steps": args.steps,
                      **{k: round(statistics.mean(v), 3) for k, v in totals.items()},
                      "fitted_pixel_cost": round(cost.pixel / cost.intersection, 4)})


if __name__ == "__main__":
    main()

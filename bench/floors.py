"""Each stage of a CPU training step beside its floor on this machine; prints one JSON line.

A stage's floor is the least time its work could take here: the larger of the
bytes it must move over this machine's memory bandwidth (``memory_rate``) and
the floating-point operations it must do over this machine's vector rate
(``vector_rate``), both measured here by numba kernels on every thread. ``ratio`` is the stage's
measured time (``profile_step``'s medians, the same process) over its floor.

The step is ``bench/growth.py``'s garden view at ``--gaussians`` (rows in space
order, SH degree 0: a step of a run's first thousand images). Its work is
counted on that view: the Gaussians (N), the splats in view (V), the tile
intersections (I), the pixels (P) and the pixel-splat pairs of the blocks binning
lets in (the forward evaluates these, less the blocks whose pixels have all
stopped) and of those the forward narrows them to (the backward evaluates these).
A stage must read its inputs once and write its outputs once (``bytes_per``; what
a kernel with no re-reads, fused with its neighbours, would move); its operations
per unit (``OPERATIONS``) are those of its kernels as written, counted by hand
from the source, with each exp or log counted as 15 (a vectorised polynomial's
cost, as compositing's exp). Binning's sort and scattered writes, and Adam, are
counted by their bytes alone.

Also printed: the pairs a per-pixel rasteriser's backward (gsplat's) evaluates,
each splat of a pixel's tile up to the pixel's last contributor (its forward
evaluates at least as many).
"""

from __future__ import annotations

import argparse

import numba
import numpy as np
import torch

from splatscale.engine.factory import make_engine
from splatscale.render import compositing_kernels, project
from splatscale.render.binning import bin_tiles
from splatscale.render.conventions import TILE_SIZE
from splatscale.render.rasterize import _kernel_inputs

from adam import best_seconds
from growth import scaled, stored
from profile_step import GardenView, profile
from report import emit
from scenes import garden_scene

FLOAT, ID = 4, 8
# A Gaussian's float32 values a step at SH degree 0 reads: mean 3, quat 4, scale 3,
# opacity 1, SH's first band 3 (not the 45 of the higher bands).
DEGREE_0 = 14
# (unit, operations per unit): each stage's arithmetic, counted from its kernels.
OPERATIONS = {
    # visibility per Gaussian (camera point 18, image bound 30); per splat in view the
    # shape again (quaternion 35, three exp, J W 20, cov2d 40, conic 8), opacity (exp),
    # box (log, 2 sqrt, 20) and SH degree 0 (6)
    "projection": (("gaussians", 48), ("splats", 35 + 45 + 20 + 40 + 8 + 17 + 37 + 6)),
    # per splat its tile box 20; per intersection its blocks' mask, four rows of blocks
    # each a square root and about five operations
    "binning": (("splats", 20), ("intersections", 24)),
    # per pair evaluated: offsets 2, sigma 5, exp 15, alpha 2, T and stop 4, four
    # channels 8, T and last 4
    "compositing": (("binned_pairs", 40),),
    # L1 and SSIM per pixel: five planes of three channels blurred by 11 taps twice
    # (660), the gradient's three planes blurred back (396), the per-pixel formulas 40
    "loss": (("pixels", 1096),),
    # per pair evaluated: as the forward to alpha 24, un-blend 3 (a division),
    # four colour gradients 8, the dot with the colours 8, alpha's gradient 6,
    # opacity 2, sigma 2, five running sums 8
    "compositing_backward": (("narrowed_pairs", 61),),
    # per splat: conic to cov2d 12, cov2d to J W, rotation and scale 150, quaternion
    # normalisation 40, three exp 45, mean through the camera 40, SH degree 0 6
    "projection_backward": (("splats", 293),),
    "statistics": (("splats", 6),),
}


def bytes_per(counts: dict) -> dict:
    """Each stage's bytes: inputs read once, outputs written once (float32; splat ids
    int64, block masks one byte)."""
    n, v, i, p = counts["gaussians"], counts["splats"], counts["intersections"], counts["pixels"]
    splat_values = 10  # means2d 2, conic 3, colour 3, depth, opacity
    return {
        "image": 3 * FLOAT * p,
        # every Gaussian's mean, quaternion, scale and opacity; each splat's SH band 0,
        # id, radii and values written
        "projection": 11 * FLOAT * n + v * (3 * FLOAT + ID + 2 * FLOAT + splat_values * FLOAT),
        # splat values, radii and keys read; each intersection's splat id and blocks
        "binning": v * (8 * FLOAT + 2 * FLOAT + ID) + i * (ID + 1),
        # splats and intersections read; colour, T and last contributor written (training
        # renders no depth)
        "compositing": v * splat_values * FLOAT + i * (ID + 1) + p * 5 * FLOAT,
        "loss": 3 * 3 * FLOAT * p,  # image and target read, its gradient written
        # splats, intersections, the image's and alpha's gradients, T and last read; the
        # splats' gradients written
        "compositing_backward": (2 * v * splat_values * FLOAT + i * (ID + 1)
                                 + p * 6 * FLOAT),
        # the splats' gradients and their Gaussians' values in use read, the Gaussians'
        # gradients written
        "projection_backward": v * (2 * DEGREE_0 * FLOAT + splat_values * FLOAT),
        "statistics": v * (2 * FLOAT + ID) + n * 2 * FLOAT,
        # every Gaussian's values in use, their gradients and both moments read, and
        # values and moments written (3DGS's Adam steps every row, seen or not; SH's
        # higher bands, with no gradient and zero moments until degree 1, stay as they are)
        "adam": n * DEGREE_0 * 7 * FLOAT,
    }


# Multiply-adds may fuse (one instruction each), nothing may reassociate: the eight
# of a round stay a chain, and a round's values are independent of one another.
@numba.njit(parallel=True, fastmath={"contract"})
def _multiply_adds(rounds: int, lanes: int) -> np.ndarray:  # pragma: no cover - compiled
    threads = numba.get_num_threads()
    sums = np.zeros(threads, np.float32)
    for t in numba.prange(threads):
        x = np.full(lanes, np.float32(t + 1))
        a, b = np.float32(0.999), np.float32(0.001)
        for _ in range(rounds):
            for k in range(lanes):
                v = x[k]
                v = v * a + b
                v = v * a + b
                v = v * a + b
                v = v * a + b
                v = v * a + b
                v = v * a + b
                v = v * a + b
                x[k] = v * a + b
        sums[t] = x.sum()
    return sums


@numba.njit(parallel=True)
def _add_into(a: np.ndarray, b: np.ndarray) -> None:  # pragma: no cover - compiled
    for i in numba.prange(a.shape[0]):
        a[i] += np.float32(0.5) * b[i]


def vector_rate(repeats: int) -> float:
    """float32 operations a second: every thread's chains of eight multiply-adds on
    2048 values in cache (a multiply-add counted as two)."""
    rounds, lanes = 12_500, 2048
    seconds = best_seconds(lambda: _multiply_adds(rounds, lanes), repeats)
    return 2 * 8 * rounds * lanes * numba.get_num_threads() / seconds


def memory_rate(repeats: int) -> float:
    """Bytes a second read and written by every thread adding one 1 GiB float32 array
    into another (three bytes moved per byte of either)."""
    a, b = np.ones(2 ** 28, np.float32), np.ones(2 ** 28, np.float32)
    return 3 * a.nbytes / best_seconds(lambda: _add_into(a, b), repeats)


def popcount(masks: np.ndarray) -> int:
    return int(np.unpackbits(masks.astype(np.uint8)).sum())


def work_counts(model, camera) -> dict:
    """The view's Gaussians, splats, intersections, pixels and evaluated pairs."""
    engine = make_engine(stored(model, True), 1, torch.zeros(3))
    with torch.no_grad():
        splats = project(engine.model, [camera]).of_camera(0)
        rows = (0, camera.height)
        bins = bin_tiles(splats.means2d, splats.radii, splats.depths, splats.keys, camera.width,
                         rows, splats.conics, splats.opacities)
        _, inputs = _kernel_inputs(splats.means2d, splats.conics, splats.colors, splats.depths,
                                   splats.opacities, torch.zeros(3), bins, camera.width, rows)
    shape = (camera.height, camera.width)
    last = np.empty(shape, np.int32)
    narrowed = np.zeros(len(bins.splat_ids), np.uint8)
    compositing_kernels.forward(*inputs, np.empty(shape + (3,), np.float32),
                                np.empty(shape, np.float32), np.empty(shape, np.float32), last,
                                narrowed)
    ys, xs = np.indices(shape)
    starts = bins.offsets.numpy()[(ys // TILE_SIZE) * bins.tiles_x + xs // TILE_SIZE]
    block = compositing_kernels.BLOCK
    return {"gaussians": len(model), "splats": len(splats.means2d),
            "intersections": len(bins.splat_ids), "pixels": shape[0] * shape[1],
            "binned_pairs": block * popcount(bins.blocks.numpy()),
            "narrowed_pairs": block * popcount(narrowed),
            "per_pixel_backward_pairs": int(np.maximum(last - starts + 1, 0).sum())}


def floors(measured: dict, counts: dict, memory_rate: float, arithmetic_rate: float) -> dict:
    """Per stage: measured ms, bytes and operations (in all and per Gaussian), floor ms
    and the measured time over it."""
    moved = bytes_per(counts)
    stages = {}
    for stage, ms in measured.items():
        if stage not in moved:
            continue
        operations = sum(counts[unit] * per for unit, per in OPERATIONS.get(stage, ()))
        floor_ms = 1e3 * max(moved[stage] / memory_rate, operations / arithmetic_rate)
        stages[stage] = {
            "ms": ms, "floor_ms": round(floor_ms, 2), "ratio": round(ms / floor_ms, 1),
            "bytes_per_gaussian": round(moved[stage] / counts["gaussians"], 1),
            "operations_per_gaussian": round(operations / counts["gaussians"], 1)}
    return stages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gaussians", type=int, default=1_000_000)
    parser.add_argument("--megapixels", type=float, default=1.0)
    parser.add_argument("--steps", type=int, default=9)
    parser.add_argument("--repeats", type=int, default=5, help="of the machine's rates")
    args = parser.parse_args()
    bandwidth, arithmetic_rate = memory_rate(args.repeats), vector_rate(args.repeats)
    model, cameras = garden_scene(args.gaussians)
    camera = scaled(cameras[0], args.megapixels)
    counts = work_counts(model, camera)
    measured = profile(GardenView(camera), model, args.steps, space_order=True)
    measured["loss"] += measured.pop("loss_backward")
    emit({"gaussians": args.gaussians, "width": camera.width, "height": camera.height,
          "bandwidth_gb_s": round(bandwidth / 1e9, 1),
          "vector_gflop_s": round(arithmetic_rate / 1e9, 1), "counts": counts,
          "step_ms": measured["step"],
          "stages": floors(measured, counts, bandwidth, arithmetic_rate)})


if __name__ == "__main__":
    main()

"""Our renderer on CUDA against gsplat's own ``rasterization()``; prints one JSON line.

The same Gaussians (the garden splats' points at 3DGS initialisation, or
``--gaussians`` of them jittered) and a garden camera; forward and backward of
the sum of the image, medians of ``--repeats`` runs after a warm-up (the
first call compiles gsplat's kernels): ``ours_ms`` (``project`` then
``rasterize``: the cuda backend, gsplat's kernels behind our contract, with
bands and key-ordered ties), ``gsplat_ms`` (its ``rasterization()``), their
ratio (the wrapper's overhead), the largest pixel
difference between the two images, and the peak GPU memory of each.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from splatscale.render import project, rasterize

from report import emit
from scenes import garden_scene


def timed(step, repeats: int) -> tuple[float, int]:
    """Median milliseconds of ``step()`` and its peak GPU memory."""
    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times), torch.cuda.max_memory_allocated()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gaussians", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/gpu_render.py: no CUDA device")
    from gsplat import rasterization

    model, cameras = garden_scene(args.gaussians)
    model = model.to(device="cuda").requires_grad_(True)
    camera = cameras[0]
    camera = type(camera)(camera.viewmat.cuda(), camera.K.cuda(), camera.width, camera.height)

    def ours():
        out = rasterize(project(model, [camera]).of_camera(0), camera.width, camera.height)
        out.rgb.sum().backward()
        return out.rgb.detach()

    def theirs():
        colors, _, _ = rasterization(
            model.means, model.quats, model.scales, model.opacities, model.sh,
            camera.viewmat[None], camera.K[None], camera.width, camera.height,
            sh_degree=model.sh_degree, packed=True)
        colors.sum().backward()
        return colors[0].detach()

    ours_ms, ours_peak = timed(ours, args.repeats)
    theirs_ms, theirs_peak = timed(theirs, args.repeats)
    emit({"gaussians": len(model), "width": camera.width, "height": camera.height,
                      "ours_ms": round(ours_ms, 3), "gsplat_ms": round(theirs_ms, 3),
                      "ratio": round(ours_ms / theirs_ms, 3),
                      "max_pixel_difference": float((ours() - theirs()).abs().max()),
                      "ours_peak_bytes": ours_peak, "gsplat_peak_bytes": theirs_peak})


if __name__ == "__main__":
    main()

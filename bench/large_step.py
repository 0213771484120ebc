"""One view of a large scene that sees about a tenth of it: seconds per step, one
device against offloaded, on the CPU; prints one JSON line.

The scene is ``bench/memory.py``'s ``large``: the garden splats laid 3 x 2 times
side by side (``--gaussians`` in all, at 3DGS initialisation), the first garden
camera looking at its own copy, a random target image. Per engine, after two
warm-up steps, the median of ``--steps`` steps of ``forward_backward`` (cull,
render, loss, backward) and of ``optimizer_step`` (Adam), and the images per
second of the two together. The offload engine on the CPU keeps every row in the
same host memory and updates only the rows a step saw (and those about to fall
too far behind): what a step pays follows what the view sees.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from splatscale.engine import TrainView
from splatscale.engine.factory import OffloadOptions, make_engine
from splatscale.strategy.default import GradientNorms

from memory import rates
from report import emit
from scenes import tiled_garden

ENGINES = {"local": {}, "offload": {"offload": OffloadOptions(forwarding=False)}}


def timed(engine, views: list[TrainView], steps: int) -> dict:
    for _ in range(2):  # warm-up: kernels compiled, memory kept
        engine.forward_backward(views, GradientNorms())
        engine.optimizer_step(rates())
    render, adam = [], []
    for _ in range(steps):
        start = time.perf_counter()
        result = engine.forward_backward(views, GradientNorms())
        middle = time.perf_counter()
        engine.optimizer_step(rates())
        render.append(middle - start)
        adam.append(time.perf_counter() - middle)
    step = statistics.median(r + a for r, a in zip(render, adam))
    return {"forward_backward_s": round(statistics.median(render), 3),
            "adam_s": round(statistics.median(adam), 3), "images_per_second": round(1 / step, 3),
            **{k: v for k, v in result.diagnostics.items() if k in ("candidates", "visible")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gaussians", type=int, default=4_500_000)
    parser.add_argument("--steps", type=int, default=7)
    args = parser.parse_args()
    model, cameras = tiled_garden(args.gaussians // 6, 3, 2)
    camera = cameras[0]
    target = torch.rand(camera.height, camera.width, 3, generator=torch.Generator().manual_seed(0))
    views = [TrainView(camera, target)]
    result: dict = {"gaussians": len(model), "width": camera.width, "height": camera.height}
    for name, options in ENGINES.items():
        engine = make_engine(model.detach(), 1, torch.zeros(3), **options)
        result[name] = timed(engine, views, args.steps)
        del engine
    emit(result)


if __name__ == "__main__":
    main()

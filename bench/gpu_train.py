"""Training on a GPU: images per second and peak GPU memory; prints one JSON line.

For ``local_engine`` and ``offload_engine`` (forwarding on, its default on a
GPU), each run alone after a warm-up:

- snowmiku (SfM points, its images), the Trainer's own steps at B = 1 and 4;
- ``--gaussians`` (1M) garden Gaussians seen by a garden camera, engine steps
  at B = 1 against a flat grey target (the speed of a step does not depend on
  what the image shows).

``peak_gpu_bytes`` is ``torch.cuda.max_memory_allocated`` over the timed run.
``--device cpu`` runs the same script on the CPU (no peak), to check it.
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import torch

from splatscale.data import load_scene
from splatscale.data.images import ImageStore
from splatscale.engine import TrainView
from splatscale.engine.local import local_engine
from splatscale.engine.offload import offload_engine

from memory import rates
from report import emit
from scenes import DATA, garden_scene
from step import run as trainer_run


def measured(device: str, timed_run) -> dict:
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    result = timed_run()
    if device == "cuda":
        result["peak_gpu_bytes"] = torch.cuda.max_memory_allocated()
    return result


def garden_run(make_engine, gaussians: int, steps: int) -> dict:
    model, cameras = garden_scene(gaussians)
    camera = cameras[0]
    view = TrainView(camera, torch.full((camera.height, camera.width, 3), 0.5))
    engine = make_engine(model, 1, torch.zeros(3))
    for _ in range(3):  # warm-up
        engine.forward_backward([view], track_stats=True)
        engine.optimizer_step(rates())
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        engine.forward_backward([view], track_stats=True)
        engine.optimizer_step(rates())
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return {"images_per_second": round(steps / (time.perf_counter() - start), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--images", type=int, default=400, help="timed snowmiku images")
    parser.add_argument("--gaussians", type=int, default=1_000_000)
    parser.add_argument("--garden-steps", type=int, default=50)
    args = parser.parse_args()
    engines = {"local": partial(local_engine, device=args.device),
               "offload": partial(offload_engine, device=args.device)}
    scene = load_scene(DATA / "snowmiku")
    store = ImageStore(scene, background=scene.background)
    out = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"}
    for name, make in engines.items():
        for batch_size in (1, 4):
            out[f"snowmiku_{name}_batch_{batch_size}"] = measured(args.device, partial(
                trainer_run, scene, store, make, batch_size, args.images))
        out[f"garden_{name}"] = measured(args.device, partial(
            garden_run, make, args.gaussians, args.garden_steps))
        out[f"garden_{name}"]["gaussians"] = args.gaussians
    emit(out)


if __name__ == "__main__":
    main()

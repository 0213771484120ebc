"""Training on a GPU: images per second and peak GPU memory; prints one JSON line.

For ``make_engine``'s engine on the device and with ``offload`` (forwarding and
lookahead on, their defaults on a GPU), each run alone after a warm-up:

- snowmiku (SfM points, its images), the Trainer's own steps at B = 1 and 4;
- ``--gaussians`` (1M) garden Gaussians seen by the three garden cameras in
  turn, engine steps at B = 1 against a flat grey target (the speed of a step
  does not depend on what the image shows), each told the next camera as the
  Trainer tells it; offloaded again with lookahead flipped from its default
  (off on a GPU, on on the CPU), to weigh it;
- ``splatscale train`` on snowmiku in one process and with 2 ranks on the one
  device (two ranks on one GPU talk over gloo through host memory; their
  exchange, partition and staging are the difference), ``--ranks-images``
  images at B = 2: the report's images per second, start-up excluded.

``peak_gpu_bytes`` is ``torch.cuda.max_memory_allocated`` over the timed run,
``peak_gpu_reserved_bytes`` ``max_memory_reserved`` (the allocator's pools too:
copies up have one of their own).
Offloaded garden runs add the bytes copied each way per step (every copy: the
culling bounds, keys and geometry refreshes beside the working set that
``host_to_device_bytes_per_step`` counts), the rate each direction's copies ran
at on the device, the share of the step's time they took there, the share the
compute stream still waited for (copies up run on a stream of their own; copies
down are waited for), the share of the copies up hidden behind its work, and
the share of the visible rows that were sent a step early.
``--device cpu`` runs the same script on the CPU (no peak), to check it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import torch

from splatscale.data import load_scene
from splatscale.data.images import ImageStore
from splatscale.engine import TrainView
from splatscale.engine.factory import OffloadOptions, make_engine
from splatscale.strategy.default import GradientNorms

from memory import rates
from report import emit
from scenes import DATA, garden_scene
from step import run as trainer_run


def measured(device: str, timed_run) -> dict:
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # what earlier runs left cached is not this run's
        torch.cuda.reset_peak_memory_stats()
    result = timed_run()
    if device == "cuda":
        result["peak_gpu_bytes"] = torch.cuda.max_memory_allocated()
        result["peak_gpu_reserved_bytes"] = torch.cuda.max_memory_reserved()
    return result


def garden_run(engine_factory, gaussians: int, steps: int) -> dict:
    """Engine steps over the garden cameras in turn, each step told the next one, as
    the Trainer tells it."""
    model, cameras = garden_scene(gaussians)
    views = [TrainView(c, torch.full((c.height, c.width, 3), 0.5)) for c in cameras]
    engine = engine_factory(model, 1, torch.zeros(3))

    def step(index: int) -> dict:
        engine.expect([views[(index + 1) % len(views)].camera], rates())
        result = engine.forward_backward([views[index % len(views)]], GradientNorms())
        engine.optimizer_step(rates())
        return result.diagnostics

    for index in range(3):  # warm-up
        step(index)
    transfers = getattr(engine.rows, "transfers", None)
    if transfers is not None:  # offloaded: this run's copies alone, timed
        transfers.timed, transfers.bytes = True, dict.fromkeys(transfers.bytes, 0)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    diagnostics = [step(index) for index in range(3, 3 + steps)]
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    result = {"images_per_second": round(steps / seconds, 3)}
    if transfers is not None:
        result.update(copies(transfers, steps, seconds))
        early = sum(d["sent_a_step_early"] for d in diagnostics)
        result["sent_a_step_early_share"] = round(early / sum(d["visible"] for d in diagnostics), 3)
    return result


def copies(transfers, steps: int, seconds: float) -> dict:
    """The bytes each way per step, the rates, and the shares of the step's time."""
    copying, result = transfers.seconds(), {}
    for direction, moved in transfers.bytes.items():
        result[f"copied_{direction}_bytes_per_step"] = round(moved / steps)
        if copying[direction]:
            result[f"{direction}_gb_per_second"] = round(moved / copying[direction] / 1e9, 2)
    up, down, waited = (copying[kind] for kind in ("host_to_device", "device_to_host",
                                                   "waited"))
    result["copy_share_of_step"] = round((up + down) / seconds, 3)
    result["exposed_copy_share_of_step"] = round((waited + down) / seconds, 3)
    if up:
        result["host_to_device_hidden_share"] = round(max(0.0, 1 - waited / up), 3)
    return result


def ranks_run(device: str, nproc: int, images: int) -> dict:
    """``splatscale train`` with ``nproc`` ranks (1: one process) on ``device``: its
    report's rate."""
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, "-m", "splatscale", "train", str(DATA / "snowmiku"),
                        "-o", out, "--device", device, "--nproc", str(nproc), "--batch-size",
                        "2", "--iterations", str(images), "--quiet"],
                       check=True, stdout=subprocess.DEVNULL)
        report = json.loads((Path(out) / "report.json").read_text())
    return {"images_per_second": round(report["images_per_second"], 3),
            "num_gaussians": report["num_gaussians"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--images", type=int, default=400, help="timed snowmiku images")
    parser.add_argument("--gaussians", type=int, default=1_000_000)
    parser.add_argument("--garden-steps", type=int, default=50)
    parser.add_argument("--ranks-images", type=int, default=400)
    args = parser.parse_args()
    engines = {"local": partial(make_engine, device=args.device),
               "offload": partial(make_engine, device=args.device, offload=OffloadOptions())}
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
    flipped = args.device == "cpu"  # lookahead's default flipped, to weigh it
    out[f"garden_offload_{'with' if flipped else 'without'}_lookahead"] = measured(
        args.device, partial(garden_run, partial(make_engine, device=args.device,
                                                 offload=OffloadOptions(lookahead=flipped)),
                             args.gaussians, args.garden_steps))
    alone, ranks = (ranks_run(args.device, nproc, args.ranks_images) for nproc in (1, 2))
    out["snowmiku_train_one_process"], out["snowmiku_train_2_ranks"] = alone, ranks
    out["two_ranks_speed_vs_one_process"] = round(ranks["images_per_second"]
                                                  / alone["images_per_second"], 3)
    emit(out)


if __name__ == "__main__":
    main()

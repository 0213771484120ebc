"""Training speed on one device against offloaded; prints one JSON line.

snowmiku (SfM points, 3DGS initialisation, its images), the Trainer's own
steps (default settings: no densification before image 500), for B = 1 and
4: images per second of the engine on one device, and offloaded with forwarding on
and off, each run after the others on an otherwise idle machine; for the
offload runs, the mean bytes moved host -> device and device -> host per step
and the fractions of the Gaussians culled as candidates and found visible.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

from splatscale.data import load_scene
from splatscale.data.images import ImageStore
from splatscale.engine.factory import OffloadOptions, make_engine
from splatscale.train.config import TrainConfig
from splatscale.train.trainer import RunOptions, Trainer

from report import emit
from scenes import DATA

ENGINES = {"local": make_engine,
           "offload_forwarding": partial(make_engine, offload=OffloadOptions(forwarding=True)),
           "offload_no_forwarding": partial(make_engine,
                                            offload=OffloadOptions(forwarding=False))}


def run(scene, store: ImageStore, engine_factory, batch_size: int, images: int) -> dict:
    config = TrainConfig(iterations=images + 8 * batch_size, batch_size=batch_size)
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(scene, store, config, RunOptions(Path(out), progress=False,
                                                           checkpoint_every=0),
                          make_engine=engine_factory)
        for _ in range(8):  # warm-up: kernels compiled, caches filled
            trainer.train_step()
        engine, moved, counts = trainer.engine, [], []
        start = time.perf_counter()
        while trainer.images_seen < config.iterations:
            measured = trainer.train_step()["diagnostics"]
            if "host_to_device_bytes" in measured:
                moved.append(measured["host_to_device_bytes"])
                counts.append((measured["candidates"], measured["visible"]))
        seconds = time.perf_counter() - start
    result = {"images_per_second": round(images / seconds, 3)}
    if moved:
        result["host_to_device_bytes_per_step"] = round(statistics.mean(moved))
        result["candidate_fraction"] = round(statistics.mean(c for c, _ in counts)
                                             / engine.num_gaussians(), 3)
        result["visible_fraction"] = round(statistics.mean(v for _, v in counts)
                                           / engine.num_gaussians(), 3)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("scene", nargs="?", default=str(DATA / "snowmiku"))
    parser.add_argument("--images", type=int, default=120, help="timed images per run")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args()
    scene = load_scene(args.scene)
    store = ImageStore(scene, background=scene.background)
    out = {"scene": args.scene}
    for batch_size in args.batch_sizes:
        runs = {name: run(scene, store, make, batch_size, args.images)
                for name, make in ENGINES.items()}
        local = runs["local"]["images_per_second"]
        for name in ("offload_forwarding", "offload_no_forwarding"):
            runs[name]["speed_vs_local"] = round(runs[name]["images_per_second"] / local, 3)
        out[f"batch_{batch_size}"] = runs
    emit(out)


if __name__ == "__main__":
    main()

"""Training quality and speed on a real scene; prints one JSON line.

Default: tests/data/snowmiku at 495x371 (``--resolution 2``: half) with every
8th image held out, default 3DGS settings, test PSNR/SSIM after 600 and 2000
images, for batch sizes 1 and 4. Rates count training time only (evaluation
excluded).

``--viewer`` trains each batch size twice, without and then with the live
viewer's page (``train --viewer``) watched by a client that says where its
camera is and reads everything it is sent, as a browser does, without drawing
it (a browser on the same cores would measure its drawing, not the viewer);
the rates with the viewer count its work between steps, ``splats_sent`` says
how often the model was sent, and ``viewer`` holds the ratios.

``--baseline DIR`` (a checkout of an earlier splatscale, e.g. a ``git
worktree``) first runs the same measurement with that code, in a subprocess,
then this one (``--after-first``: the other way round), never both at once, and
prints a before/after table on stderr;
the JSON line holds both runs and the speed ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

from splatscale.data import load_scene
from splatscale.data.images import ImageStore
from splatscale.train.config import TrainConfig
from splatscale.train.trainer import RunOptions, Trainer
from splatscale.viewer.live import LiveRun

from report import emit
from warm import compiled_for

WARM_UP = 100  # images
DEFAULT_SCENE = Path(__file__).resolve().parents[1] / "tests" / "data" / "snowmiku"


@contextmanager
def watched(trainer: Trainer) -> Iterator[LiveRun]:
    """The live viewer's page of ``trainer``'s run, a client reading it."""
    import viser
    from websockets.sync.client import connect

    from splatscale.viewer.app import live_run, served
    from splatscale.viewer.page import Scenery

    with served("127.0.0.1", 0) as server:
        scenery = Scenery(trainer.store, trainer.train_ids, trainer.test_ids)
        live = live_run(server, scenery, trainer.background, "bench")
        with connect(f"ws://127.0.0.1:{server.get_port()}", max_size=None,
                     subprotocols=[f"viser-v{viser.__version__}"]) as client:
            client.send(_camera_message())  # viser counts a client from its first camera
            threading.Thread(target=_read_all, args=(client,), daemon=True).start()
            yield live


def _camera_message() -> bytes:
    """What a browser sends first: where its camera is (viser's wire format)."""
    import msgspec
    from viser._messages import ViewerCameraMessage

    camera = ViewerCameraMessage(wxyz=(1.0, 0.0, 0.0, 0.0), position=(0.0, 0.0, -3.0),
                                 fov=1.0, near=0.01, far=1000.0, image_height=800,
                                 image_width=1280, look_at=(0.0, 0.0, 0.0),
                                 up_direction=(0.0, -1.0, 0.0))
    return msgspec.msgpack.encode(camera.as_serializable_dict())


def _read_all(client) -> None:
    try:
        for _ in client:
            pass
    except Exception:  # noqa: BLE001 - the page closing ends the reading
        return


def run(scene, batch_size: int, marks: list[int], resolution: int, seed: int,
        viewer: bool = False) -> dict:
    store = ImageStore(scene, resolution=resolution, background=scene.background)
    config = TrainConfig(iterations=marks[-1], batch_size=batch_size, seed=seed)
    with tempfile.TemporaryDirectory() as out, ExitStack() as stack:
        trainer = Trainer(scene, store, config, RunOptions(Path(out), eval_split=True,
                                                           progress=False, checkpoint_every=0))
        compiled_for(trainer)
        live = stack.enter_context(watched(trainer)) if viewer else None
        result, seconds = {"batch_size": batch_size}, 0.0
        start_gaussians = trainer.engine.num_gaussians()
        for mark in marks:
            start = time.perf_counter()
            while trainer.images_seen < mark:
                entry = trainer.train_step()
                if live is not None:
                    trainer.serve_watcher(live, entry, lambda: False)
            seconds += time.perf_counter() - start
            test = trainer.evaluate()
            print(f"batch {batch_size}: {mark} images, {seconds:.0f} s, "
                  f"test PSNR {test['psnr']:.2f}", file=sys.stderr)
            result[str(mark)] = {
                "test_psnr": round(test["psnr"], 3), "test_ssim": round(test["ssim"], 4),
                "iterations_per_second": round(trainer.images_seen / seconds, 3),
                "steps_per_second": round(trainer.steps / seconds, 3),
                "num_gaussians": trainer.engine.num_gaussians(),
            }
            if live is not None:
                result[str(mark)]["splats_sent"] = live.splats_sent
        result["initial_gaussians"] = start_gaussians
    return result


def measure(args) -> dict:
    scene = load_scene(args.scene)
    if args.viewer:  # neither side of the ratio pays for the first run's loading and warming
        run(scene, args.batch_sizes[0], [WARM_UP], args.resolution, args.seed)
    runs = [run(scene, b, sorted(args.marks), args.resolution, args.seed)
            for b in args.batch_sizes]
    result = {"scene": args.scene, "resolution": args.resolution, "seed": args.seed,
              "views": len(scene.views), "runs": runs}
    if args.viewer:
        result["watched_runs"] = [run(scene, b, sorted(args.marks), args.resolution, args.seed,
                                      viewer=True) for b in args.batch_sizes]
        result["viewer"] = {
            f"batch_{new['batch_size']}_{mark}": round(new[mark]["iterations_per_second"]
                                                       / old[mark]["iterations_per_second"], 3)
            for old, new in zip(runs, result["watched_runs"]) for mark in new if mark.isdigit()}
    result["peak_memory_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return result


def baseline_measure(args) -> dict:
    """This script's measurement with the splatscale of ``args.baseline``."""
    # Imported here, not at the top: the child runs this script with a splatscale that
    # may predate the module.
    from splatscale.vector_width import CHOSEN, chosen_by_splatscale

    command = [sys.executable, __file__, args.scene, "--resolution", str(args.resolution),
               "--seed", str(args.seed),
               "--batch-sizes", *map(str, args.batch_sizes), "--marks", *map(str, args.marks)]
    env = dict(os.environ, PYTHONPATH=str(args.baseline.resolve()))
    if chosen_by_splatscale(env):  # this code's target: the baseline chooses its own
        del env["NUMBA_CPU_FEATURES"], env[CHOSEN]
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def compared(before: dict, after: dict) -> dict:
    """Per batch size and mark: speed after / before and the PSNR change."""
    table = {}
    for old, new in zip(before["runs"], after["runs"]):
        for mark in (k for k in new if k.isdigit()):
            table[f"batch_{new['batch_size']}_{mark}"] = {
                "it_s_before": old[mark]["iterations_per_second"],
                "it_s_after": new[mark]["iterations_per_second"],
                "speedup": round(new[mark]["iterations_per_second"]
                                 / old[mark]["iterations_per_second"], 3),
                "psnr_before": old[mark]["test_psnr"], "psnr_after": new[mark]["test_psnr"]}
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("scene", nargs="?", default=str(DEFAULT_SCENE))
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--marks", type=int, nargs="+", default=[600, 2000],
                        help="images seen at which to evaluate")
    parser.add_argument("--resolution", type=int, default=1, help="downscale factor")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--baseline", type=Path, help="a checkout to compare against")
    parser.add_argument("--after-first", action="store_true",
                        help="with --baseline, measure this code first (to see whether the "
                             "order, not the code, makes the difference)")
    parser.add_argument("--viewer", action="store_true",
                        help="also train with the live viewer, and give the speed ratios")
    args = parser.parse_args()
    if args.baseline is None:
        emit(measure(args))
        return
    if args.after_first:
        after = measure(args)
        before = baseline_measure(args)
    else:
        before = baseline_measure(args)
        after = measure(args)
    table = compared(before, after)
    for name, row in table.items():
        print(f"{name}: {row['it_s_before']} -> {row['it_s_after']} it/s "
              f"({row['speedup']}x), test PSNR {row['psnr_before']} -> {row['psnr_after']}",
              file=sys.stderr)
    emit({"before": before, "after": after, "compared": table})


if __name__ == "__main__":
    main()

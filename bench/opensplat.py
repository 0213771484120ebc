"""Side by side with OpenSplat's CPU mode (a C++ 3DGS trainer on libtorch); prints
one JSON line.

OpenSplat is not a dependency: build it (its README; ``-DGPU_RUNTIME=CPU``) and
give its binary with ``--opensplat``. Both trainers see the same training views of
``SCENE`` (a COLMAP scene with ``sparse/0`` and ``images``; every 8th view by name
held out: OpenSplat is given a copy of the model without them), at the same
resolution, from the same SfM points, at batch 1, for the first ``--images`` images
of a run of ``--schedule`` images (OpenSplat's schedules follow the run's length:
it densifies until half of it, and its position learning rate decays over all of
it; splatscale's, 3DGS's, are counted in images whatever the length). Each
trainer keeps its own defaults, except that OpenSplat starts at full resolution, as
3DGS does (``--num-downscales 0``); OpenSplat is stopped once it
has saved its model of image ``--images``. splatscale's evaluator scores both
models on the held-out views (OpenSplat's over black and over the colour it trained
on). OpenSplat runs first, then splatscale, never both at once.

A rate counts training only: OpenSplat's is its steps after the first over the
time from its first step's line to the line of step ``--images`` (its image
loading left out); splatscale's as ``train.py`` counts it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pycolmap
import torch
from plyfile import PlyData, PlyElement

from splatscale.data import load_scene
from splatscale.data.images import ImageStore
from splatscale.errors import SplatscaleError
from splatscale.model.files import read_model
from splatscale.render import render
from splatscale.train.metrics import ImageMetrics

from report import emit
from train import DEFAULT_SCENE, run

# OpenSplat composites its renders over this colour (its model.hpp: nerfstudio's).
OPENSPLAT_BACKGROUND = (0.6130, 0.0101, 0.3984)


def training_copy(scene_dir: Path, test_names: set[str], folder: Path) -> Path:
    """A COLMAP project in ``folder`` whose model lacks the views ``test_names``."""
    source = scene_dir / "sparse" / "0"
    if not (source.is_dir() and (scene_dir / "images").is_dir()):
        sys.exit(f"{scene_dir}: OpenSplat needs a COLMAP scene of sparse/0 and images/")
    model = pycolmap.Reconstruction(source)
    for image in list(model.images.values()):
        if image.name in test_names:
            model.deregister_frame(image.frame_id)
    sparse = folder / "sparse" / "0"
    sparse.mkdir(parents=True)
    model.write(sparse)
    return folder


def opensplat_run(binary: Path, project: Path, images_dir: Path, images: int,
                  schedule: int, resolution: int, folder: Path) -> tuple[dict, Path]:
    """OpenSplat's first ``images`` steps of a ``schedule``-step run, stopped once it
    has saved their model: its rate (module docstring) and that model's file."""
    saved = folder / f"opensplat_{images}.ply"
    command = [str(binary), str(project), "--colmap-image-path", str(images_dir), "--cpu",
               "-n", str(schedule), "-s", str(images), "-d", str(resolution),
               "--num-downscales", "0", "--keep-crs", "-o", str(folder / "opensplat.ply")]
    step_times: list[float] = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
        assert process.stdout is not None  # stdout=PIPE
        for line in process.stdout:
            if line.startswith("Step ") and len(step_times) < images:
                step_times.append(time.perf_counter())
            elif line.strip() == f"Wrote {saved}":
                process.terminate()
                break
    if len(step_times) != images or not saved.is_file():
        sys.exit(f"opensplat: exit {process.returncode} after {len(step_times)} steps, "
                 f"without {saved.name}")
    seconds = step_times[-1] - step_times[0]
    return {"iterations_per_second": round((images - 1) / seconds, 3),
            "seconds": round(seconds, 1)}, saved


def finite_copy(ply: Path, out: Path) -> tuple[int, int]:
    """Writes the model file ``ply`` to ``out`` without its Gaussians that hold a NaN or
    infinite value (splatscale refuses such a model); returns how many Gaussians it
    had and how many it left out."""
    data = PlyData.read(ply)
    rows = data["vertex"].data
    finite = np.all([np.isfinite(rows[name]) for name in rows.dtype.names], axis=0)
    PlyData([PlyElement.describe(rows[finite], "vertex")], comments=data.comments).write(out)
    return len(rows), int((~finite).sum())


def evaluated(ply: Path, store: ImageStore, ids: list[int]) -> dict:
    """Test metrics of the model file ``ply`` over views ``ids``, rendered by splatscale
    over black (as ``splatscale eval`` scores it) and over OpenSplat's background (as
    OpenSplat renders it)."""
    model = read_model(ply).model
    scores = {}
    for name, colour in (("black", (0.0, 0.0, 0.0)), ("own", OPENSPLAT_BACKGROUND)):
        metrics = ImageMetrics()
        background = torch.tensor(colour, dtype=model.means.dtype)
        for i in ids:
            with torch.no_grad():
                rgb = render(model, store.camera(i), background=background).rgb
            metrics.add(rgb.clamp(0, 1), store.as_float(i))
        scores.update({f"test_{k}_{name}_background": round(v, 4)
                       for k, v in metrics.summary().items()})
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scene", nargs="?", type=Path, default=DEFAULT_SCENE)
    parser.add_argument("--opensplat", type=Path, required=True, help="its binary")
    parser.add_argument("--resolution", type=int, default=1, choices=[1, 2, 4, 8])
    parser.add_argument("--images", type=int, default=2000, help="images trained on")
    parser.add_argument("--schedule", type=int, default=30_000,
                        help="the length of the run they begin (3DGS's: 30,000)")
    parser.add_argument("--seed", type=int, default=0,
                        help="splatscale's (OpenSplat seeds itself, always alike)")
    parser.add_argument("--keep-model", type=Path, help="where to copy OpenSplat's model")
    args = parser.parse_args()
    if not 2 <= args.images <= args.schedule:
        parser.error("--images: from 2 to --schedule")
    if not (args.opensplat.is_file() and os.access(args.opensplat, os.X_OK)):
        parser.error(f"--opensplat {args.opensplat}: not an executable file")

    try:
        scene = load_scene(args.scene)
    except SplatscaleError as error:
        parser.error(str(error))
    _, test_ids = scene.split(True)
    with tempfile.TemporaryDirectory() as tmp:
        project = training_copy(args.scene, {scene.views[i].image_path.name for i in test_ids},
                                Path(tmp) / "project")
        theirs, ply = opensplat_run(args.opensplat, project, args.scene / "images",
                                    args.images, args.schedule, args.resolution, Path(tmp))
        if args.keep_model is not None:
            shutil.copyfile(ply, args.keep_model)
        finite = Path(tmp) / "finite.ply"
        theirs["num_gaussians"], theirs["non_finite_gaussians_left_out"] = \
            finite_copy(ply, finite)
        store = ImageStore(scene, resolution=args.resolution, background=scene.background)
        theirs.update(evaluated(finite, store, test_ids))
    ours = run(scene, 1, [args.images], args.resolution, args.seed)[str(args.images)]
    emit({"scene": str(args.scene), "resolution": args.resolution, "images": args.images,
          "schedule": args.schedule, "sfm_points": len(scene.points),
          "opensplat": theirs, "splatscale": ours,
          "speedup": round(ours["iterations_per_second"]
                           / theirs["iterations_per_second"], 3)})


if __name__ == "__main__":
    main()

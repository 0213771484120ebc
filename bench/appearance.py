"""Exposure and white balance that change: test PSNR with and without ``--appearance
affine``; prints one JSON line.

Makes a capture with exposure changes from a scene (default tests/data/snowmiku):
every training image (all but every 8th by name, the test views of ``--eval``)
gets, seeded, an exposure change of up to +-1 stop and a white balance change of
up to +-0.5 stop per channel (the sum clipped to +-1 stop), applied in linear
light as a camera's gain would be, clipped and written as JPEG; the test images
stay the unchanged photos, so each run's test PSNR is against the unchanged
capture. The poses and points are the scene's own. Then trains (the command line,
``--eval``, the run settings given) the unchanged scene plainly ("reference"), the
changed one plainly ("plain") and with ``--appearance affine`` ("affine"), and
reports each run's test metrics from its report.json, and for every run alike
the right half of each saved test render under a colour transform fitted on its
left half (``fitted_right_half``, the score report.json gives affine runs alone).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from splatscale.step.appearance import fitted_right_half
from splatscale.train.metrics import ImageMetrics

from report import emit
from scenes import DATA

EVERY = 8          # the test split of --eval: every 8th view by name
MAX_STOPS = 1.0    # exposure and the sum with white balance, per channel
WHITE_BALANCE_STOPS = 0.5
JPEG_QUALITY = 95


def srgb_to_linear(x: np.ndarray) -> np.ndarray:
    return np.where(x <= 0.04045, x / 12.92, ((x + 0.055) / 1.055) ** 2.4)


def linear_to_srgb(x: np.ndarray) -> np.ndarray:
    return np.where(x <= 0.0031308, 12.92 * x, 1.055 * np.power(x, 1 / 2.4) - 0.055)


def changed_capture(source: Path, target: Path, seed: int) -> dict[str, list[float]]:
    """``source``'s scene in ``target`` with its training images' exposure and white
    balance changed; each changed image's per-channel change in stops, by name. A
    capture made before from the same scene and seed is kept (runs of it may be under
    way, and its images' cache stays valid)."""
    record = target / "stops.json"
    made = {"source": str(source.resolve()), "seed": seed}
    if record.is_file():
        saved = json.loads(record.read_text())
        if saved["made"] == made:
            return saved["stops"]
    if target.exists():
        shutil.rmtree(target)
    (target / "images").mkdir(parents=True)
    shutil.copytree(source / "sparse", target / "sparse")
    rng = np.random.default_rng(seed)
    stops = {}
    for index, path in enumerate(sorted((source / "images").iterdir())):
        if index % EVERY == 0:  # a test view: the unchanged photo
            shutil.copyfile(path, target / "images" / path.name)
            continue
        change = np.clip(rng.uniform(-MAX_STOPS, MAX_STOPS)
                         + rng.uniform(-WHITE_BALANCE_STOPS, WHITE_BALANCE_STOPS, 3),
                         -MAX_STOPS, MAX_STOPS)
        pixels = np.asarray(Image.open(path).convert("RGB"), dtype=np.float64) / 255
        linear = np.clip(srgb_to_linear(pixels) * 2.0 ** change, 0, 1)
        encoded = np.round(linear_to_srgb(linear) * 255).astype(np.uint8)
        Image.fromarray(encoded).save(target / "images" / path.name, quality=JPEG_QUALITY)
        stops[path.name] = [round(float(s), 3) for s in change]
    record.write_text(json.dumps({"made": made, "stops": stops}))
    return stops


def as_float(path: Path) -> torch.Tensor:
    return torch.from_numpy(np.asarray(Image.open(path).convert("RGB"), np.float32) / 255)


def fitted_scores(renders: Path) -> dict[str, float]:
    """PSNR and SSIM of the right halves of a run's saved test renders
    (``NAME.png`` beside ``NAME.photo.png``) under transforms fitted on the left."""
    metrics = ImageMetrics()
    for photo in sorted(renders.glob("*.photo.png")):
        render = renders / photo.name.replace(".photo.png", ".png")
        metrics.add(*fitted_right_half(as_float(render), as_float(photo)))
    return metrics.summary()


def train(scene: Path, output: Path, settings: list[str], extra: list[str]) -> dict:
    """The test metrics of a run of ``splatscale train`` with ``--eval``."""
    subprocess.run([sys.executable, "-m", "splatscale", "train", str(scene), "-o", str(output),
                    "--eval", "--quiet", "--overwrite", *settings, *extra], check=True)
    report = json.loads((output / "report.json").read_text())
    return {**{key: value for key, value in report.items()
               if key in ("test", "num_gaussians", "appearance")},
            "saved_renders_fitted_right_half": fitted_scores(output / "renders" / "test")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("scene", nargs="?", type=Path, default=DATA / "snowmiku")
    parser.add_argument("--work", type=Path, default=Path("/tmp/appearance"),
                        help="where the changed capture and the runs go")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", nargs="+", default=["reference", "plain", "affine"],
                        choices=("reference", "plain", "affine"))
    parser.add_argument("--resolution", default="4")
    parser.add_argument("--schedule-scale", default="0.1")
    args = parser.parse_args()
    changed = args.work / "changed"
    stops = changed_capture(args.scene, changed, args.seed)
    settings = ["--resolution", args.resolution, "--schedule-scale", args.schedule_scale]
    runs = {"reference": (args.scene, []), "plain": (changed, []),
            "affine": (changed, ["--appearance", "affine"])}
    results = {name: train(runs[name][0], args.work / name, settings, runs[name][1])
               for name in args.runs}
    spread = np.array(list(stops.values()))
    emit({"bench": "appearance", "scene": str(args.scene), "seed": args.seed,
          "resolution": int(args.resolution), "schedule_scale": float(args.schedule_scale),
          "changed_images": len(stops), "stops_min": float(spread.min()),
          "stops_max": float(spread.max()), **results})


if __name__ == "__main__":
    main()

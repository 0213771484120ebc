"""`splatscale prepare` on snowmiku: time per stage, registered fraction and pose error
against the scene's given poses, from its photos and from a video of them; then the
quality that matters: test PSNR after training on the prepared scene and on the
given one, over the same test views (every 8th by name). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from splatscale.data import load_scene
from splatscale.data.images import ImageStore
from splatscale.prepare.alignment import pose_errors
from splatscale.prepare.pipeline import Request, prepare
from splatscale.prepare.sfm import SfmSettings
from splatscale.train.config import TrainConfig
from splatscale.train.trainer import RunOptions, Trainer

from report import emit
from scenes import DATA, write_video
from warm import compiled_for


def poses(scene) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {Path(view.camera.name).name: (view.camera.viewmat[:3, :3].numpy(),
                                          view.camera.center.numpy()) for view in scene.views}


def accuracy(prepared: dict, known_scene) -> dict:
    angles, distances = pose_errors(prepared, poses(known_scene))
    extent = known_scene.camera_extent(list(range(len(known_scene.views))))
    return {"median_rotation_deg": round(float(np.median(angles)), 3),
            "median_centre_error_of_extent": round(float(np.median(distances)) / extent, 5)}


def prepared(source: Path, output: Path, frames: int, mapper: str) -> tuple[dict, float]:
    start = time.perf_counter()
    report = prepare(Request(source, output, frames, SfmSettings(mapper=mapper),
                             progress=False))
    return report, round(time.perf_counter() - start, 1)


def test_psnr(scene_path: Path, test_names: set[str], images: int) -> float:
    """Train ``images`` images on the scene's views not in ``test_names``; their PSNR."""
    scene = load_scene(scene_path)
    names = [Path(view.camera.name).name for view in scene.views]
    split = ([i for i, n in enumerate(names) if n not in test_names],
             [i for i, n in enumerate(names) if n in test_names])
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(scene, ImageStore(scene, background=scene.background),
                          TrainConfig(iterations=images),
                          RunOptions(Path(out), progress=False, checkpoint_every=0, split=split))
        compiled_for(trainer)
        while trainer.images_seen < images:
            trainer.train_step()
        return round(trainer.evaluate()["psnr"], 3)


def upscaled(photos: list[Path], folder: Path, megapixels: float) -> Path:
    """The photos resized to about ``megapixels`` each, as a phone's would be."""
    from PIL import Image

    folder.mkdir()
    for photo in photos:
        with Image.open(photo) as image:
            factor = (megapixels * 1e6 / (image.width * image.height)) ** 0.5
            size = (round(image.width * factor), round(image.height * factor))
            image.resize(size, Image.Resampling.LANCZOS).save(folder / photo.name, quality=95)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--frames", type=int, default=40, help="frames taken from the video")
    parser.add_argument("--mapper", choices=("incremental", "global"), default="incremental")
    parser.add_argument("--train-images", type=int, default=2000,
                        help="images trained on each scene (0: no training)")
    parser.add_argument("--megapixels", type=float, default=None,
                        help="prepare the photos upscaled to about this size (timing only)")
    args = parser.parse_args()
    known = load_scene(DATA / "snowmiku")
    photos = sorted((DATA / "snowmiku" / "images").iterdir())
    result = {"photos": len(photos), "mapper": args.mapper}
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        source = DATA / "snowmiku" / "images"
        if args.megapixels:
            source = upscaled(photos, work / "upscaled", args.megapixels)
            result["megapixels"] = args.megapixels
        report, seconds = prepared(source, work / "photos", 0, args.mapper)
        result["from_photos"] = {"seconds": seconds, "stages": report["seconds"],
                                 "registered": f"{report['registered']}/{report['images']}",
                                 **accuracy(poses(load_scene(work / "photos")), known)}
        write_video(sorted(source.iterdir()), work / "orbit.mp4")
        report, seconds = prepared(work / "orbit.mp4", work / "video", args.frames, args.mapper)
        # A frame's name holds its index in the video, which is the photo's in the list.
        from_video = {photos[int(name.rsplit("_", 1)[1][:6])].name: pose
                      for name, pose in poses(load_scene(work / "video")).items()}
        result["from_video"] = {"seconds": seconds, "stages": report["seconds"],
                                "registered": f"{report['registered']}/{report['images']}",
                                **accuracy(from_video, known)}
        if args.train_images and not args.megapixels:
            test_names = {photo.name for photo in photos[::8]}
            result["test_psnr"] = {
                "given_poses": test_psnr(DATA / "snowmiku", test_names, args.train_images),
                "prepared": test_psnr(work / "photos", test_names, args.train_images),
                "images": args.train_images, "test_views": len(test_names)}
    emit(result)


if __name__ == "__main__":
    main()

"""``splatscale prepare``: photos or videos to a COLMAP scene, stage by stage.

Every check that can fail on the input (the files found, the output folder apart
from them, every photo decoded, every video opened and its frames counted, the
output folder and its lock) runs before the output folder is written, and the
notices said meanwhile wait until they have all passed. Then: images (normalised
once, so SfM and training read the same pixels), features, matching, mapping, the
largest model written to ``sparse/0``. Each stage shows its progress and is timed.
"""

from __future__ import annotations

import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Iterator

from tqdm import tqdm

from splatscale.errors import DataError
from splatscale.folder_lock import locked_folder
from splatscale.messages import held, notice
from splatscale.prepare.frames import count_frames, extract_frames
from splatscale.prepare.photos import Photo, inspect_photo, write_photo
from splatscale.prepare.scene_folder import (MAPPING_SCRATCH, SceneFolder, check_names,
                                             frame_name, image_names, source_record)
from splatscale.prepare.sfm import (SfmSettings, extract_features, image_pairs, map_scene,
                                    match_features, quiet_logs)
from splatscale.data.media import MIN_VIEWS, Sources, a_few, find_sources, unread


DEFAULT_FRAMES = 100  # taken from the videos, in all, where --frames is not given


@dataclass(frozen=True)
class Request:
    input: Path
    output: Path
    frames: int | None          # taken from the videos, in all (None: DEFAULT_FRAMES)
    sfm: SfmSettings
    overwrite: bool = False
    verbose: bool = False
    progress: bool = True


@dataclass
class Inputs:
    """The checked input: photos inspected, or videos with the frames taken from each."""

    sources: Sources
    photos: list[Photo]
    frames: dict[Path, tuple[int, int]]  # video: (frames to take, frames it holds)
    record: dict[str, dict[str, int]]    # what the scene is made from (scene_folder)


def prepare(request: Request) -> dict:
    """Check everything, then make the scene; the report of what SfM found."""
    quiet_logs(request.verbose)
    folder = SceneFolder(request.output)
    with ExitStack() as lock:
        with held():
            inputs = check_inputs(request)
            request = _with_matcher(request, inputs)
            settings = recorded_settings(request, inputs)
            lock.enter_context(locked_folder(folder.path))
            manifest = folder.check(settings, inputs.record, request.overwrite)
        if manifest is None:
            folder.clear()
            manifest = {"settings": settings, "sources": inputs.record}
        else:
            folder.tidy()
        return _make_scene(request, inputs, folder, manifest)


def check_inputs(request: Request) -> Inputs:
    """Every input file checked (nothing written): the output folder apart from them,
    each photo decoded, each video's frames counted, no two of their images of one
    name; notices for what is skipped, the videos that hold fewer frames than their
    headers list, and those that hold fewer than asked."""
    sources = find_sources(request.input)
    if sources.photos and request.frames is not None:
        raise DataError(f"--frames: takes frames from a video; {request.input} holds photos, "
                        "each of which is taken")
    _check_apart(request.output, request.input, sources)
    _tell_skipped(request.input, sources)
    photos = [inspect_photo(path) for path in _bar(request, sources.photos, "checking images",
                                                   "image")]
    check_names([(photo.source, photo.name) for photo in photos]
                + [(video, frame_name(video, 0)) for video in sources.videos])
    counts = {video: count_frames(video) for video in sources.videos}
    wanted = DEFAULT_FRAMES if request.frames is None else request.frames
    return Inputs(sources, photos, _share_frames(wanted, counts),
                  source_record(sources.files))


def _tell_skipped(given: Path, sources: Sources) -> None:
    """Name what the input folder holds that is not read."""
    if sources.others:
        notice(f"{given}: skipping {_files(sources.others)} neither photo nor video: "
               f"{a_few([path.name for path in sources.others])}")
    if sources.hidden:
        notice(f"{given}: skipping {_files(sources.hidden, 'dot-named ')}: "
               f"{a_few([path.name for path in sources.hidden])}")
    if sources.subfolders:
        notice(f"{given}: {unread(sources.subfolders)}")


def _files(paths: tuple[Path, ...], kind: str = "") -> str:
    return f"{len(paths)} {kind}file{'s' if len(paths) > 1 else ''}"


def _check_apart(output: Path, given: Path, sources: Sources) -> None:
    """Refuse an output folder that holds the input, or any of its files, or lies
    inside it (paths compared with links followed): clearing or writing it could
    reach the user's files."""
    scene = output.resolve()
    for path in (given, *sources.files):
        if path.resolve().is_relative_to(scene):
            raise DataError(f"{output}: holds the input {path}; choose a scene folder "
                            "apart from the photos and videos")
    if scene.is_relative_to(given.resolve()):
        raise DataError(f"{output}: inside the input {given}; choose a scene folder "
                        "apart from the photos and videos")


def _with_matcher(request: Request, inputs: Inputs) -> Request:
    """``request`` with its matcher chosen: sequential for video frames, else exhaustive."""
    if request.sfm.matcher is not None:
        return request
    return replace(request, sfm=replace(
        request.sfm, matcher="sequential" if inputs.sources.videos else "exhaustive"))


def recorded_settings(request: Request, inputs: Inputs) -> dict:
    """What a continued scene must have been made with: ``frames``, those taken."""
    taken = sum(take for take, _ in inputs.frames.values())
    return {"input": str(request.input.resolve()), "camera_model": request.sfm.camera_model,
            "max_image_size": request.sfm.max_image_size,
            "frames": taken if inputs.sources.videos else None}


def _share_frames(wanted: int, counts: dict[Path, int]) -> dict[Path, tuple[int, int]]:
    """The frames to take from each video: ``wanted`` in all, in proportion to their
    lengths, at least one each and never more than a video has (a notice says when
    they hold fewer than ``wanted``: all are taken)."""
    total = sum(counts.values())
    if counts and total < wanted:
        videos = str(next(iter(counts))) if len(counts) == 1 else f"the {len(counts)} videos"
        notice(f"--frames {wanted}: {videos} hold{'s' if len(counts) == 1 else ''} {total} "
               f"frames; all {total} are taken")
    shares = {video: (min(n, max(1, round(wanted * n / total))), n)
              for video, n in counts.items()}
    taken = sum(share for share, _ in shares.values())
    if counts and taken < MIN_VIEWS:
        raise DataError(f"{', '.join(map(str, counts))}: {taken} frames in all; structure "
                        f"from motion needs at least {MIN_VIEWS} views")
    return shares


def _bar(request: Request, items=None, desc: str = "", unit: str = "", total=None):
    return tqdm(items, total=total, desc=desc, unit=unit, leave=False,
                disable=not request.progress)


@contextmanager
def _stage(times: dict, name: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    times[name] = round(time.perf_counter() - start, 2)


def _make_scene(request: Request, inputs: Inputs, folder: SceneFolder, manifest: dict) -> dict:
    times: dict[str, float] = {}
    with _stage(times, "images"):
        reused_images = _images_present(folder, manifest)
        if reused_images:
            notice(f"reusing the {len(image_names(manifest))} images in {folder.images}")
        else:
            folder.write_manifest(manifest)  # first: the folder is prepare's from here
            folder.publish_images(manifest, _write_images(request, inputs,
                                                          folder.staged_images))
    names = image_names(manifest)
    with _stage(times, "features"), _bar(request, total=len(names), desc="features",
                                         unit="image") as bar:
        reused_features = extract_features(folder.database, folder.images, manifest["cameras"],
                                           request.sfm, bar.update)
    matcher = request.sfm.matcher
    assert matcher is not None, "prepare chooses it first (_with_matcher)"
    pairs = image_pairs(manifest["sequences"], matcher)
    with _stage(times, "matching"), _bar(request, total=len(pairs),
                                         desc=f"matching ({matcher})",
                                         unit="pair") as bar:
        reused_pairs = match_features(folder.database, pairs, bar.update)
    if reused_features or reused_pairs:
        notice(f"reusing {folder.database}: features of {reused_features} images, matches "
               f"of {reused_pairs} pairs")
    with _stage(times, "mapping"), _bar(request, total=len(names),
                                        desc=f"mapping ({request.sfm.mapper})",
                                        unit="image") as bar, \
            tempfile.TemporaryDirectory(dir=folder.path, prefix=MAPPING_SCRATCH) as scratch:
        models = map_scene(folder.database, folder.images, Path(scratch), request.sfm,
                           bar.update)
        model = max(models.values(), key=lambda m: m.num_reg_images(), default=None)
        _check_registered(folder, model, len(names))
        folder.publish_model(model)
    report = _report(request, folder, model, names, len(pairs), times,
                     {"images": reused_images, "features": reused_features,
                      "pairs": reused_pairs})
    manifest["report"] = report
    folder.write_manifest(manifest)
    _tell(report)
    return report


def _images_present(folder: SceneFolder, manifest: dict) -> bool:
    names = image_names(manifest)
    return bool(names) and all((folder.images / name).is_file() for name in names)


def _write_images(request: Request, inputs: Inputs, staged: Path) -> dict:
    """Write the images into the folder ``staged``, whose files are published to
    ``images/`` once all are written: ``cameras`` (groups of names sharing one camera)
    and ``sequences`` (names in capture order, one list per video; one list of photos)."""
    staged.mkdir()
    if inputs.photos:
        for photo in _bar(request, inputs.photos, "writing images", "image"):
            write_photo(photo, staged)
        cameras: dict[tuple, list[str]] = {}
        for photo in inputs.photos:
            cameras.setdefault(photo.camera, []).append(photo.name)
        sequences = [[photo.name for photo in inputs.photos]]
        groups = list(cameras.values())
    else:
        with _bar(request, total=sum(n for _, n in inputs.frames.values()),
                  desc="decoding video", unit="frame") as bar:
            sequences = [extract_frames(video, take, total, staged, bar.update)
                         for video, (take, total) in inputs.frames.items()]
        groups = sequences
    return {"cameras": groups, "sequences": sequences}


def _check_registered(folder: SceneFolder, model, total: int) -> None:
    registered = model.num_reg_images() if model is not None else 0
    if registered < MIN_VIEWS or 2 * registered < total:
        raise DataError(
            f"{folder.path}: structure from motion registered {registered} of {total} "
            "images; the usual causes are too little overlap between views, motion blur, "
            "and textureless or shiny surfaces (features and matches are kept in "
            f"{folder.database})")


def _report(request: Request, folder: SceneFolder, model, names: list[str], pairs: int,
            times: dict, reused: dict) -> dict:
    registered = {image.name for image in model.images.values() if image.has_pose}
    return {"scene": str(folder.path), "images": len(names), "registered": len(registered),
            "left_out": [name for name in names if name not in registered],
            "cameras": model.num_cameras(), "points": model.num_points3D(),
            "mean_reprojection_error_px": round(model.compute_mean_reprojection_error(), 4),
            "pairs": pairs, "sfm": asdict(request.sfm), "seconds": times, "reused": reused}


def _tell(report: dict) -> None:
    notice(f"registered {report['registered']} of {report['images']} images "
           f"({report['cameras']} camera{'s' if report['cameras'] > 1 else ''}), "
           f"{report['points']:,} points, mean reprojection error "
           f"{report['mean_reprojection_error_px']:.2f} px")
    if report["left_out"]:
        shown = ", ".join(report["left_out"][:8])
        notice(f"left out: {shown}{', ...' if len(report['left_out']) > 8 else ''}")
    notice("seconds: " + ", ".join(f"{stage} {s:.1f}" for stage, s in report["seconds"].items()))
    scene = report["scene"]
    notice(f"a quick look first (3,000 images, each at most half a megapixel; 97 photos "
           f"of 0.2 megapixels took 10 minutes on 2 CPU cores): splatscale train {scene} "
           "-o OUTPUT --schedule-scale 0.1 --max-pixels 500K")
    notice(f"then the full 3DGS run (30,000 images at full size; hours on a CPU): "
           f"splatscale train {scene} -o OUTPUT")

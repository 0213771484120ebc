"""Structure from motion with pycolmap: SIFT features, matching, mapping.

Every stage writes to one COLMAP database and skips what it already holds (an
image's features, a pair's matches), so running again after a stop goes on
where it stopped. Features are extracted and pairs matched in small batches,
which gives progress and lets Ctrl-C stop between batches; mapping runs in a
worker thread that a Ctrl-C cancels and waits for.
"""

from __future__ import annotations

import math
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

EXTRACT_BATCH = 8      # images per feature-extraction call
MATCH_BATCH = 256      # image pairs per matching call
SEQUENTIAL_OVERLAP = 10  # COLMAP's sequential matcher's default
# COLMAP registers a view from 30 inliers and a 25 % inlier ratio. Images of under a
# megapixel (video frames, downscaled photos) hold a few hundred features, and views of
# them that 15 inliers and 15 % place correctly were left out (tests/test_prepare.py).
ABS_POSE_MIN_INLIERS = 15
ABS_POSE_MIN_INLIER_RATIO = 0.15
# COLMAP verifies a pair of fisheye views only given a prior focal length (a fundamental
# matrix cannot recover a fisheye's): a fisheye camera of photos without one in their EXIF
# (video frames) is given that of a typical fisheye lens, this many degrees across its
# diagonal, which bundle adjustment then refines.
FISHEYE_DIAGONAL_DEGREES = 150.0


@dataclass(frozen=True)
class SfmSettings:
    camera_model: str = "SIMPLE_RADIAL"
    max_image_size: int = 3200    # SIFT runs on images downscaled to this; keypoints scale back
    matcher: str | None = None    # exhaustive, sequential (video frames); None: by the input
    mapper: str = "incremental"   # or "global" (GLOMAP's pipeline in pycolmap)


def quiet_logs(verbose: bool) -> None:
    """pycolmap logs every step of every stage on stderr, and an ERROR line as a stop
    cuts a stage short: none of it unless asked (its failures reach us as exceptions,
    which say them in one line)."""
    from splatscale.native import pycolmap

    pycolmap.logging.minloglevel = 0 if verbose else 3
    pycolmap.logging.stderrthreshold = 0 if verbose else 3


def _batches(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def extracted(database: Path) -> set[str]:
    """Names of the images whose features the database holds."""
    from splatscale.native import pycolmap

    if not database.exists():
        return set()
    with pycolmap.Database.open(str(database)) as db:
        return {image.name for image in db.read_all_images()
                if db.exists_keypoints(image.image_id) and db.exists_descriptors(image.image_id)}


def _camera_of(database: Path, name: str) -> int:
    from splatscale.native import pycolmap

    with pycolmap.Database.open(str(database)) as db:
        image = db.read_image_with_name(name)
        if image is None:  # callers name images the database was seen to hold
            raise RuntimeError(f"{database} holds no image {name}")
        return image.camera_id


def extract_features(database: Path, images: Path, groups: list[list[str]],
                     settings: SfmSettings, advance: Callable[[int], None]) -> int:
    """SIFT features of every image, one camera per group of names (its intrinsics
    shared in SfM); images the database already holds are skipped. The count skipped."""
    from splatscale.native import pycolmap

    done = extracted(database)
    options = pycolmap.FeatureExtractionOptions()
    options.max_image_size = settings.max_image_size
    for group in groups:
        reader = pycolmap.ImageReaderOptions()
        reader.camera_model = settings.camera_model
        known = [name for name in group if name in done]
        if known:
            reader.existing_camera_id = _camera_of(database, known[0])
            give_fisheye_a_focal_prior(database, reader.existing_camera_id)
        advance(len(known))
        for batch in _batches([name for name in group if name not in done], EXTRACT_BATCH):
            pycolmap.extract_features(database, images, image_names=batch,
                                      camera_mode=pycolmap.CameraMode.SINGLE,
                                      reader_options=reader, extraction_options=options,
                                      device=pycolmap.Device.cpu)
            reader.existing_camera_id = _camera_of(database, batch[0])
            give_fisheye_a_focal_prior(database, reader.existing_camera_id)
            advance(len(batch))
    return len(done)


def give_fisheye_a_focal_prior(database: Path, camera_id: int) -> None:
    """A fisheye camera without a prior focal length gets that of a lens
    ``FISHEYE_DIAGONAL_DEGREES`` across (r = f theta at the image's corners); any other
    camera is left as it is."""
    from splatscale.native import pycolmap

    with pycolmap.Database.open(str(database)) as db:
        camera = db.read_camera(camera_id)
        if camera.has_prior_focal_length or not camera.model.name.endswith("FISHEYE"):
            return
        half_diagonal = math.hypot(camera.width, camera.height) / 2
        for index in camera.focal_length_idxs():
            camera.params[index] = half_diagonal / math.radians(FISHEYE_DIAGONAL_DEGREES / 2)
        camera.has_prior_focal_length = True
        db.update_camera(camera)


def image_pairs(sequences: list[list[str]], matcher: str) -> list[tuple[str, str]]:
    """The pairs to match: every pair (exhaustive); or, for images in capture order
    (sequential), each with its next ``SEQUENTIAL_OVERLAP`` and with those 2^k further
    on in its own sequence (COLMAP's sequential matcher with its quadratic overlap),
    and every pair across sequences (several videos of one scene)."""
    names = [name for sequence in sequences for name in sequence]
    if matcher == "exhaustive":
        return [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    steps = sorted({*range(1, SEQUENTIAL_OVERLAP + 1),
                    *(2 ** k for k in range(SEQUENTIAL_OVERLAP))})
    within = [(seq[i], seq[i + step]) for seq in sequences for i in range(len(seq))
              for step in steps if i + step < len(seq)]
    across = [(a, b) for k, seq in enumerate(sequences) for other in sequences[k + 1:]
              for a in seq for b in other]
    return within + across


def unmatched(database: Path, pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Those of ``pairs`` (image names) the database has not matched."""
    from splatscale.native import pycolmap

    with pycolmap.Database.open(str(database)) as db:
        ids = {image.name: image.image_id for image in db.read_all_images()}
        return [(a, b) for a, b in pairs if not db.exists_matches(ids[a], ids[b])]


def match_features(database: Path, pairs: list[tuple[str, str]],
                   advance: Callable[[int], None]) -> int:
    """Match and geometrically verify ``pairs`` of image names; pairs the database
    has matched are skipped. The count skipped."""
    from splatscale.native import pycolmap

    todo = unmatched(database, pairs)
    advance(len(pairs) - len(todo))
    with tempfile.TemporaryDirectory() as scratch:
        listing = Path(scratch) / "pairs.txt"
        for batch in _batches(todo, MATCH_BATCH):
            # COLMAP splits each line at spaces: scene_folder.image_name's names hold none.
            listing.write_text("".join(f"{a} {b}\n" for a, b in batch))
            pairing = pycolmap.ImportedPairingOptions()
            pairing.match_list_path = str(listing)
            pycolmap.match_image_pairs(database, pairing_options=pairing,
                                       device=pycolmap.Device.cpu)
            advance(len(batch))
    return len(pairs) - len(todo)


def map_scene(database: Path, images: Path, output: Path, settings: SfmSettings,
              advance: Callable[[int], None]):
    """The reconstructions the mapper finds, written under ``output``; ``advance(1)``
    for each image the incremental mapper registers. A Ctrl-C cancels it."""
    from splatscale.native import pycolmap

    if settings.mapper == "global":  # it takes no cancellation token: Ctrl-C leaves it
        return _cancellable(lambda token: pycolmap.global_mapping(database, images, output),
                            cancels=False)
    options = pycolmap.IncrementalPipelineOptions()
    options.mapper.abs_pose_min_num_inliers = ABS_POSE_MIN_INLIERS
    options.mapper.abs_pose_min_inlier_ratio = ABS_POSE_MIN_INLIER_RATIO
    # A fisheye's distortion terms (OPENCV_FISHEYE's four), refined from the first pair's
    # few points, run away and no further view registers: they are refined once, by a
    # bundle adjustment of every view placed.
    fisheye = settings.camera_model.endswith("FISHEYE")
    options.ba_refine_extra_params = not fisheye

    def mapping(token):
        models = pycolmap.incremental_mapping(database, images, output, options,
                                              next_image_callback=lambda: advance(1),
                                              cancellation_token=token)
        for model in models.values() if fisheye else ():
            _adjust_everything(model)
        return models
    return _cancellable(mapping)


def _adjust_everything(model) -> None:
    """Bundle adjustment of every registered view, the intrinsics (distortion terms
    included) refined, as pycolmap.bundle_adjustment does but without its log lines,
    which it writes whatever the log level."""
    from splatscale.native import pycolmap

    options = pycolmap.BundleAdjustmentOptions()
    options.print_summary = False
    config = pycolmap.BundleAdjustmentConfig()
    for image_id in model.reg_image_ids():
        config.add_image(image_id)
    config.fix_gauge(pycolmap.BundleAdjustmentGauge.TWO_CAMS_FROM_WORLD)
    pycolmap.create_default_bundle_adjuster(options, config, model).solve()
    model.update_point_3d_errors()


def _cancellable(call: Callable, cancels: bool = True):
    """``call(token)`` in a worker thread, so that Ctrl-C reaches this one: it cancels
    the token, waits for the worker to leave pycolmap (if ``call`` heeds the token),
    and goes on with the KeyboardInterrupt: a process that exits while the worker is
    in pycolmap aborts with a native stack dump, as its pycolmap frames meet Python's
    shutdown. A stop may come as the worker starts, so the worker enters pycolmap only
    while it holds ``entered`` and the token is not cancelled."""
    from splatscale.native import pycolmap

    token = pycolmap.CancellationToken()
    outcome: dict = {}
    entered = threading.Lock()
    finished = threading.Event()

    def work() -> None:
        try:
            with entered:
                if not token.is_cancelled:
                    outcome["result"] = call(token)
        except BaseException as error:  # handed to the waiting thread
            outcome["error"] = error
        finally:
            finished.set()

    try:
        threading.Thread(target=work, daemon=True).start()
        while not finished.wait(0.2):  # a signal that another thread takes wakes no wait
            pass
    except KeyboardInterrupt:
        token.cancel()
        if cancels:
            _wait_out(entered)
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def _wait_out(entered: threading.Lock) -> None:
    """Wait until the worker is out of pycolmap, through further stop signals (the stop
    they ask for is under way): once this thread has held ``entered``, the worker has
    left, or will find the token cancelled. A lock rather than Thread.join: Python
    3.11's join, cut short by a signal, marks the thread it waits for as ended while it
    still runs (bpo-45274's fix), and a second join returns at once."""
    while True:
        try:
            with entered:
                return
        except KeyboardInterrupt:
            continue

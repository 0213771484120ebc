"""splatscale train | prepare | render | eval | export | view."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from splatscale import native
from splatscale.launch import local_ranks
from splatscale.errors import QUIET_EXIT, interrupt, run_reported
from splatscale.messages import rank, speaks
from splatscale.threads import usable_cores
from splatscale.limits import MAX_COUNT, MAX_SEED

TRAIN_HELP = """Train a Gaussian-splatting model of a scene (a COLMAP folder, as
`splatscale prepare` makes, or a transforms.json scene) into OUTPUT.

The defaults are the original 3DGS recipe: 30,000 images at full resolution,
hours on a laptop. A quick look first takes minutes:
  splatscale train SCENE -o OUTPUT --schedule-scale 0.1 --max-pixels 500K

--iterations counts images: a batch of B views is one step, and every schedule
is counted in images, so changing B keeps the training budget."""

PREPARE_HELP = """Make a trainable COLMAP scene (images/, sparse/0/) of photos or a video:
images made upright, SIFT features, matching and mapping with pycolmap, the
largest model kept. Run again, it goes on from the features and matches found."""
VIEW_HELP = """Serve a page that draws a model's splats in the browser, with its scene's
cameras: click one to look through it and compare its photo with an exact
render of the model there (with its PSNR); render any view exactly as a still.
Runs until Ctrl-C."""
# The fisheye ones train as an ideal equidistant fisheye of the photos' whole field of view.
CAMERA_MODELS = ("SIMPLE_PINHOLE", "PINHOLE", "SIMPLE_RADIAL", "RADIAL", "OPENCV",
                 "OPENCV_FISHEYE", "SIMPLE_RADIAL_FISHEYE", "RADIAL_FISHEYE")


# numba refuses more threads than it started with (NUMBA_NUM_THREADS, default: the cores).
MAX_THREADS = int(os.environ.get("NUMBA_NUM_THREADS") or os.cpu_count() or 1)
# Local ranks share the machine's cores: more ranks than cores only contend for them.
MAX_LOCAL_RANKS = usable_cores()
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


# How long a rank that does not speak waits before it exits on a usage error: torchrun's
# agent stops every rank once one exits, and rank 0, parsing the same command line at
# about the same time, must have said the error by then.
SILENT_RANK_GRACE = 5.0  # seconds


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line, like every other error, with exit status 2. Every
    rank of a group is given the same command line: rank 0 says it for all."""

    def error(self, message: str):
        if rank() not in (None, 0):
            try:
                time.sleep(SILENT_RANK_GRACE)
            except KeyboardInterrupt:  # stopped meanwhile: the error is rank 0's to say
                pass
        self.exit(2, f"splatscale: error: {message} (see --help)\n" if speaks() else None)


def _integer(low: int, high: int = MAX_COUNT):
    """An argparse type: an integer in [low, high]."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not low <= value <= high:
            bounds = (f"between {low} and {high}" if high < MAX_COUNT
                      else f"at least {low}" if value < low else f"at most {high:,}")
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {value}")
        return value
    return parse


def _folder(text: str) -> Path:
    """An argparse type: a path with ``a/../b`` read as ``b``, so that a run makes only
    the folders it names (and removes them again if it is refused). An empty path is
    refused: it would name the current folder without saying so."""
    return Path(os.path.normpath(_nonempty(text)))


def _mask_folder(text: str) -> str:
    """An argparse type: a folder of masks that exists, as an absolute path (a resumed
    run finds it from anywhere); "" (--masks alone, its const): where the scene keeps
    them."""
    if text == "":
        return text
    path = Path(text).expanduser()
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: no such folder")
    return str(path.resolve())


def _pixel_count(text: str) -> int:
    """An argparse type: a number of pixels, as N, NK or NM (thousands, millions)."""
    number = text.strip().upper().removesuffix("P")
    unit = {"K": 1e3, "M": 1e6}.get(number[-1:], 1)
    try:
        value = float(number[:-1] if unit > 1 else number) * unit
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a pixel count: {text!r} (say 500K or 1M)"
                                         ) from None
    if not 256 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be at least 256 pixels, got {text}")
    return int(value)


def _nonempty(text: str) -> str:
    """An argparse type: a path that is not empty (which would name this folder
    without saying so)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path (say . for this folder)")
    return text


SIZE_UNITS = {"": 1, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}


def _size(text: str) -> int:
    """An argparse type: bytes, as N, NK, NM, NG or NT (powers of 1024)."""
    number = text.strip().upper().removesuffix("B")
    unit = number[-1:] if number[-1:].isalpha() else ""
    try:
        value = float(number.removesuffix(unit)) * SIZE_UNITS[unit]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (say 8G or 500M)") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a size of 0 or more, got {text}")
    return int(value)


def _positive_float(text: str) -> float:
    """An argparse type: a finite number above zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text}")
    return value


def _add_offload_switch(parser, name: str, on: str, off: str) -> None:
    """``--NAME`` and ``--no-NAME``, one at most: ``args.NAME`` True, False or None
    (the device's default)."""
    switch = parser.add_mutually_exclusive_group()
    switch.add_argument(f"--{name}", dest=name, action="store_true", default=None,
                        help=f"with --offload: {on}")
    switch.add_argument(f"--no-{name}", dest=name, action="store_false",
                        help=f"with --offload: {off}")


MODEL_HELP = "a run folder (its point_cloud.ply), or a model file (.ply, .splat, .spz)"


def _add_model_views(parser: argparse.ArgumentParser) -> None:
    """A model, and the views of its scene to render it at."""
    parser.add_argument("model", type=Path, help=MODEL_HELP)
    parser.add_argument("--data", default=None, type=_nonempty,
                        help="the scene (default: the run's, read as it trained: its "
                             "resolution, background and test views); needed for a PLY "
                             "outside a run folder")
    parser.add_argument("--split", choices=("train", "test", "all"), default=None,
                        help="the run's test views (default), its training views, or all")


def _add_train_basics(group) -> None:
    group.add_argument("data", nargs="?", default=None, type=_nonempty,
                       help="COLMAP folder or transforms.json scene (default: the built-in "
                            "demo; with --resume, the run's own)")
    group.add_argument("-o", "--output", type=_folder, required=True,
                       help="the run's folder: its model, checkpoint, metrics and renders")
    group.add_argument("--eval", action="store_true", default=None,
                       help="hold every 8th image out of training, to test on (leave it off "
                            "for the model you share)")
    group.add_argument("--resume", action="store_true",
                       help="continue the run in OUTPUT from its checkpoint.pt, with all "
                            "its settings")
    group.add_argument("--overwrite", action="store_true",
                       help="replace the previous run in OUTPUT (its files; others stay)")
    group.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                       help="where training renders: cpu (default; numba kernels) or cuda "
                            "(NVIDIA GPUs, gsplat's kernels: pip install 'splatscale[cuda]', "
                            "and CUDA's compiler for their first build)")
    group.add_argument("--save-at", type=_integer(1), nargs="*", default=[], metavar="N",
                       help="also write point_cloud_<N>.ply after N images (default: only "
                            "point_cloud.ply, at the end)")
    group.add_argument("--eval-every", type=_integer(0), default=0, metavar="N",
                       help="with --eval, test every N images (default 0: at the end)")
    group.add_argument("--checkpoint-every", type=_integer(0), default=1000, metavar="N",
                       help="write checkpoint.pt every N images (default 1000)")
    group.add_argument("--quiet", action="store_true", help="no progress bar")


def _add_train_schedule(group) -> None:
    group.add_argument("--iterations", type=_integer(1), default=None, metavar="N",
                       help="images to train on (default 30000, or 30000 x S; with "
                            "--resume, the run's own)")
    group.add_argument("--schedule-scale", type=_positive_float, default=None, metavar="S",
                       help="every schedule S times as long: the run, the learning rate's "
                            "decay, densification, opacity resets, SH steps (0.1: a whole "
                            "run in 3,000 images; default 1, the original schedule)")
    group.add_argument("--batch-size", type=_integer(1), default=None, metavar="B",
                       help="views per step (default 1; the learning rates follow sqrt(B))")
    group.add_argument("--seed", type=_integer(0, MAX_SEED), default=None,
                       help="the random seed (default 0)")
    group.add_argument("--densify-until", type=_integer(0), default=None, metavar="N",
                       help="images after which densification stops (default 15000; with "
                            "--strategy mcmc, relocation and growth: 25000)")
    group.add_argument("--strategy", choices=("3dgs", "mcmc"), default=None,
                       help="how the Gaussians are added and removed: 3dgs, the original "
                            "schedule (default), or mcmc, 3DGS as Markov-chain Monte Carlo "
                            "(gsplat's MCMCStrategy: faint Gaussians relocated, 5%% growth "
                            "to --max-gaussians, default 1000000)")
    group.add_argument("--max-gaussians", type=_integer(1), default=None, metavar="N",
                       help="never train more Gaussians than N (3dgs: densify the largest "
                            "gradients first; default no limit)")
    group.add_argument("--absgrad", action="store_true", default=None,
                       help="3dgs: densify by the absolute view-space gradient, summed pixel "
                            "by pixel (AbsGS: splits large Gaussians over fine detail), with "
                            "its own threshold")
    group.add_argument("--antialiased", action="store_true", default=None,
                       help="anti-aliased splats (gsplat's antialiased mode, as in "
                            "Mip-Splatting): the model holds its look when seen nearer or "
                            "farther than it was trained; its files say so")
    group.add_argument("--appearance", choices=("none", "affine"), default=None,
                       help="affine: learn a colour transform per training image (a 3x3 "
                            "matrix and an offset), for photos whose exposure or white "
                            "balance changes; test views render without one (default none)")
    group.add_argument("--random-init", choices=("auto", "cameras", "cube"), default=None,
                       help="for a scene without points, where 100,000 random points go: "
                            "cameras (where the cameras look: an object), cube (3 scene "
                            "scales around the cameras, gsplat's rule: a room), or auto "
                            "(default: cameras when the images have a plain border)")


def _add_train_ranks(group) -> None:
    group.add_argument("--nproc", type=_integer(1, MAX_LOCAL_RANKS), default=1, metavar="N",
                       help="train with N local ranks, each with cores/N threads, N at most "
                            f"the cores this process may use ({MAX_LOCAL_RANKS} here; "
                            "default 1); or start the command under torchrun")
    group.add_argument("--comm", choices=("nccl", "gloo"), default=None,
                       help="how ranks on GPUs talk: NCCL (the default when each rank of "
                            "a machine has a GPU of its own) or gloo through host memory "
                            "(the default when ranks share a GPU; always on CPUs)")
    group.add_argument("--join-timeout", type=_positive_float, default=None, metavar="SECONDS",
                       help="how long the ranks wait for each other to join (default 120)")
    group.add_argument("--balance", choices=("cost", "uniform"), default=None,
                       help="how ranks share a batch's pixel rows: equal estimated cost "
                            "(default) or equal row counts")
    group.add_argument("--pixel-cost", type=_positive_float, default=None, metavar="A",
                       help="fix what --balance cost equalises, A * pixels + B * tile "
                            "intersections, at A (default 0.05 when only B is given); "
                            "without either flag A and B are fitted to the ranks' "
                            "measured times as the run goes")
    group.add_argument("--intersection-cost", type=_positive_float, default=None, metavar="B",
                       help="B, as --pixel-cost says (default 1 when only A is given)")


def _add_train_offload(group) -> None:
    group.add_argument("--offload", action="store_true",
                       help="keep the Gaussians and optimiser state in host memory, the "
                            "device holding 44 bytes per Gaussian and each step's visible "
                            "ones; with --nproc, each rank offloads its shard")
    _add_offload_switch(group, "forwarding",
                        "run the host update of each step beside the device's next step "
                        "(default on a GPU; on a CPU the two share the cores and it is off)",
                        "run the host update after each step (the same results)")
    _add_offload_switch(group, "lookahead",
                        "send the rows the next batch needs and this step leaves alone "
                        "while this step's backward pass runs (default on a GPU; on a CPU "
                        "it costs more than it hides)",
                        "send each step's rows when it starts (the same results)")


def _add_serving(parser) -> None:
    parser.add_argument("--port", type=_integer(1, 65535), default=None,
                        help="the viewer's port (default 8080)")
    parser.add_argument("--host", default=None,
                        help="the address the viewer listens on (default 127.0.0.1: this "
                             "machine only; 0.0.0.0 shares it with the network)")


def _add_common(parser) -> None:
    parser.add_argument("--threads", type=_integer(1, MAX_THREADS),
                        default=None, help="CPU threads (default: all)")
    parser.add_argument("--cache-dir", type=_folder, default=None,
                        help="where undistorted/downscaled images are cached "
                             "(default: ~/.cache/splatscale)")
    parser.add_argument("--resolution", type=int, default=None, choices=(1, 2, 4, 8),
                        help="divide image sizes by this (default 1; for a run's model, "
                             "the run's)")
    parser.add_argument("--max-width", type=_integer(16), default=None,
                        help="cap the image width (pixels, at least 16; default none; for a "
                             "run's model, the run's cap)")
    parser.add_argument("--max-pixels", type=_pixel_count, default=None, metavar="N",
                        help="cap each image's pixels, e.g. 500K or 1M (its aspect kept; "
                             "default none; for a run's model, the run's cap)")
    parser.add_argument("--image-memory", type=_size, default=None, metavar="SIZE",
                        help="decoded images kept in memory, e.g. 8G or 500M, shared by "
                             "the ranks of one machine (default: a quarter of its memory); "
                             "the others are read from raw copies in the cache folder as "
                             "they are used")
    parser.add_argument("--skip-missing-images", action="store_true",
                        help="use the views whose images are present when the scene lists "
                             "some that are absent (default: refuse, naming them)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="splatscale", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train a model", description=TRAIN_HELP,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_train_basics(train.add_argument_group("the run"))
    _add_train_schedule(train.add_argument_group("schedule and strategy"))
    data = train.add_argument_group("the scene's images")
    data.add_argument("--white-background", action="store_true", default=None,
                      help="render on white, not black (for a scene photographed on white; "
                           "a transforms.json scene with transparent images says so itself)")
    data.add_argument("--masks", nargs="?", const="", default=None, type=_mask_folder,
                      metavar="DIR",
                      help="train only where each image's mask is white (black is ignored): "
                           "masks/NAME.png or masks/NAME.jpg.png beside images/, a "
                           "transforms.json frame's mask_path, or those in DIR (default: every "
                           "pixel trains)")
    data.add_argument("--alpha-mask", action="store_true", default=None,
                      help="each image's alpha channel is its mask (transparent is ignored)")
    data.add_argument("--invert-masks", action="store_true", default=None,
                      help="masks are white where they ignore, black where they train")
    data.add_argument("--skip-missing-masks", action="store_true", default=None,
                      help="train every pixel of an image without a mask (default: refuse, "
                           "naming it)")
    _add_common(data)
    _add_train_ranks(train.add_argument_group(
        "distributed (Grendel: several processes or GPUs train one model)"))
    _add_train_offload(train.add_argument_group(
        "offloaded (GS-Scale: the model in host memory, for a GPU too small for it)"))
    viewer = train.add_argument_group("watching the run")
    viewer.add_argument("--viewer", action="store_true",
                        help="watch and steer the run in a web browser: its splats, "
                             "progress, pause, resume and checkpoint now")
    _add_serving(viewer)

    render = sub.add_parser("render", help="render a model's views to PNG")
    _add_model_views(render)
    render.add_argument("-o", "--output", type=_folder, default=None,
                        help="a new or empty folder for the PNGs, or one of earlier renders "
                             "(default: renders/SPLIT, or renders/orbit, beside the model)")
    render.add_argument("--orbit", action="store_true",
                        help="instead, a video (orbit.mp4, H.264) of a full turn about what "
                             "the capture looked at, upright, from its most typical camera")
    render.add_argument("--frames", type=_integer(2, 100_000), default=120, metavar="N",
                        help="with --orbit, the video's frames (default 120)")
    render.add_argument("--fps", type=_integer(1, 240), default=30,
                        help="with --orbit, its frames per second (default 30)")
    _add_common(render)

    evaluate = sub.add_parser("eval", help="test-view metrics of a model as JSON")
    _add_model_views(evaluate)
    _add_common(evaluate)

    prepare = sub.add_parser("prepare", help="make a scene of photos or a video (SfM)",
                             description=PREPARE_HELP)
    prepare.add_argument("input", type=_folder,
                         help="a folder of photos (JPEG, PNG, TIFF, WebP, BMP, HEIC), a video, "
                              "or a folder of videos")
    prepare.add_argument("-o", "--output", type=_folder, required=True,
                         help="the scene folder to make (images/, sparse/0/)")
    prepare.add_argument("--frames", type=_integer(3), default=None,
                         help="frames to take from the video(s), in all (default 100)")
    prepare.add_argument("--camera-model", choices=CAMERA_MODELS, default="SIMPLE_RADIAL",
                         help="COLMAP's camera model (default SIMPLE_RADIAL; OPENCV for "
                              "strong lens distortion; OPENCV_FISHEYE for fisheye lenses, "
                              "trained as fisheye, uncropped)")
    prepare.add_argument("--max-image-size", type=_integer(100), default=3200,
                         help="features are found on images downscaled to this many pixels "
                              "on their longer side (default 3200, COLMAP's); the scene "
                              "keeps them whole")
    prepare.add_argument("--matcher", choices=("exhaustive", "sequential"), default=None,
                         help="which pairs to match: all (default for photos) or each frame "
                              "with its next ones (default for video)")
    prepare.add_argument("--mapper", choices=("incremental", "global"), default="incremental",
                         help="incremental (COLMAP's, default) or global (GLOMAP's, faster "
                              "on hundreds of images and more)")
    prepare.add_argument("--overwrite", action="store_true",
                         help="start afresh in OUTPUT, removing only what prepare wrote there "
                              "(default: go on from what is there)")
    prepare.add_argument("--verbose", action="store_true", help="pycolmap's own log too")
    prepare.add_argument("--quiet", action="store_true", help="no progress bars")

    view = sub.add_parser("view", help="look at a model in a web browser",
                          description=VIEW_HELP)
    view.add_argument("model", type=Path, help="a run folder (its point_cloud.ply, with "
                      "its scene's cameras and photos), or a model file (.ply, .splat, "
                      ".spz)")
    view.add_argument("--data", default=None, type=_nonempty,
                      help="the scene whose cameras and photos to show (default: a run "
                           "folder's own; none for a PLY)")
    _add_serving(view)
    _add_common(view)

    export = sub.add_parser("export", help="convert a model")
    export.add_argument("model", type=Path, help=MODEL_HELP)
    export.add_argument("--format", choices=("ply", "splat", "spz"), required=True,
                        help="ply (INRIA's layout), splat (antimatter15's) or spz (Niantic's "
                             "compressed format, a quarter of the PLY or less)")
    export.add_argument("-o", "--output", type=_folder, default=None,
                        help="the file to write, named with the format's suffix (default: "
                             "beside the model)")
    export.add_argument("--overwrite", action="store_true",
                        help="replace the file to write if it exists (default: refuse)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` says; its exit status. Without ``argv`` this is the
    process's own command (the ``splatscale`` script, ``python -m splatscale``, a
    rank), which also settles how the process ends (``_end_process``); called with
    ``argv`` from Python, it leaves the caller's signal handlers as it found them."""
    owns_process = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.argv = argv  # what --nproc's ranks run
    # torch's C++ side logs a failed connection or a closed peer as it raises it; the
    # Python error that follows is reported in one line (read before torch loads).
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    found = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    for signum, handler in found.items():
        if handler in (signal.SIG_DFL, signal.default_int_handler):
            # Until training takes them over, both stop quietly.
            signal.signal(signum, interrupt)
    code = run_reported(lambda: _run(args))
    if owns_process:
        return _end_process(code)
    for signum, handler in found.items():
        signal.signal(signum, handler)
    return code


def _end_process(code: int) -> int:
    """End this process with ``code``, which a stop signal can no longer change."""
    for signum in STOP_SIGNALS:
        # Python sets the default handlers back as it shuts down, all but ignored
        # ones: a stop then would end the finished process by the signal.
        signal.signal(signum, signal.SIG_IGN)
    if code in (130, QUIET_EXIT):
        # A KeyboardInterrupt raised in Python that C code ran (pybind11's exec, as
        # torch loads) leaves CPython to end the process by SIGINT as it exits,
        # whatever its status, which the launcher and the shell would read as a
        # command that said nothing: a stopped command that has said its word ends here.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _run(args: argparse.Namespace) -> int:
    local_ranks.as_launched_rank()
    # Every library loads with the stop signals held (``native.stop_signals_held``
    # says why); a stop sent meanwhile is taken as they have loaded, quietly as any
    # stop during start-up.
    with native.stop_signals_held():
        native.load_all()  # first: no other thread is there to run a library's own handler
        from splatscale import commands
        from splatscale.threads import ready_vector_math, use_threads

    ready_vector_math()  # before any of torch's threads computes
    if getattr(args, "threads", None):
        use_threads(args.threads)
    return commands.COMMANDS[args.command](args) or 0


if __name__ == "__main__":
    sys.exit(main())

"""What each CLI command does (argument parsing lives in cli.py)."""

from __future__ import annotations

import json
import math
import os
from argparse import Namespace
from contextlib import ExitStack
from dataclasses import fields, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, NamedTuple

import numpy as np
import torch
from tqdm import tqdm

from splatscale.atomic import write_json
from splatscale.data import load_scene
from splatscale.demo import demo_scene
from splatscale.data.image_memory import default_budget
from splatscale.data.camera_path import orbit
from splatscale.data.cameras import Camera
from splatscale.data.images import ImageStore
from splatscale.data.masks import MaskSource, find_masks
from splatscale.data.video import even_size, write_mp4
from splatscale.data.scene import Scene
from splatscale.engine import Engine
from splatscale.engine.distributed.cost_model import RowCost
from splatscale.engine.factory import OffloadOptions, RankOptions, make_engine, shard_of
from splatscale.launch import group, local_ranks
from splatscale.launch.placement import Placement, chosen_backend, rank_device
from splatscale.errors import SplatscaleError
from splatscale.folder_lock import locked_folder
from splatscale.messages import held, muted, notice
from splatscale.threads import use_threads
from splatscale.model.gaussians import GaussianModel
from splatscale.model.orientation import camera_axes, cameras_up, look_at_point, most_typical
from splatscale.model.files import is_ply, read_model
from splatscale.model.ply import read_extras, write_ply, write_splat
from splatscale.model.spz import write_spz
from splatscale.backends import cuda as cuda_backend
from splatscale.render import render as render_view
from splatscale.backends.cpu_compile import (VARIANTS, compiling, kernels_cached,
                                             missing_variants)
from splatscale.strategy import check_settings
from splatscale.train.checkpoint import load_trainer_state
from splatscale.train.config import TrainConfig
from splatscale.train.metrics import ImageMetrics
from splatscale.train.render_folder import RenderFolder, check_distinct, render_names
from splatscale.train.run_folder import RunFolder
from splatscale.train.run_record import RunRecord, model_of, run_record
from splatscale.train.summary import summary
from splatscale.train.trainer import RunOptions, Trainer
from splatscale.train.watch import Bystander, Watcher

if TYPE_CHECKING:  # viser loads only where the viewer is used
    from splatscale.viewer.page import Scenery


def _scene(args: Namespace):
    """The scene at ``args.data``, or the built-in demo scene when none is given."""
    if args.data is None:
        return demo_scene(args.cache_dir)
    return load_scene(args.data, args.skip_missing_images)


def _store(args: Namespace, scene, white_background: bool = False,
           local: tuple[int, int] = (0, 1), masks: MaskSource | None = None) -> ImageStore:
    """The scene's images for rank ``local[0]`` of the ``local[1]`` processes of this
    machine: as many kept in memory as its equal share of --image-memory allows
    (saying so when that is not all of them), its share of them decoded first; with
    ``masks``, each with its mask."""
    local_ranks = local[1]
    background = (1.0, 1.0, 1.0) if white_background else scene.background
    machine = default_budget() if args.image_memory is None else args.image_memory
    budget = machine // local_ranks
    store = ImageStore(scene, args.resolution or 1, args.max_width, args.cache_dir, background,
                       memory_budget=budget, decode_share=local, max_pixels=args.max_pixels,
                       masks=masks)
    decoded = store.decoded_bytes()
    if decoded > budget:
        share = (f", {_size_text(budget)} for each of {local_ranks} ranks"
                 if local_ranks > 1 else "")
        notice(f"the images take {_size_text(decoded)} decoded, more than --image-memory "
               f"({_size_text(machine)}{share}): the rest are read from raw copies in "
               f"{store.cache_dir}")
    return store


def _size_text(size: int) -> str:
    """``size`` bytes in GiB, MiB or KiB, whichever reads as a number of at least 1."""
    for unit, power in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 2 ** power:
            return f"{size / 2 ** power:.1f} {unit}"
    return f"{size} bytes"


def _check_flags(args: Namespace) -> None:
    """Combinations of flags that argparse alone does not refuse."""
    for name in ("forwarding", "lookahead"):
        chosen = getattr(args, name)
        if chosen is not None and not args.offload:
            flag = f"--{name}" if chosen else f"--no-{name}"
            raise SplatscaleError(f"{flag}: only with --offload")
    for flag, value in (("--port", args.port), ("--host", args.host)):
        if value is not None and not args.viewer:
            raise SplatscaleError(f"{flag}: only with --viewer")
    if args.masks is not None and args.alpha_mask:
        raise SplatscaleError("--alpha-mask: the masks are the images' alpha channels or "
                              "files (--masks), not both")
    for flag, value in (("--invert-masks", args.invert_masks),
                        ("--skip-missing-masks", args.skip_missing_masks)):
        if value and args.masks is None and not args.alpha_mask:
            raise SplatscaleError(f"{flag}: only with --masks or --alpha-mask")


def _check_device(args: Namespace, ranks: group.Membership | None) -> None:
    """--device cuda: a GPU torch can see, gsplat's kernels built. With several ranks,
    a --comm that cannot work is refused here where it can be (for --nproc's ranks,
    which share this machine's GPUs; torchrun's agree on it as they join)."""
    several = ranks is not None or args.nproc > 1
    if args.comm is not None and not several:
        raise SplatscaleError(f"--comm {args.comm}: chooses how several ranks talk "
                              "(--nproc N, or torchrun); drop it to train alone")
    for flag, value in (("--join-timeout", args.join_timeout), ("--balance", args.balance),
                        ("--pixel-cost", args.pixel_cost),
                        ("--intersection-cost", args.intersection_cost)):
        if value is not None and not several:
            raise SplatscaleError(f"{flag}: only with several ranks (--nproc N, or "
                                  "torchrun); drop it to train alone")
    if args.device == "cpu":
        if several:
            chosen_backend("cpu", False, args.comm)
        return
    if not torch.cuda.is_available():
        raise SplatscaleError(f"--device cuda: torch {torch.__version__} sees no CUDA device"
                              f" (its CUDA build: {torch.version.cuda or 'none'}); install a "
                              "CUDA build of torch on a machine with an NVIDIA GPU, or train "
                              "with --device cpu")
    if several:
        local_world = ranks.local_world if ranks else args.nproc
        chosen_backend("cuda", ranks is None and local_world > torch.cuda.device_count(),
                       args.comm)
    cuda_backend.load_kernels()


JOIN_TIMEOUT = 120.0  # seconds the ranks wait for each other to join, unless told


def _run_flags(args: Namespace) -> dict[str, str]:
    """The flags given or not that set one of the run's settings (a flag named as its
    setting is): on --resume the checkpoint's values hold. By setting."""
    return {f.name: "--" + f.name.replace("_", "-") for f in fields(TrainConfig)
            if f.name != "iterations" and hasattr(args, f.name)}


# Settings counted in images that, given, hold as given whatever --schedule-scale says.
SCHEDULE_FLAGS = ("iterations", "densify_until")


def _new_config(args: Namespace) -> TrainConfig:
    given = {name: getattr(args, name) for name in ("iterations", *_run_flags(args))}
    given = {name: value for name, value in given.items() if value is not None}
    config = TrainConfig(**{name: value for name, value in given.items()
                            if name not in SCHEDULE_FLAGS + ("schedule_scale",)})
    if args.schedule_scale is not None:
        config = config.scaled(args.schedule_scale)
    config = replace(config, **{name: given[name] for name in SCHEDULE_FLAGS if name in given})
    check_settings(config)  # before any image is read
    return config


def _resumed_config(args: Namespace, saved: dict, checkpoint: Path) -> TrainConfig:
    """The checkpoint's settings; a new --iterations extends (or shortens) the run."""
    config = TrainConfig.from_dict(saved["config"], f"{checkpoint}: config")
    for name, flag in _run_flags(args).items():
        value = getattr(args, name)
        if value is not None and value != getattr(config, name):
            notice(f"{_flag_text(flag, value)} ignored: the resumed run keeps "
                   f"{_flag_text(flag, getattr(config, name))} from its checkpoint")
    if args.iterations is not None and args.iterations != config.iterations:
        if args.iterations < saved["images_seen"]:
            raise SplatscaleError(f"--iterations {args.iterations}: {checkpoint} has already "
                                  f"trained on {saved['images_seen']} images")
        notice(f"--iterations: the run now ends after {args.iterations} images "
               f"(it was to end after {config.iterations})")
        config.iterations = args.iterations
    return config


# How a run read its scene, as flags: on --resume the run's own values hold.
SCENE_FLAGS = {"resolution": "--resolution", "max_width": "--max-width",
               "max_pixels": "--max-pixels", "eval": "--eval"}


def _resumed_scene(args: Namespace, record: RunRecord | None) -> None:
    """--resume: the scene read as the run read it (its ``record``); a flag giving
    another value is ignored, saying so. A scene named in the command is used (moved,
    say), the checkpoint then checking that it is the run's."""
    if record is None:  # a run that kept no record: the flags as given
        return
    if args.data is None:
        args.data = _recorded_scene(record, "splatscale train DATA -o OUTPUT --resume")
    elif record.data is None or Path(args.data).resolve() != Path(record.data).resolve():
        notice(f"training on {args.data}; the run trained on "
               f"{record.data or 'the built-in demo scene'}")
    for name, flag in SCENE_FLAGS.items():
        given, kept = getattr(args, name), getattr(record, name)
        if given is not None and given != kept:
            notice(f"{_flag_text(flag, given)} ignored: the resumed run keeps "
                   f"{_flag_text(flag, kept)} from {record.path}")
        setattr(args, name, kept)


def _recorded_scene(record: RunRecord, naming: str) -> str | None:
    """The scene ``record`` names (None: the demo), refused where it is gone, saying
    how a command names it (``naming``)."""
    if record.data is not None and not Path(record.data).exists():
        raise SplatscaleError(f"{record.path}: its run's scene {record.data} is not there "
                              f"any more; name it with {naming}")
    return record.data


def _flag_text(flag: str, value) -> str:
    """A setting as the command line says it: ``--eval``, ``no --max-width``, ``--seed 3``."""
    if value is None or value is False:
        return f"no {flag}"
    return flag if value is True else f"{flag} {value}"


def _tell_held_out(scene: Scene) -> None:
    _, test_ids = scene.split(True)
    notice(f"--eval holds {len(test_ids)} of the {len(scene.views)} views out of training "
           "(every 8th), to test on")


def _tell_short_schedule(config: TrainConfig) -> None:
    """A run shorter than its schedule stops inside it: said, with the scale that
    would fit the whole schedule into it (unless a scale was chosen)."""
    if config.iterations < config.position_lr_max_steps:
        fit = config.iterations / TrainConfig().iterations
        notice(f"the run stops after {config.iterations:,} images, inside the 3DGS "
               f"schedule of {config.position_lr_max_steps:,} (its learning rate still "
               f"high); --schedule-scale {fit:.3g} fits the whole schedule into it")


def _check_flags_act(args: Namespace, config: TrainConfig, scene: Scene,
                     images_seen: int) -> None:
    """Refuse a flag that would do nothing in this run."""
    if args.random_init is not None and not args.resume and len(scene.points):
        raise SplatscaleError(
            f"--random-init {args.random_init}: {scene.source} has {len(scene.points):,} "
            "SfM points, which the model starts from; random points are drawn only for a "
            "scene without points")
    end = math.ceil(config.iterations / config.batch_size) * config.batch_size
    for mark in args.save_at:
        if mark > end:
            raise SplatscaleError(f"--save-at {mark}: after the run's end (image {end:,}); "
                                  "point_cloud.ply is the model at the end")
        if mark <= images_seen:
            raise SplatscaleError(f"--save-at {mark}: the resumed run is past image "
                                  f"{mark:,} already (at {images_seen:,})")
    if args.eval_every and not args.eval:
        raise SplatscaleError("--eval-every: only with --eval (a run without it has no test "
                              "views)")
    if args.eval_every > end:
        raise SplatscaleError(f"--eval-every {args.eval_every}: past the run's end (image "
                              f"{end:,}); the test views are tested at the end anyway")


class TrainInputs(NamedTuple):
    """What a training run reads, each part checked."""

    folder: RunFolder
    config: TrainConfig
    scene: Scene
    store: ImageStore


def train(args: Namespace) -> int | None:
    """Check every input, then train. A refused run changes nothing in the output
    folder: every check runs first (on every rank, which then agree), and the folder
    is written only after all have passed. With ``--nproc N`` this process checks what
    needs no rank (the flags, the folder and its lock, the scene, the images' headers)
    and holds the lock while N local ranks, each this command, train."""
    ranks = group.from_environment()
    try:
        _check_flags(args)
        _check_device(args, ranks)
    except SplatscaleError as refusal:
        if ranks is None:
            raise
        group.refuse(ranks, refusal, _join_timeout(args))  # said once, whichever ranks met it
    if args.nproc > 1 and ranks is None:
        return _launch(args)
    _share_cores(args, ranks)
    _train(args, ranks, holds_lock=local_ranks.launched())
    return None


def _launch(args: Namespace) -> int:
    with RunFolder(args.output).lock():
        with muted():  # bad input is reported once, before ranks start; notices by rank 0
            _checked_inputs(args).store.check(decode=False)
            if args.viewer:
                from splatscale.viewer.server import check_port
                check_port(args.host, args.port)
        return local_ranks.spawn(args.argv, args.nproc)


def _checked_inputs(args: Namespace, ranks: group.Membership | None = None) -> TrainInputs:
    folder = RunFolder(args.output)
    folder.check(args.resume, args.overwrite)
    saved = load_trainer_state(folder.checkpoint) if args.resume else None
    if saved is None:
        config, images_seen = _new_config(args), 0
        if args.schedule_scale is None:
            _tell_short_schedule(config)
    else:
        _resumed_scene(args, run_record(folder.path))
        config = _resumed_config(args, saved, folder.checkpoint)
        images_seen = saved["images_seen"]
    args.resolution, args.eval = args.resolution or 1, bool(args.eval)
    scene = _scene(args)
    if args.eval and saved is None:
        _tell_held_out(scene)
    _check_flags_act(args, config, scene, images_seen)
    local = (ranks.local_rank, ranks.local_world) if ranks else (0, 1)
    masks = (find_masks(scene, config.masks or "", config.alpha_mask, config.invert_masks,
                        config.skip_missing_masks) if config.masked else None)
    return TrainInputs(folder, config, scene,
                       _store(args, scene, config.white_background, local, masks))


def _share_cores(args: Namespace, ranks: group.Membership | None) -> None:
    """Ranks on one machine split its cores, unless --threads says otherwise."""
    if ranks is not None and args.threads is None:
        use_threads(group.threads_per_rank(ranks.local_world))


def _train(args: Namespace, ranks: group.Membership | None, holds_lock: bool = False) -> None:
    """Check everything (every rank, then agree), then write and train."""
    writes = ranks is None or ranks.rank == 0
    with ExitStack() as resources:
        where = None
        if ranks is not None:
            resources.callback(group.leave)
            device = rank_device(args.device, ranks.local_rank)
            if device != "cpu":
                torch.cuda.set_device(device)
            where = group.join(ranks, _join_timeout(args), device, args.comm)

        def prepare() -> tuple[Trainer, dict, Watcher | None]:
            if ranks is not None and where is not None and where.device != "cpu":
                notice(where.describe(ranks.world))
            if writes and not holds_lock:
                resources.enter_context(RunFolder(args.output).lock())
            server = (resources.enter_context(_served(args.host, args.port))
                      if writes and args.viewer else None)
            trainer, record = _prepared(args, ranks, where, writes)
            return trainer, record, _watcher(args, trainer, server)

        cold = args.device == "cpu" and not kernels_cached()
        # The compile begins as the run prepares, one per machine (its first rank's), and
        # ends before the folder changes, so that stopping it leaves the folder be. Every
        # rank waits for its machine's, then loads the kernels from the cache.
        first = ranks is None or ranks.local_rank == 0
        first_compile = resources.enter_context(compiling() if cold and first
                                                else compiling([]))
        with held():
            trainer, record, watcher = group.agreed(prepare, ranks)
        if cold:
            notice("compiling the CPU kernels (once: later runs reuse them)")
        failed = group.agreed_when_done(first_compile, ranks)
        if args.device == "cpu":
            # What only some runs call apart, by each machine's first rank, now that the
            # kernels it shares with the others are cached.
            with compiling(_missing_variants(trainer) if first else []) as variants:
                failed += group.agreed_when_done(variants, ranks)
        if failed:
            notice(f"the compile of {', '.join(failed)} failed apart: this run compiles "
                   "it itself, and may round otherwise than later runs")
        if writes:
            RunFolder(args.output).begin(trainer.images_seen if args.resume else None)
            write_json(args.output / "config.json", record)
        report = trainer.run(watcher)
    if writes:
        for line in summary(report, args.output):
            notice(line)
        print(json.dumps(report))


def _missing_variants(trainer: Trainer) -> list[str]:
    """The kernels ``trainer``'s settings and cameras want beyond a default run's that
    the cache lacks (``VARIANTS``), said as they begin to compile."""
    missing = missing_variants(
        absgrad=trainer.strategy.absgrad,
        fisheye=any(view.camera.model == "fisheye" for view in trainer.scene.views))
    if missing:
        whose = " and ".join(VARIANTS[name].whose for name in missing)
        notice(f"compiling {whose} CPU kernels (once: later runs reuse them)")
    return missing


def _prepared(args: Namespace, ranks: group.Membership | None, where: Placement | None,
              writes: bool) -> tuple[Trainer, dict]:
    """The Trainer, its images decoded and (with --resume) its checkpoint loaded, and
    the run's config.json; nothing written to the output folder."""
    inputs = _checked_inputs(args, ranks)
    options = RunOptions(args.output, args.eval, args.eval_every, list(args.save_at),
                         args.checkpoint_every, progress=writes and not args.quiet,
                         writes=writes)
    trainer = Trainer(inputs.scene, inputs.store, inputs.config, options,
                      make_engine=partial(_engine, args, ranks, where))
    if args.resume:
        trainer.resume(inputs.folder.checkpoint)
    demo = args.data is None  # its images are made again where they are wanted
    record = {**inputs.config.to_dict(),
              "data": None if demo else str(inputs.scene.source.resolve()),
              "eval": args.eval,
              "resolution": args.resolution, "max_width": args.max_width,
              "max_pixels": args.max_pixels,
              "world_size": ranks.world if ranks else 1}
    return trainer, record


def _watcher(args: Namespace, trainer: Trainer, server) -> Watcher | None:
    """With --viewer, the page on the serving rank (``server``), a bystander elsewhere."""
    if not args.viewer:
        return None
    if server is None:
        return Bystander()
    from splatscale.viewer.app import live_run
    from splatscale.viewer.page import Scenery

    scenery = Scenery(trainer.store, trainer.train_ids, trainer.test_ids)
    return live_run(server, scenery, trainer.background, f"training {args.output}")


def _join_timeout(args: Namespace) -> float:
    return JOIN_TIMEOUT if args.join_timeout is None else args.join_timeout


def _balance(args: Namespace) -> str:
    return args.balance or "cost"


def _fixed_cost(args: Namespace) -> RowCost | None:
    """The row cost the flags fix, or None: fitted as the run goes."""
    if args.pixel_cost is None and args.intersection_cost is None:
        return None
    default = RowCost()
    return RowCost(args.pixel_cost or default.pixel,
                   args.intersection_cost or default.intersection)


def _engine(args: Namespace, ranks: group.Membership | None, where: Placement | None,
            model: GaussianModel, batch_size: int, background: torch.Tensor,
            ssim_weight: float) -> Engine:
    """This process' engine: over ``model``, or with several ranks over this rank's
    shard of it, on its device, in host memory with --offload."""
    offload = OffloadOptions(args.forwarding, args.lookahead) if args.offload else None
    if ranks is None:
        return make_engine(model, batch_size, background, ssim_weight, args.device, offload)
    assert where is not None  # ranks are always placed
    return make_engine(shard_of(model, ranks.rank, ranks.world), batch_size, background,
                       ssim_weight, where.device, offload,
                       RankOptions(_balance(args), _fixed_cost(args)))


def _read_as_run(args: Namespace, record: RunRecord | None) -> None:
    """The scene flags (``args.data``, ``.resolution``, ``.max_width``) not given set to
    the run's, as it read its scene; a model of no run needs ``--data``."""
    if record is None:
        if args.data is None:
            raise SplatscaleError(f"{args.model}: not a run's model (no config.json beside "
                                  "it); name its scene with --data")
        return
    if args.data is None:
        args.data = _recorded_scene(record, "--data")
    args.resolution = args.resolution or record.resolution
    args.max_width = args.max_width or record.max_width
    args.max_pixels = args.max_pixels or record.max_pixels


def _store_as_run(args: Namespace, record: RunRecord | None) -> ImageStore:
    """The scene's images read as the run of ``record`` read them, unless the flags
    say otherwise (``_read_as_run``), on its background, with its masks."""
    _read_as_run(args, record)
    scene = _scene(args)
    masks = (find_masks(scene, record.masks or "", record.alpha_mask, record.invert_masks,
                        record.skip_missing_masks)
             if record is not None and record.masked else None)
    return _store(args, scene, record is not None and record.white_background, masks=masks)


def _split_ids(scene: Scene, split: str, record: RunRecord | None) -> list[int]:
    """The views of ``split``: a run's own training or test views (every 8th view is
    a test view for a model of no run)."""
    train_ids, test_ids = scene.split(record.eval if record else True)
    ids = {"train": train_ids, "test": test_ids, "all": sorted(train_ids + test_ids)}[split]
    if not ids:
        # Only a run trained on every view has no test views: every 8th is one otherwise.
        assert record is not None, "a scene of views has test views"
        raise SplatscaleError(f"--split {split}: {record.path.parent} trained on every view "
                              "(without --eval), so it has no test views; --split train "
                              "scores the views it trained on")
    return ids


class Views(NamedTuple):
    """The views a model is rendered at (``cameras``: those of views ``ids`` of
    ``store``), read as its run read its scene."""

    model: GaussianModel
    store: ImageStore
    ids: list[int]
    cameras: list[Camera]
    about: dict


def _views(args: Namespace) -> Views:
    model_file, record = model_of(args.model)
    model = read_model(model_file).model
    store = _store_as_run(args, record)
    ids = _split_ids(store.scene, args.split, record)
    about = {"model": str(model_file.resolve()), "antialiased": model.antialiased,
             "split": args.split,
             "data": None if args.data is None else str(Path(args.data).resolve()),
             "resolution": args.resolution or 1, "max_width": args.max_width,
             "max_pixels": args.max_pixels}
    return Views(model, store, ids, [store.camera(i) for i in ids], about)


def _rendered(views: Views) -> Iterator[torch.Tensor]:
    """Each camera's render, [h, W, 3] in [0, 1], with a progress bar."""
    background = torch.tensor(views.store.background, dtype=views.model.means.dtype)
    for camera in tqdm(views.cameras, desc="rendering", unit="view", leave=False,
                       delay=1.0):
        with torch.no_grad():
            yield render_view(views.model, camera, background=background).rgb.clamp(0, 1)


def render(args: Namespace) -> None:
    """Render a model's views, or an orbit about what its capture looked at (an MP4),
    into a folder of renders, which never replaces a file that a render did not write
    there."""
    if args.orbit and args.split is not None:
        raise SplatscaleError(f"--split {args.split}: not with --orbit, which goes round "
                              "the whole capture")
    args.split = args.split or ("all" if args.orbit else "test")
    views = _views(args)
    model_file = Path(views.about["model"])
    kind = "orbit" if args.orbit else args.split
    folder = RenderFolder(args.output or model_file.parent / "renders" / kind)
    names = ([ORBIT_VIDEO] if args.orbit else
             render_names([views.store.camera(i).name for i in views.ids]))
    check_distinct(names)
    path = _orbit(args, views) if args.orbit else None
    folder.check(names)  # before the lock makes the folder
    with locked_folder(folder.path):
        folder.check(names)
        folder.begin(names, views.about)
        if path is not None:
            frames = map(_pixels, _rendered(views._replace(cameras=path)))
            write_mp4(frames, folder.file(ORBIT_VIDEO), args.fps)
        else:
            for name, rgb in zip(names, _rendered(views)):
                folder.write(name, _pixels(rgb))
    what = f"{args.frames} frames in {folder.path / ORBIT_VIDEO}" if args.orbit else \
        f"{len(names)} renders in {folder.path}"
    print(what)


ORBIT_VIDEO = "orbit.mp4"


def _orbit(args: Namespace, views: Views) -> list[Camera]:
    """A full turn about the point the scene's cameras looked at, upright as they were
    held, from the camera most like the others, at its distance and height."""
    cameras = views.cameras
    up = cameras_up(cameras)
    if up is None:
        raise SplatscaleError(f"{args.model}: its cameras' up directions cancel out, so "
                              "there is no up to orbit about")
    centres, forwards = camera_axes(cameras)
    pivot = look_at_point(centres, forwards, views.store.scene.points)
    start = cameras[most_typical(forwards)]
    width, height = even_size(start.width, start.height)
    start = Camera(start.viewmat, start.K, width, height, start.name)
    try:
        return orbit(start, pivot, up, args.frames)
    except ValueError:
        raise SplatscaleError(f"{args.model}: its cameras stand on the axis they looked "
                              "along, so there is no orbit about it") from None


def _pixels(rgb: torch.Tensor) -> np.ndarray:
    return (rgb * 255).round().to(torch.uint8).numpy()


def evaluate(args: Namespace) -> None:
    args.split = args.split or "test"
    views = _views(args)
    scores = ImageMetrics()
    for i, rgb in zip(views.ids, _rendered(views)):
        scores.add(rgb, views.store.as_float(i))
    scored = scores.summary()
    if views.store.masked:  # as the run's masks say: over the masked-in pixels
        scored["masked"] = True
    print(json.dumps(scored))


def export(args: Namespace) -> None:
    """Rewrite a model of any format we read; never over its own input. A PLY keeps a
    PLY's extra vertex properties and its up direction; a format with no place for
    them says which it dropped."""
    source, _ = model_of(args.model)
    model, up = read_model(source)
    extras = read_extras(source) if is_ply(source) else None
    output = _export_path(args, source)
    if args.format == "ply":
        write_ply(model, output, extras, up)
    else:
        (write_splat if args.format == "splat" else write_spz)(model, output)
        if extras is not None and extras.dtype.names:
            notice(f"{output}: the .{args.format} format has no place for {source}'s "
                   f"extra properties, dropped: {', '.join(extras.dtype.names)}")
        if model.antialiased and args.format == "splat":
            notice(f"{output}: the .splat format has no place for anti-aliased splats: "
                   "viewers will draw it as a plain model (a PLY or .spz keeps it)")
    print(f"wrote {output}")


def _export_path(args: Namespace, source: Path) -> Path:
    """Where ``export`` writes: a file of the format's suffix, which is not the input
    and, unless --overwrite, not a file already there."""
    suffix = f".{args.format}"
    output = args.output or source.with_suffix(suffix)
    said = f"-o {output}" if args.output is not None else str(output)
    if output.suffix.lower() != suffix:
        raise SplatscaleError(f"{said}: a {suffix} file's name ends in {suffix}")
    if output.resolve() == source.resolve():
        raise SplatscaleError(f"{said}: is the input model; choose another file"
                              if args.output is not None else
                              f"--format {args.format}: {source} is one already")
    if os.path.lexists(output) and not args.overwrite:
        raise SplatscaleError(f"{said}: exists; --overwrite replaces it")
    return output


def _served(host: str | None, port: int | None):
    from splatscale.viewer.app import served
    return served(host, port)


def view(args: Namespace) -> None:
    from splatscale.viewer.app import view as show_model

    model_file, record = model_of(args.model)
    model, up = read_model(model_file)
    scenery, background = None, torch.zeros(3)
    if args.data is not None or record is not None:
        scenery, background = _run_scenery(args, record)
    with _served(args.host, args.port) as server:
        show_model(server, model, scenery, background.to(model.means.dtype), str(args.model), up)


def _run_scenery(args: Namespace, record: RunRecord | None) -> tuple[Scenery, torch.Tensor]:
    """The scene beside a model: its run's, as it trained, unless the flags name another."""
    store = _store_as_run(args, record)
    train_ids, test_ids = store.scene.split(record is not None and record.eval)
    from splatscale.viewer.page import Scenery
    return Scenery(store, train_ids, test_ids), torch.tensor(store.background)


def prepare(args: Namespace) -> None:
    from splatscale.prepare.pipeline import Request, prepare as prepare_scene
    from splatscale.prepare.sfm import SfmSettings

    sfm = SfmSettings(args.camera_model, args.max_image_size, args.matcher, args.mapper)
    report = prepare_scene(Request(args.input, args.output, args.frames, sfm, args.overwrite,
                                   args.verbose, progress=not args.quiet))
    print(json.dumps(report))


COMMANDS = {"train": train, "prepare": prepare, "render": render, "eval": evaluate,
            "export": export, "view": view}

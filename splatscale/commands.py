"""What each CLI command does (argument parsing lives in cli.py)."""

from __future__ import annotations

import json
from argparse import Namespace
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import numba
import torch

from splatscale.atomic import write_json
from splatscale.data import load_scene
from splatscale.demo import demo_scene
from splatscale.data.images import ImageStore, write_png
from splatscale.engine.distributed import DistributedEngine, group, shard_of
from splatscale.engine.distributed.cost_model import RowCost
from splatscale.engine.local import LocalEngine
from splatscale.engine.offload import OffloadEngine
from splatscale.engine.offload.sharded import OffloadedShardEngine
from splatscale.errors import SplatscaleError, run_reported
from splatscale.messages import muted, notice
from splatscale.model.gaussians import GaussianModel
from splatscale.model.ply import read_ply, write_ply, write_splat
from splatscale.render import cuda_backend, render as render_view
from splatscale.train.checkpoint import load_trainer_state
from splatscale.train.config import TrainConfig
from splatscale.train.metrics import ImageMetrics
from splatscale.train.run_folder import RunFolder
from splatscale.train.trainer import EngineFactory, RunOptions, Trainer


def _scene(args: Namespace):
    """The scene at ``args.data``, or the built-in demo scene when none is given."""
    if args.data is None:
        return demo_scene(args.cache_dir)
    return load_scene(args.data, args.skip_missing_images)


def _store(args: Namespace, scene, white_background: bool = False) -> ImageStore:
    background = (1.0, 1.0, 1.0) if white_background else scene.background
    return ImageStore(scene, args.resolution, args.max_width, args.cache_dir, background)


def _check_device(args: Namespace) -> None:
    """--device cuda: one process, a GPU torch can see, gsplat's kernels built."""
    if args.device == "cpu":
        return
    if args.nproc > 1 or group.from_environment() is not None:
        raise SplatscaleError("--device cuda with several ranks: distributed training runs "
                              "on CPU ranks for now (its exchange goes over gloo in host "
                              "memory); train on one GPU, or drop --device cuda")
    if not torch.cuda.is_available():
        raise SplatscaleError(f"--device cuda: torch {torch.__version__} sees no CUDA device"
                              f" (its CUDA build: {torch.version.cuda or 'none'}); install a "
                              "CUDA build of torch on a machine with an NVIDIA GPU, or train "
                              "with --device cpu")
    cuda_backend.load_kernels()


# Flags that are settings of the run: on --resume the checkpoint's values hold.
RUN_FLAGS = {"batch_size": "--batch-size", "seed": "--seed",
             "white_background": "--white-background", "densify_until": "--densify-until"}


def _new_config(args: Namespace) -> TrainConfig:
    given = {name: getattr(args, name) for name in ("iterations", *RUN_FLAGS)}
    return TrainConfig(**{name: value for name, value in given.items() if value is not None})


def _resumed_config(args: Namespace, checkpoint: Path) -> TrainConfig:
    """The checkpoint's settings; a new --iterations extends (or shortens) the run."""
    saved = load_trainer_state(checkpoint)
    config = TrainConfig.from_dict(saved["config"])
    for name, flag in RUN_FLAGS.items():
        value = getattr(args, name)
        if value is not None and value != getattr(config, name):
            notice(f"{flag} {value} ignored: the resumed run keeps "
                   f"{getattr(config, name)} from its checkpoint")
    if args.iterations is not None and args.iterations != config.iterations:
        if args.iterations < saved["images_seen"]:
            raise SplatscaleError(f"--iterations {args.iterations}: {checkpoint} has already "
                                  f"trained on {saved['images_seen']} images")
        notice(f"--iterations: the run now ends after {args.iterations} images "
               f"(it was to end after {config.iterations})")
        config.iterations = args.iterations
    return config


def train(args: Namespace) -> None:
    """Check everything that can be checked, then take the folder and train (with
    ``--nproc N``: check here, then train in N spawned local ranks)."""
    _check_device(args)
    ranks = group.from_environment()
    if args.nproc > 1 and ranks is None:
        with muted():  # bad input is reported once, before ranks start; notices by rank 0
            _checked_inputs(args)[3].check()
        group.spawn(partial(_train_rank, args), args.nproc)
        return
    _share_cores(args, ranks)
    _train(args, ranks)


def _checked_inputs(args: Namespace) -> tuple[RunFolder, TrainConfig, object, ImageStore]:
    if args.forwarding is not None and not args.offload:
        flag = "--forwarding" if args.forwarding else "--no-forwarding"
        raise SplatscaleError(f"{flag}: only with --offload")
    folder = RunFolder(args.output)
    folder.check(args.resume, args.overwrite)
    config = _resumed_config(args, folder.checkpoint) if args.resume else _new_config(args)
    scene = _scene(args)
    return folder, config, scene, _store(args, scene, config.white_background)


def _train_rank(args: Namespace) -> int:
    """One spawned rank: like a rank started by torchrun."""
    ranks = group.from_environment()
    _share_cores(args, ranks)
    return run_reported(partial(_train, args, ranks))


def _share_cores(args: Namespace, ranks: group.Ranks | None) -> None:
    """Ranks on one machine split its cores, unless --threads says otherwise."""
    if ranks is not None and args.threads is None:
        use_threads(group.threads_per_rank(ranks.local_world))


def use_threads(threads: int) -> None:
    """Compute threads for torch and the numba kernels alike."""
    torch.set_num_threads(threads)
    numba.set_num_threads(threads)


def _train(args: Namespace, ranks: group.Ranks | None) -> None:
    try:
        folder, config, scene, store = _checked_inputs(args)
        writes = ranks is None or ranks.rank == 0
        options = RunOptions(args.output, args.eval, args.eval_every, list(args.save_at),
                             args.checkpoint_every, progress=writes and not args.quiet,
                             writes=writes)
        make_engine = _single_engine(args)
        if ranks is not None:
            group.join(ranks)
            make_engine = partial(_distributed_engine, ranks, args)
        trainer = Trainer(scene, store, config, options, make_engine=make_engine)
        with folder.lock() if writes else nullcontext():
            if args.resume:
                trainer.resume(folder.checkpoint)
                if writes:
                    folder.truncate_metrics(trainer.images_seen)
            elif writes:
                folder.clear_previous_run()
            if writes:
                write_json(args.output / "config.json", {
                    **config.to_dict(), "data": str(scene.source), "eval": args.eval,
                    "resolution": args.resolution, "max_width": args.max_width,
                    "world_size": ranks.world if ranks else 1})
            report = trainer.run()
        if writes:
            print(json.dumps(report))
    finally:
        if ranks is not None:
            group.leave()


def _fixed_cost(args: Namespace) -> RowCost | None:
    """The row cost the flags fix, or None: fitted as the run goes."""
    if args.pixel_cost is None and args.intersection_cost is None:
        return None
    default = RowCost()
    return RowCost(args.pixel_cost or default.pixel,
                   args.intersection_cost or default.intersection)


def _single_engine(args: Namespace) -> EngineFactory:
    if args.offload:
        return partial(OffloadEngine, device=args.device, forwarding=args.forwarding)
    return partial(LocalEngine, device=args.device)


def _distributed_engine(ranks: group.Ranks, args: Namespace, model: GaussianModel,
                        batch_size: int, background: torch.Tensor,
                        ssim_weight: float) -> DistributedEngine:
    """This rank's engine over its shard, which it offloads with --offload."""
    storage = (dict(device=args.device, forwarding=args.forwarding) if args.offload else {})
    engine = OffloadedShardEngine if args.offload else DistributedEngine
    return engine(shard_of(model, ranks.rank, ranks.world), batch_size, background, ssim_weight,
                  args.balance, _fixed_cost(args), **storage)


def _split_ids(scene, split: str) -> list[int]:
    train_ids, test_ids = scene.split(split != "all")
    return {"train": train_ids, "test": test_ids, "all": train_ids}[split]


def _views(args: Namespace):
    model = read_ply(args.model)
    scene = _scene(args)
    store = _store(args, scene)
    background = torch.tensor(store.background, dtype=model.means.dtype)
    for i in _split_ids(scene, args.split):
        camera = store.camera(i)
        with torch.no_grad():
            rgb = render_view(model, camera, background=background).rgb.clamp(0, 1)
        yield camera, rgb, store.as_float(i)


def render(args: Namespace) -> None:
    folder = args.output or args.model.parent / "renders" / args.split
    count = 0
    for camera, rgb, _ in _views(args):
        write_png((rgb * 255).round().to(torch.uint8).numpy(),
                  folder / (Path(camera.name).stem + ".png"))
        count += 1
    print(f"{count} renders in {folder}")


def eval(args: Namespace) -> None:  # noqa: A001 - the command's name
    scores = ImageMetrics()
    for _, rgb, target in _views(args):
        scores.add(rgb, target)
    print(json.dumps(scores.summary()))


def export(args: Namespace) -> None:
    """Rewrite a model; never over its own input."""
    model = read_ply(args.model)
    output = args.output or args.model.with_suffix(f".{args.format}")
    if output.resolve() == args.model.resolve():
        if args.output is not None:
            raise SplatscaleError(f"-o {output}: is the input model; choose another file")
        output = args.model.with_name(f"{args.model.stem}.exported.ply")
    if args.format == "ply":
        write_ply(model, output)
    else:
        write_splat(model, output)
    print(f"wrote {output}")

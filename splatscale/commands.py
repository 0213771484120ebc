"""What each CLI command does (argument parsing lives in cli.py)."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import torch

from splatscale.atomic import write_json
from splatscale.data import load_scene
from splatscale.demo import demo_scene
from splatscale.data.images import ImageStore, write_png
from splatscale.errors import SplatscaleError
from splatscale.model.ply import read_ply, write_ply, write_splat
from splatscale.render import render as render_view
from splatscale.train.checkpoint import load_checkpoint
from splatscale.train.config import TrainConfig
from splatscale.train.metrics import ImageMetrics
from splatscale.train.trainer import RunOptions, Trainer


def _scene(args: Namespace):
    """The scene at ``args.data``, or the built-in demo scene when none is given."""
    if args.data is None:
        return demo_scene(args.cache_dir)
    return load_scene(args.data, args.skip_missing_images)


def _store(args: Namespace, scene) -> ImageStore:
    background = (1.0, 1.0, 1.0) if getattr(args, "white_background", False) else scene.background
    return ImageStore(scene, args.resolution, args.max_width, args.cache_dir, background)


def _check_device(device: str) -> None:
    if device == "cuda":
        raise SplatscaleError("the cuda render backend is not built yet; train with --device cpu")


def train(args: Namespace) -> None:
    _check_device(args.device)
    if args.iterations < 1 or args.batch_size < 1:
        raise SplatscaleError("--iterations and --batch-size must be at least 1")
    checkpoint = args.output / "checkpoint.pt"
    if args.resume and not checkpoint.is_file():
        raise SplatscaleError(f"{checkpoint}: nothing to resume from")
    config = TrainConfig(iterations=args.iterations, batch_size=args.batch_size, seed=args.seed,
                         white_background=args.white_background)
    if args.densify_until is not None:
        config.densify_until = args.densify_until
    if args.resume:
        saved, _ = load_checkpoint(checkpoint)
        config = TrainConfig.from_dict({**saved["config"], "iterations": args.iterations})
    scene = _scene(args)
    store = _store(args, scene)
    options = RunOptions(args.output, args.eval, args.eval_every, list(args.save_at),
                         args.checkpoint_every, progress=not args.quiet)
    trainer = Trainer(scene, store, config, options)
    args.output.mkdir(parents=True, exist_ok=True)
    if args.resume:
        trainer.resume(checkpoint)
    else:
        (args.output / "metrics.jsonl").unlink(missing_ok=True)
    write_json(args.output / "config.json", {**config.to_dict(), "data": str(scene.source),
                                             "eval": args.eval, "resolution": args.resolution,
                                             "max_width": args.max_width})
    report = trainer.run()
    print(json.dumps(report))


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
    model = read_ply(args.model)
    output = args.output or args.model.with_suffix(f".{args.format}")
    if args.format == "ply":
        write_ply(model, output)
    else:
        write_splat(model, output)
    print(f"wrote {output}")

"""splatscale train | render | eval | export."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numba
import torch

from splatscale.errors import SplatscaleError

TRAIN_HELP = """Train a 3DGS model. --iterations counts images seen, as Grendel does:
a batch of B views makes N/B steps, so changing B keeps the training budget
(and every schedule: densification, opacity reset, SH degree, learning rate)."""


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: all)")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="where undistorted/downscaled images are cached "
                             "(default: ~/.cache/splatscale)")
    parser.add_argument("--resolution", type=int, default=1, choices=(1, 2, 4, 8),
                        help="divide image sizes by this")
    parser.add_argument("--max-width", type=int, default=None, help="cap the image width")
    parser.add_argument("--skip-missing-images", action="store_true",
                        help="use the views whose images are present when the scene lists "
                             "some that are absent (default: refuse, naming them)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="splatscale", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train a model", description=TRAIN_HELP)
    train.add_argument("data", nargs="?", default=None,
                       help="COLMAP folder or transforms.json scene (default: built-in demo)")
    train.add_argument("-o", "--output", type=Path, required=True)
    train.add_argument("--eval", action="store_true", help="hold out every 8th image for test")
    train.add_argument("--iterations", type=int, default=30_000, help="images to train on")
    train.add_argument("--batch-size", type=int, default=1)
    train.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--resume", action="store_true", help="continue from OUTPUT/checkpoint.pt")
    train.add_argument("--white-background", action="store_true")
    train.add_argument("--save-at", type=int, nargs="*", default=[],
                       help="also write point_cloud_<N>.ply after N images")
    train.add_argument("--eval-every", type=int, default=0, help="test every N images")
    train.add_argument("--checkpoint-every", type=int, default=1000,
                       help="write checkpoint.pt every N images")
    train.add_argument("--densify-until", type=int, default=None,
                       help="images after which densification stops (default 15000)")
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_common(train)

    render = sub.add_parser("render", help="render a model's views to PNG")
    render.add_argument("model", type=Path, help="a point_cloud.ply")
    render.add_argument("--data", default=None, help="the scene (default: built-in demo)")
    render.add_argument("--split", choices=("train", "test", "all"), default="test")
    render.add_argument("-o", "--output", type=Path, default=None,
                        help="folder for the PNGs (default: renders/ beside the model)")
    _add_common(render)

    evaluate = sub.add_parser("eval", help="test-view metrics of a model as JSON")
    evaluate.add_argument("model", type=Path)
    evaluate.add_argument("--data", default=None)
    evaluate.add_argument("--split", choices=("train", "test", "all"), default="test")
    _add_common(evaluate)

    export = sub.add_parser("export", help="convert a model")
    export.add_argument("model", type=Path)
    export.add_argument("--format", choices=("ply", "splat"), required=True)
    export.add_argument("-o", "--output", type=Path, default=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
        numba.set_num_threads(args.threads)
    from splatscale import commands

    try:
        return getattr(commands, args.command)(args) or 0
    except SplatscaleError as error:
        print(f"splatscale: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("splatscale: interrupted; the last checkpoint is intact", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

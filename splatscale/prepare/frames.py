"""Frames from a video, spread evenly over it, each the sharpest of its stretch.

PyAV decodes (FFmpeg inside its wheels, no system FFmpeg). The video's frames
are cut into ``count`` equal windows in order, and in each the frame with the
largest variance of the Laplacian (of its grey image, at most ``SHARPNESS_WIDTH``
wide) is kept: a frame blurred by motion has little high-frequency energy.
Frames are turned upright by the video's display matrix, as players show them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image

from splatscale.atomic import atomic_path
from splatscale.errors import DataError
from splatscale.messages import notice
from splatscale.prepare.scene_folder import frame_name

SHARPNESS_WIDTH = 640
JPEG_QUALITY = 95


def sharpness(grey: np.ndarray) -> float:
    """Variance of the 4-neighbour Laplacian of a grey image."""
    g = grey.astype(np.float32)
    laplacian = (g[1:-1, :-2] + g[1:-1, 2:] + g[:-2, 1:-1] + g[2:, 1:-1]
                 - 4.0 * g[1:-1, 1:-1])
    return float(laplacian.var())


def _open(path: Path):
    import av

    try:
        container = av.open(str(path))
    except (av.error.FFmpegError, OSError) as error:
        raise DataError(f"{path}: not a video that can be decoded ({error})") from None
    if not container.streams.video:
        container.close()
        raise DataError(f"{path}: holds no video stream")
    return container


def count_frames(path: Path) -> int:
    """The frames the video holds, its packets counted (no decoding): the header of a
    file cut short still lists them all, so it is not trusted, and a notice says when
    it lists more. Refuses a file that cannot be opened or holds no frame."""
    import av

    with _open(path) as container:
        stream = container.streams.video[0]
        listed = stream.frames  # 0 where the container does not say
        try:
            held = sum(1 for packet in container.demux(stream) if packet.size)
        except av.error.FFmpegError as error:
            raise DataError(f"{path}: cannot be read ({error})") from None
    if not held:
        raise DataError(f"{path}: holds no video frames")
    if held < listed:
        notice(f"{path}: holds {held} of the {listed} frames its header lists (cut "
               f"short?); frames are taken from those {held}")
    return held


def _upright(frame) -> Image.Image:
    image = frame.to_ndarray(format="rgb24")
    quarter_turns = round(getattr(frame, "rotation", 0) / 90) % 4
    return Image.fromarray(np.ascontiguousarray(np.rot90(image, quarter_turns)))


def _grey(frame) -> np.ndarray:
    width = min(frame.width, SHARPNESS_WIDTH)
    height = max(1, round(frame.height * width / frame.width))
    return frame.reformat(width=width, height=height, format="gray").to_ndarray()


def extract_frames(path: Path, count: int, total: int, folder: Path,
                   advance: Callable[[int], None] = lambda n: None) -> list[str]:
    """Write the sharpest frame of each of ``count`` windows over the video's ``total``
    frames to ``folder``, named by ``frame_name``; their names, in order. A notice
    says when decoding ends before ``total``. ``advance(1)`` is called for each frame
    decoded. One frame per window is held."""
    import av

    windows = min(count, total)
    names: list[str] = []
    best: tuple[int, float, int, Image.Image] | None = None  # window, score, index, image

    def keep(window_best: tuple[int, float, int, Image.Image]) -> None:
        name = frame_name(path, window_best[2])
        with atomic_path(folder / name) as tmp:
            window_best[3].save(tmp, format="JPEG", quality=JPEG_QUALITY)
        names.append(name)

    index = -1
    with _open(path) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        try:
            for index, frame in enumerate(container.decode(stream)):
                window = min(index * windows // total, windows - 1)
                score = sharpness(_grey(frame))
                if best is not None and window != best[0]:
                    keep(best)
                    best = None
                if best is None or score > best[1]:
                    best = (window, score, index, _upright(frame))
                advance(1)
        except av.error.FFmpegError as error:
            raise DataError(f"{path}: cannot be decoded at frame {index + 2} ({error})") from None
    if best is not None:
        keep(best)
    if index + 1 < total:
        notice(f"{path}: decoding ended after {index + 1} of its {total} frames; "
               f"{len(names)} of the {windows} frames asked were taken from those")
    return names

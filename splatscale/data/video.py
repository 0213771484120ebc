"""Videos written with PyAV (FFmpeg inside its wheels): H.264 in MP4, as every player
and browser plays it."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np

from splatscale.atomic import atomic_path

CODEC = "libx264"
QUALITY = 18  # x264's constant rate factor: visually lossless


def even_size(width: int, height: int) -> tuple[int, int]:
    """The largest even size within ``width`` x ``height``: H.264's 4:2:0 chroma
    halves both, so both must be even."""
    return width // 2 * 2, height // 2 * 2


def write_mp4(frames: Iterable[np.ndarray], path: Path, fps: int) -> int:
    """Write ``frames`` ([h, w, 3] uint8, all one size, both even) to ``path``
    atomically; the count written."""
    import av

    count = 0
    with atomic_path(path) as tmp:
        with av.open(str(tmp), "w", format="mp4") as container:
            stream = None
            for pixels in frames:
                if stream is None:
                    stream = container.add_stream(CODEC, rate=fps)
                    stream.height, stream.width = pixels.shape[:2]
                    stream.pix_fmt = "yuv420p"
                    stream.options = {"crf": str(QUALITY)}
                frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(pixels), format="rgb24")
                container.mux(stream.encode(frame))
                count += 1
            if stream is not None:
                container.mux(stream.encode())
    return count

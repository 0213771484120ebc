"""Decoded images within a memory budget.

The first images decoded stay in memory until they fill the budget; each one
after is written once as a raw uint8 file (its rows, as decoded) and read back
whole when it is used, with no decoding, while the previous step computes
(``read_ahead``).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from splatscale.atomic import atomic_path

MEMORY_SHARE = 0.25  # of the machine's memory: the command line's default budget


def machine_memory() -> int:
    """Bytes of physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_budget() -> int:
    return int(MEMORY_SHARE * machine_memory())


class ImageMemory:
    """Images by index, each made by ``decode(index)`` once. ``budget``: bytes kept in
    memory (None: every image); the rest are raw files where ``locate(index)`` says
    (a path and the image's shape), asked only for images not kept."""

    def __init__(self, budget: int | None,
                 locate: Callable[[int], tuple[Path, tuple[int, int, int]]],
                 decode: Callable[[int], np.ndarray]) -> None:
        self.budget, self.locate, self.decode = budget, locate, decode
        self.kept: dict[int, torch.Tensor] = {}
        self.kept_bytes = 0
        self._ahead: dict[int, Future] = {}
        self._reader: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def get(self, index: int) -> torch.Tensor:
        """Image ``index``: kept, read ahead, read from its raw file, or decoded; then
        kept if it fits the budget, else written to its raw file (once)."""
        kept = self.kept.get(index)
        if kept is not None:
            return kept
        with self._lock:
            ahead = self._ahead.pop(index, None)
        raw, shape = self.locate(index)
        on_disk = ahead is not None or raw.is_file()
        if ahead is not None:
            image = ahead.result()
        elif on_disk:
            image = _read(raw, shape)
        else:
            image = torch.from_numpy(self.decode(index))
        if self.budget is None or self.kept_bytes + image.nbytes <= self.budget:
            self.kept[index] = image
            self.kept_bytes += image.nbytes
        elif not on_disk:
            _write(image.numpy(), raw)
        return image

    def read_ahead(self, indices: list[int]) -> None:
        """Start reading the raw files of the images ``indices`` that are neither kept
        nor being read."""
        for index in indices:
            if index in self.kept:
                continue
            raw, shape = self.locate(index)
            if not raw.is_file():
                continue
            with self._lock:
                if index in self._ahead:
                    continue
                if self._reader is None:
                    self._reader = ThreadPoolExecutor(1, thread_name_prefix="read-ahead")
                self._ahead[index] = self._reader.submit(_read, raw, shape)


def _read(path: Path, shape: tuple[int, int, int]) -> torch.Tensor:
    """The raw file at ``path`` (whole: ``_write`` is atomic) as uint8 ``shape``."""
    return torch.from_numpy(np.fromfile(path, dtype=np.uint8).reshape(shape))


def _write(image: np.ndarray, path: Path) -> None:
    with atomic_path(path) as tmp:
        np.ascontiguousarray(image).tofile(tmp)

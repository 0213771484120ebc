"""Decoded images within a memory budget.

The first images decoded stay in memory until they fill the budget; each one
after is written once as a raw uint8 file (its rows, as decoded) and read back
when it is used, with no decoding: whole, while the previous step computes
(``read_ahead``), or only the rows asked for (a rank renders a band of rows).
"""

from __future__ import annotations

import math
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
        self._asked_before: set[int] = set()  # the previous read_ahead's images
        self._reader: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def get(self, index: int, rows: tuple[int, int] | None = None) -> torch.Tensor:
        """Image ``index``, or its rows ``[y0, y1)``: kept, read ahead, read from its raw
        file, or decoded; then kept if it fits the budget, else written to its raw file
        (once). Rows of an image that would not be kept are read alone from its file."""
        kept = self.kept.get(index)
        if kept is not None:
            return kept if rows is None else kept[rows[0]:rows[1]]
        with self._lock:
            ahead = self._ahead.pop(index, None)
        raw, shape = self.locate(index)
        on_disk = ahead is not None or raw.is_file()
        if ahead is not None:
            image = ahead.result()
        elif on_disk and rows is not None and not self._has_room(math.prod(shape)):
            return _read(raw, shape, rows)
        elif on_disk:
            image = _read(raw, shape)
        else:
            image = torch.from_numpy(self.decode(index))
        with self._lock:  # the viewer's thread reads images too
            keep = self._has_room(image.nbytes) and index not in self.kept
            if keep:
                self.kept[index] = image
                self.kept_bytes += image.nbytes
        if not keep and not on_disk:
            _write(image.numpy(), raw)
        return image if rows is None else image[rows[0]:rows[1]]

    def share(self, index: int) -> None:
        """Image ``index`` written to its raw file if it has none, so that the other
        processes reading this cache find it there, decoded."""
        raw, _ = self.locate(index)
        if not raw.is_file():
            _write(self.get(index).numpy(), raw)

    def _has_room(self, nbytes: int) -> bool:
        return self.budget is None or self.kept_bytes + nbytes <= self.budget

    def read_ahead(self, indices: list[int]) -> None:
        """Start reading the raw files of the images ``indices`` that are neither kept
        nor being read. Reads asked for two calls ago or earlier and not used since are
        dropped: each call asks for the batch after the one about to be used."""
        with self._lock:
            for index in set(self._ahead) - self._asked_before - set(indices):
                self._ahead.pop(index).cancel()
            self._asked_before = set(indices)
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


def _read(path: Path, shape: tuple[int, int, int],
          rows: tuple[int, int] | None = None) -> torch.Tensor:
    """The raw file at ``path`` (whole: ``_write`` is atomic) as uint8 ``shape``, or
    only its rows ``[y0, y1)``."""
    y0, y1 = rows or (0, shape[0])
    row_bytes = shape[1] * shape[2]
    data = np.fromfile(path, dtype=np.uint8, count=(y1 - y0) * row_bytes, offset=y0 * row_bytes)
    return torch.from_numpy(data.reshape(y1 - y0, *shape[1:]))


def _write(image: np.ndarray, path: Path) -> None:
    with atomic_path(path) as tmp:
        np.ascontiguousarray(image).tofile(tmp)

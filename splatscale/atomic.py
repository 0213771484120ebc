"""Atomic file writes: a reader sees the old file or the new one, never a torn one."""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it over ``path`` on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as error:
        if error.filename is None:  # a write through a file object names no file
            raise OSError(error.errno, error.strerror, str(path)) from None
        raise
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_json(path: str | Path, data: object) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2) + "\n")

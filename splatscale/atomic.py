"""Atomic file writes: a reader sees the old file or the new one, never a torn one.

The file gets the mode a plain ``open`` would give it (0666 less the umask),
not the temporary's 0600.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it over ``path`` on success. A
    link is followed (the file it names is replaced); anything there that is not a
    regular file (a folder, a device, a pipe) is refused. Errors name ``path``."""
    path = Path(path)
    if path.is_symlink():
        path = path.resolve()
    if os.path.lexists(path) and not path.is_file():
        raise OSError(errno.EEXIST, "not a regular file, so not replaced", str(path))
    with _named(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~umask())
    finally:
        os.close(fd)
    try:
        with _named(path, tmp):
            yield Path(tmp)
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
            os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


@contextmanager
def _named(path: Path, tmp: str | None = None) -> Iterator[None]:
    """OSErrors naming no file, or the temporary ``tmp``, re-raised naming ``path``."""
    try:
        yield
    except OSError as error:
        if tmp is None or error.filename in (None, tmp):
            raise OSError(error.errno, error.strerror, str(path)) from None
        raise


def umask() -> int:
    """The process' umask, read without changing it where Linux tells it."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    current = os.umask(0o022)  # elsewhere the only way to read it is to set it
    os.umask(current)
    return current


def write_json(path: str | Path, data: object) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2) + "\n")

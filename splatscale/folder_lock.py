"""One writer per output folder: a lock file naming the process that writes there.

``locked_folder`` makes the folder (and its missing parents) and holds the lock
while a command checks its inputs and writes; it takes over the lock of a process
that has ended. Folders it made are removed again if the command left nothing in
them (it was refused), so a refused command leaves the disk as it found it.
"""

from __future__ import annotations

import os
import socket
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from splatscale.errors import SplatscaleError
from splatscale.messages import notice

LOCK_NAME = ".splatscale.lock"


@contextmanager
def locked_folder(path: Path) -> Iterator[None]:
    made = _make_folders(path)
    try:
        with _locked(path):
            yield
    finally:
        for folder in reversed(made):
            try:
                folder.rmdir()
            except OSError:  # the command wrote there: it stays
                break


def _make_folders(path: Path) -> list[Path]:
    """Make the folder and its missing parents; those it made, outermost first."""
    if path.is_symlink() and not path.exists():
        raise SplatscaleError(f"{path}: a link to {os.readlink(path)}, which does not exist")
    if path.exists() and not path.is_dir():
        raise SplatscaleError(f"{path}: exists and is not a folder")
    missing = [p for p in (path, *path.parents) if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    return missing[::-1]


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    path = folder / LOCK_NAME
    taken_over = False
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
            break
        except FileExistsError:
            owner = _lock_owner(path)
            if taken_over or owner is None or _alive(*owner):
                holder = f"process {owner[0]} on {owner[1]}" if owner else "another run"
                raise SplatscaleError(
                    f"{folder}: {holder} is writing here (lock {path}; delete it "
                    "if that run is gone)") from None
            notice(f"{path}: taking over the lock of process {owner[0]}, which has ended")
            path.unlink(missing_ok=True)
            taken_over = True
    with os.fdopen(fd, "w") as handle:
        handle.write(f"{os.getpid()} {socket.gethostname()}\n")
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


def _lock_owner(path: Path) -> tuple[int, str] | None:
    """(pid, host) written in a lock file, or None when it cannot be read."""
    try:
        pid, host = path.read_text().split()
        return int(pid), host
    except (OSError, ValueError):
        return None


def _alive(pid: int, host: str) -> bool:
    if host != socket.gethostname():
        return True  # a process elsewhere cannot be checked from here
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

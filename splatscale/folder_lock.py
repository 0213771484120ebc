"""One writer per output folder: a lock file naming the process that writes there.

``locked_folder`` makes the folder (and its missing parents) and holds the lock
while a command checks its inputs and writes; it takes over the lock of a process
that has ended. Two processes taking over one lock at once cannot both hold it: the
lock is an ``flock`` on the file, and the file names its holder for the message.
Folders it made are removed again if the command left nothing in them (it was
refused), so a refused command leaves the disk as it found it.
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from splatscale.errors import SplatscaleError
from splatscale.messages import notice
from splatscale.native import STOP_SIGNALS

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
    """Hold the folder's lock file: an exclusive ``flock`` on it (which the kernel
    releases when its holder ends, however it ends), naming this process inside. A
    file naming a process that is still alive, or one on another host, is another
    writer's even without its flock (a run of an earlier version). A stop signal
    waits until the lock is both taken and sure to be removed again."""
    path = folder / LOCK_NAME
    unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        fd = _taken(path)
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
        raise
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
        yield
    finally:
        path.unlink(missing_ok=True)  # while flocked: no one takes it meanwhile
        os.close(fd)


def _taken(path: Path) -> int:
    """The lock file at ``path`` flocked, checked and written with this process' name:
    its descriptor."""
    fd = _flocked(path)
    try:
        owner = _lock_owner(path)
        if owner is not None:
            if _alive(*owner):
                raise SplatscaleError(_held_by(path.parent, owner))
            notice(f"{path}: taking over the lock of process {owner[0]}, which has ended")
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
    except BaseException:
        os.close(fd)
        raise
    return fd


def _flocked(path: Path) -> int:
    """An open descriptor of the lock file at ``path``, flocked by this process. A
    holder that removes the file as this one opens it leaves a file no one else will
    open: the lock is then taken on the file now at ``path``."""
    while True:
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise SplatscaleError(_held_by(path.parent, _lock_owner(path))) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def _held_by(folder: Path, owner: tuple[int, str] | None) -> str:
    holder = f"process {owner[0]} on {owner[1]}" if owner else "another run"
    return (f"{folder}: {holder} is writing here (lock {folder / LOCK_NAME}; delete it if "
            "that run is gone)")


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

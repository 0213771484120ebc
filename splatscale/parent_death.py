"""A process that ends with the process that started it."""

from __future__ import annotations

import ctypes
import os


def die_with_parent(signum: int) -> None:
    """Have this process sent ``signum`` when its parent dies (Linux's
    PR_SET_PDEATHSIG; elsewhere nothing)."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, int(signum))
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before the request was made
        os.kill(os.getpid(), signum)

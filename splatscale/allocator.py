"""Keep freed memory in the process: glibc's malloc otherwise maps each allocation
above its threshold (128 KiB at first) afresh with mmap and unmaps it when freed, so
every step's image- and splat-sized buffers are faulted in page by page and zeroed
by the kernel, every step. With the thresholds raised, a freed buffer serves the
next step's (docs/benchmarks.md has what it saved)."""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest: buffers above it are still mapped
TRIM_THRESHOLD = 1 << 30   # freed memory kept up to 1 GiB


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds; False where there is no glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                    and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    except (OSError, AttributeError):  # another C library: its own policy stays
        return False

"""Freed memory stays in the process (splatscale/allocator.py)."""

from __future__ import annotations

import resource
import sys

import numpy as np
import pytest

from splatscale.allocator import keep_freed_memory


def faults_refilling(size: int) -> int:
    """Page faults taken filling a fresh buffer of ``size`` bytes after freeing one."""
    np.ones(size // 4, np.float32).sum()  # allocated, touched, freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    np.ones(size // 4, np.float32).sum()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_freed_buffer_serves_the_next_one_without_page_faults():
    """A 16 MiB buffer, freed, serves the next one: glibc's default would unmap it and
    map the next afresh, 4096 page faults to fill it."""
    assert keep_freed_memory()
    assert faults_refilling(16 << 20) < 200

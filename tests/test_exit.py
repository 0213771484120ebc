"""A process that has finished exits: numba's threading layer is chosen so that one
whose kernels ran from a worker thread (the offload engine's host Adam) does not
spin at exit, as TBB's can."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import HANG_GUARD

KERNELS_FROM_A_WORKER = """
import sys
from concurrent.futures import ThreadPoolExecutor
import numpy as np
import splatscale
from splatscale.step.adam_kernels import adam_constants, adam_step
from splatscale.threads import threading_layer

def steps():
    arrays = [np.ones(1 << 20, np.float32) for _ in range(4)]
    for _ in range(20):
        adam_step(*arrays, np.float32(-1e-3), np.float32(1.0),
                  adam_constants(0.9, 0.999, 1e-15, np.float32))

steps()
with ThreadPoolExecutor(1) as worker:
    worker.submit(steps).result()
print(threading_layer())
"""


def ran(environment: dict[str, str]) -> str:
    import os

    result = subprocess.run([sys.executable, "-c", KERNELS_FROM_A_WORKER], capture_output=True,
                            text=True, timeout=HANG_GUARD, env={**os.environ, **environment})
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_the_chosen_layer_exits_and_is_not_tbb():
    """Where libtbb is installed (CI installs it) numba would pick TBB by itself."""
    assert ran({}) in ("omp", "workqueue")


@pytest.mark.parametrize("layer", ["omp", "workqueue"])
def test_a_layer_the_user_names_is_kept(layer):
    assert ran({"NUMBA_THREADING_LAYER": layer}) == layer

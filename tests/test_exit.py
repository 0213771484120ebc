"""A process that has finished exits: numba's threading layer is chosen so that one
whose kernels ran from a worker thread (the offload engine's host Adam) does not
spin at exit, as TBB's can; a stopped command exits with its own status."""

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


# A command whose start-up a stop cut short inside Python that C code ran: PyRun_String,
# as pybind11's exec runs it while torch loads.
STOPPED_IN_C = """
import ctypes, sys
from splatscale import cli, native

def stopped_in_c():
    run = ctypes.pythonapi.PyRun_String
    run.argtypes = (ctypes.c_char_p, ctypes.c_int, ctypes.py_object, ctypes.py_object)
    run.restype = ctypes.py_object
    run(b"raise KeyboardInterrupt", 257, {}, {})  # 257: Py_file_input

native.load_all = stopped_in_c
sys.exit(cli.main())
"""


def test_a_stopped_command_exits_with_its_status(tmp_path):
    """After a KeyboardInterrupt raised in Python that C code ran, CPython ends a
    ``python -m`` process (as ranks and torchrun run it) by SIGINT as it exits,
    whatever its status: a stopped command that has said its line exits 130."""
    (tmp_path / "stopped_in_c.py").write_text(STOPPED_IN_C)
    ran = subprocess.run([sys.executable, "-m", "stopped_in_c", "export", "missing.ply",
                          "--format", "splat"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=HANG_GUARD)
    assert (ran.returncode, ran.stderr) == (130, "splatscale: interrupted\n")


HALF_MADE = """
import sys
from splatscale import cli

class HalfMade:
    def __init__(self):
        raise KeyboardInterrupt  # a stop, while the object is being made

    def __del__(self):
        self.writer.close()  # never set: fails as a cut-short library object does

def stopped_while_making():
    HalfMade()

from splatscale import native
native.load_all = stopped_while_making
sys.exit(cli.main())
"""


def test_a_stop_says_one_line_whatever_a_half_made_object_raises(tmp_path):
    """An object a stop cut short fails in its finaliser after the command has said
    it was interrupted: nothing more is said."""
    (tmp_path / "half_made.py").write_text(HALF_MADE)
    ran = subprocess.run([sys.executable, "-m", "half_made", "export", "missing.ply",
                          "--format", "splat"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=HANG_GUARD)
    assert (ran.returncode, ran.stderr) == (130, "splatscale: interrupted\n")

"""A stop is clean wherever it lands: SIGTERM ends a command as Ctrl-C does (one
line, exit status 130, no lock left), also once pycolmap is loaded, whose glog takes
SIGTERM over as it loads, and while torch loads, whose C++ start-up cannot take a
KeyboardInterrupt (``splatscale/native.py``); a second stop inside a numba kernel
too. A stop after a command has ended changes nothing.

Each signal is sent at a moment the test sees happen (a stage's progress bar or a
line on stderr or stdout, the folder's lock file or checkpoint, an image in the
cache, a library mapped into the process), never after a sleep; the timeouts only
guard against a hang."""

from __future__ import annotations

import ast
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Callable

import pytest
import torch

import splatscale
from splatscale.launch import local_ranks
from splatscale.errors import QUIET_EXIT, SplatscaleError
from splatscale.folder_lock import LOCK_NAME
from splatscale.model.ply import write_ply
from splatscale.native import TAKE_SIGNALS_OVER, load_keeping_stop_signals
from splatscale.train.trainer import REPEAT_WINDOW
from tests.conftest import HANG_GUARD, data_path, random_model, wait_until
from tests.test_bad_input import on_a_terminal

SNOWMIKU = data_path("snowmiku")
STACK_DUMPS = ("Aborted", "stack trace", "Traceback")  # glog's and Python's
STOPS = [signal.SIGTERM, signal.SIGINT]
pytestmark = pytest.mark.skipif(not Path("/proc/self/maps").exists(),
                                reason="watches /proc/PID/maps")


class Command:
    """``python -m splatscale ARGS``, its stdout and stderr read as they come."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "splatscale", *args],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.said, self.printed = bytearray(), bytearray()
        self.readers = [threading.Thread(target=_read, args=(stream, into), daemon=True)
                        for stream, into in ((self.process.stderr, self.said),
                                             (self.process.stdout, self.printed))]
        for reader in self.readers:
            reader.start()

    @property
    def stderr(self) -> str:
        return self.said.decode(errors="replace")

    def says(self, text: str) -> Callable[[], bool]:
        return lambda: text in self.stderr

    def has_printed_its_result(self) -> bool:
        return self.printed.endswith(b"\n")

    def has_loaded(self, library: bytes) -> Callable[[], bool]:
        return lambda: library in Path(f"/proc/{self.process.pid}/maps").read_bytes()

    def stopped_when(self, seen: Callable[[], bool], signum: int) -> tuple[int, str]:
        """Send ``signum`` as soon as ``seen()``; the exit status and all of stderr."""
        self.signal_when(seen, signum)
        code = self.process.wait(timeout=HANG_GUARD)
        for reader in self.readers:
            reader.join(HANG_GUARD)
        return code, self.stderr

    def signal_when(self, seen: Callable[[], bool], signum: int) -> None:
        """Send ``signum`` as soon as ``seen()``, the command still running."""
        def moment() -> bool:
            assert self.process.poll() is None, f"ended before the moment:\n{self.stderr}"
            return seen()
        wait_until(moment, "the moment to stop it", every=0.01)
        self.process.send_signal(signum)


def _read(stream, into: bytearray) -> None:
    while chunk := os.read(stream.fileno(), 4096):
        into += chunk


def assert_no_stack_dump(stderr: str) -> None:
    for sign in STACK_DUMPS:
        assert sign not in stderr, stderr


def assert_stopped_as_ctrl_c(code: int, stderr: str) -> None:
    assert_no_stack_dump(stderr)
    assert code == 130, stderr
    assert on_a_terminal(stderr) == ["splatscale: interrupted"], stderr


# -- the mechanism ---------------------------------------------------------------------


def python(script: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                          text=True, timeout=HANG_GUARD)


def test_pycolmap_leaves_sigterm_to_python():
    """The snippet that shows glog's takeover (a plain ``import pycolmap`` dies of
    SIGTERM with a stack dump), through ``splatscale.native``."""
    ran = python("""
        import os, signal
        signal.signal(signal.SIGTERM, lambda *a: print("python's handler"))
        from splatscale.native import pycolmap
        os.kill(os.getpid(), signal.SIGTERM)
        """)
    assert_no_stack_dump(ran.stderr)
    assert (ran.returncode, ran.stdout) == (0, "python's handler\n"), ran.stderr


def test_a_stop_during_the_load_reaches_python_after_it(tmp_path):
    """A library that is sent SIGTERM as it loads and then takes SIGTERM over at the C
    level (as glog does): the signal waits for the load, then reaches Python's own
    handler, set again."""
    (tmp_path / "takes_sigterm_over.py").write_text(textwrap.dedent("""
        import ctypes, os, signal
        os.kill(os.getpid(), signal.SIGTERM)
        ctypes.CDLL(None).signal(signal.SIGTERM, signal.SIG_DFL)  # behind Python's back
        """))
    ran = python(f"""
        import signal, sys
        from splatscale.native import load_keeping_stop_signals
        signal.signal(signal.SIGTERM, lambda *a: print("python's handler"))
        sys.path.insert(0, {str(tmp_path)!r})
        load_keeping_stop_signals("takes_sigterm_over")
        print("loaded")
        """)
    assert (ran.returncode, ran.stdout) == (0, "python's handler\nloaded\n"), ran.stderr


def test_only_the_main_thread_loads_them():
    failed: list[BaseException] = []

    def load() -> None:
        try:
            load_keeping_stop_signals("a_library_never_loaded")
        except RuntimeError as error:
            failed.append(error)

    worker = threading.Thread(target=load)
    worker.start()
    worker.join(HANG_GUARD)
    assert len(failed) == 1 and "main thread" in str(failed[0])


def test_every_import_of_them_goes_through_native():
    package = Path(splatscale.__file__).parent
    direct = []
    for source in sorted(package.rglob("*.py")):
        if source.name == "native.py" and source.parent == package:
            continue
        for node in ast.walk(ast.parse(source.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module
                     else [])
            direct += [f"{source.relative_to(package)}: {name}" for name in names
                       if name.split(".")[0] in TAKE_SIGNALS_OVER]
    assert not direct, "\n".join(direct)


def test_every_library_loads_with_the_stop_signals_held():
    """torch's C++ start-up calls back into Python, where a stop's KeyboardInterrupt
    ends the process through std::terminate, with a native dump: every library that
    a command loads begins to load with both stop signals held."""
    ran = python("""
        import signal, sys
        from splatscale.cli import main

        held = {}

        class Watch:  # notes, as each library begins to load, whether the stops are held
            def find_spec(self, name, path=None, target=None):
                if name in ("torch", "numba", "pycolmap", "scipy") and name not in held:
                    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, ())
                    held[name] = {signal.SIGINT, signal.SIGTERM} <= blocked
                return None

        sys.meta_path.insert(0, Watch())
        main(["export", "missing.ply", "--format", "splat"])
        print(sorted(held.items()))
        """)
    assert ran.stdout == ("[('numba', True), ('pycolmap', True), ('scipy', True), "
                          "('torch', True)]\n"), ran.stderr


def test_a_launch_whose_ranks_all_finished_has_finished():
    """A stop that reaches the launcher as its ranks end changes nothing where every
    one had finished (a rank lets a stop pass once its command has ended): status 0,
    and no line; where one stopped, that rank said so, and the launch is a stop."""
    assert local_ranks._outcome([(1, 0), (0, 0)], 2, signalled=True) == 0
    assert local_ranks._outcome([(1, 0), (0, 130)], 2, signalled=True) == 130


def test_a_rank_the_launcher_stops_is_not_named_as_the_cause(monkeypatch):
    """A rank that lost its peer stopped quietly; the launcher kills the one that did
    not stop within its grace (here waiting on, say, a compile): the launch says
    the ranks lost contact, not that the killed rank was killed."""
    monkeypatch.setattr(local_ranks, "STOP_GRACE", 0.5)
    launch = local_ranks._Launch()
    try:
        launch.ranks = [subprocess.Popen([sys.executable, "-c", code]) for code in
                        ("import time; time.sleep(3600)", f"raise SystemExit({QUIET_EXIT})")]
        exits = local_ranks._wait(launch)
    finally:
        launch.close()
    assert exits == [(1, QUIET_EXIT), (0, QUIET_EXIT)]
    with pytest.raises(SplatscaleError, match="lost contact"):
        local_ranks._outcome(exits, 2, signalled=False)


@pytest.mark.parametrize("stop", STOPS, ids=lambda s: s.name)
def test_a_stop_in_a_numba_kernel_is_said_as_one(stop):
    """A run's second stop, which stops it at once, lands where it may: in a numba
    kernel, numba turns its KeyboardInterrupt, raised as the kernel calls back into
    Python (to box the arrays it returns, as the tile binning's does), into a
    SystemError caused by it. It is said as the stop it is, not as a bug."""
    ran = python(f"""
        import ctypes, os, sys
        import numba, numpy as np
        from splatscale.errors import run_reported
        from splatscale.train import trainer

        kill = ctypes.CDLL(None).kill
        kill.argtypes = (ctypes.c_int, ctypes.c_int)

        @numba.njit
        def kernel(pid, signum):
            if signum:
                kill(pid, signum)  # the stop arrives as the kernel runs
            return np.empty(1, np.uint8), np.zeros(1, np.int64)

        def training():
            kernel(0, 0)  # compiled, and its first call (which boxes otherwise) made
            trainer.REPEAT_WINDOW = 0.0  # any second stop comes after the first's window
            with trainer._stop_after_step():
                os.kill(os.getpid(), {int(stop)})  # the first: finish the step
                kernel(os.getpid(), {int(stop)})  # the second: stop at once

        sys.exit(run_reported(training))
        """)
    assert_no_stack_dump(ran.stderr)
    assert ran.returncode == 130, ran.stderr
    assert on_a_terminal(ran.stderr)[1:] == ["splatscale: interrupted"], ran.stderr


# -- the commands ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    """A third of snowmiku's photos: each SfM stage has seconds of work to stop."""
    folder = tmp_path_factory.mktemp("stop") / "photos"
    folder.mkdir()
    for source in sorted((SNOWMIKU / "images").iterdir())[::3]:
        shutil.copyfile(source, folder / source.name)
    return folder


# pycolmap stops a stage it runs (features, matching) at a stop signal as Python's
# handler raises, and logs why at glog's ERROR level, which prepare keeps visible.
PYCOLMAP_STOPPING = "Stopping thread..."


@pytest.mark.parametrize("stage", ["features", "matching"])
@pytest.mark.parametrize("stop", STOPS, ids=lambda s: s.name)
def test_prepare_stops_in_its_sfm_stages(photos, tmp_path, stage, stop):
    out = tmp_path / "scene"
    command = Command("prepare", str(photos), "-o", str(out))
    code, stderr = command.stopped_when(command.says(f"{stage}"), stop)
    assert_no_stack_dump(stderr)
    assert code == 130 and on_a_terminal(stderr)[-1] == "splatscale: interrupted", stderr
    assert not (out / LOCK_NAME).exists()
    assert PYCOLMAP_STOPPING not in stderr
    assert_stopped_as_ctrl_c(code, stderr)


def started_train(tmp_path: Path) -> tuple[Command, Path]:
    out = tmp_path / "run"
    return Command("train", str(SNOWMIKU), "-o", str(out), "--resolution", "8",
                   "--cache-dir", str(tmp_path / "cache"), "--quiet"), out


@pytest.mark.parametrize("stop", STOPS, ids=lambda s: s.name)
def test_train_stops_as_pycolmap_loads(tmp_path, stop):
    """pycolmap is the first thing a command loads: a stop during its load waits."""
    command, out = started_train(tmp_path)
    assert_stopped_as_ctrl_c(*command.stopped_when(command.has_loaded(b"pycolmap/_core"), stop))
    assert not (out / LOCK_NAME).exists()


@pytest.mark.parametrize("stop", STOPS, ids=lambda s: s.name)
def test_train_stops_as_torch_loads(tmp_path, stop):
    """The stop waits until the libraries have loaded (torch's C++ start-up cannot take
    it), then ends the command as at any moment of start-up."""
    command, out = started_train(tmp_path)
    assert_stopped_as_ctrl_c(*command.stopped_when(command.has_loaded(b"libtorch"), stop))
    assert not (out / LOCK_NAME).exists()


@pytest.mark.parametrize("stop", STOPS, ids=lambda s: s.name)
def test_train_stops_while_it_loads_the_scene(tmp_path, stop):
    """The lock taken, the scene and its images being read (pycolmap loaded)."""
    command, out = started_train(tmp_path)
    assert_stopped_as_ctrl_c(*command.stopped_when((out / LOCK_NAME).exists, stop))
    assert not (out / LOCK_NAME).exists()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def started_view(tmp_path: Path) -> tuple[Command, Path]:
    model, cache = tmp_path / "model.ply", tmp_path / "cache"
    write_ply(random_model(10, dtype=torch.float32), model)
    return Command("view", str(model), "--data", str(SNOWMIKU), "--resolution", "8",
                   "--cache-dir", str(cache), "--port", str(free_port())), cache


@pytest.mark.parametrize("stop", STOPS, ids=lambda s: s.name)
def test_view_stops_while_it_reads_a_colmap_scene(tmp_path, stop):
    command, cache = started_view(tmp_path)

    def decoding() -> bool:  # an image is written to the cache
        return any(cache.glob("*/*/*"))
    assert_stopped_as_ctrl_c(*command.stopped_when(decoding, stop))


@pytest.mark.parametrize("stop", STOPS, ids=lambda s: s.name)
def test_view_of_a_colmap_scene_stops_as_every_command_does(tmp_path, stop):
    """Serving, as while it reads the scene: a stop, the viewer's only way to end,
    is said as one (exit status 130), never as a success."""
    command, _ = started_view(tmp_path)
    code, stderr = command.stopped_when(command.says("(Ctrl-C to stop)"), stop)
    assert_no_stack_dump(stderr)
    assert code == 130, stderr
    assert [line for line in on_a_terminal(stderr)
            if "viewing" not in line] == ["splatscale: interrupted"], stderr


@pytest.mark.parametrize("nproc, stop", [(1, signal.SIGTERM), (1, signal.SIGINT),
                                         (2, signal.SIGTERM)], ids=lambda v: str(v))
def test_a_stop_after_the_run_has_ended_changes_nothing(tmp_path, nproc, stop):
    """Its result printed, a run has ended; a stop as its processes exit (Python sets
    the default handlers back as it shuts down) neither kills one nor says anything:
    exit status 0. Only a stop that beats the command's return by the instants after
    the print is still a stop (status 130, its line): never a signal's death."""
    out = tmp_path / "run"
    command = Command("train", str(SNOWMIKU), "-o", str(out), "--resolution", "8",
                      "--iterations", "2", "--nproc", str(nproc),
                      "--cache-dir", str(tmp_path / "cache"), "--quiet")
    wait_until(lambda: command.has_printed_its_result() or command.process.poll() is not None,
               "the run's result", every=0.01)
    command.process.send_signal(stop)  # nothing, where it has exited already
    code = command.process.wait(timeout=HANG_GUARD)
    for reader in command.readers:
        reader.join(HANG_GUARD)
    stderr = command.stderr
    assert_no_stack_dump(stderr)
    assert command.printed.startswith(b"{"), stderr
    assert ((code == 0 and "interrupted" not in stderr)
            or (code == 130 and on_a_terminal(stderr)[-1] == "splatscale: interrupted")), stderr
    assert (out / "report.json").exists() and not (out / LOCK_NAME).exists()


@pytest.mark.slow
@pytest.mark.parametrize("stop", STOPS, ids=lambda s: s.name)
def test_a_second_stop_ends_training_at_once(tmp_path, stop):
    """The second stop, more than ``REPEAT_WINDOW`` after the first, lands inside the
    step (in a numba kernel as often as not) unless the step has ended by then: one
    line, exit status 130, the last checkpoint whole."""
    out = tmp_path / "run"
    # Whole images: a step of 32 lasts seconds, of which the kernels take the most.
    command = Command("train", str(SNOWMIKU), "-o", str(out), "--batch-size", "32",
                      "--iterations", "100000", "--checkpoint-every", "32",
                      "--cache-dir", str(tmp_path / "cache"), "--quiet")
    command.signal_when((out / "checkpoint.pt").exists, stop)  # the next step under way
    wait_until(command.says("finishing this step"), "the first stop taken", every=0.01)
    first = time.monotonic()
    # The window is the rule's, not a guess at a moment: a second stop within it is the
    # first one arriving again (torchrun passes a terminal's Ctrl-C on as SIGTERM).
    wait_until(lambda: (time.monotonic() - first > REPEAT_WINDOW
                        or command.process.poll() is not None),
               "the first stop's window to pass", every=0.01)
    command.process.send_signal(stop)  # nothing, where the step ended and it stopped
    code = command.process.wait(timeout=HANG_GUARD)
    for reader in command.readers:
        reader.join(HANG_GUARD)
    assert_no_stack_dump(command.stderr)
    assert code == 130, command.stderr
    last = on_a_terminal(command.stderr)[-1]
    assert last == "splatscale: interrupted" or "checkpoint.pt is saved" in last, last
    assert torch.load(out / "checkpoint.pt", weights_only=False)["trainer"]["images_seen"] >= 32
    assert not (out / LOCK_NAME).exists()

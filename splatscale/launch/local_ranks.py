"""``--nproc N``'s launcher: N local ranks, each this same command under torchrun's
environment, and the signals and exit status of the whole.

- SIGINT and SIGTERM sent to the launcher reach every rank once: the ranks run in
  a process group of their own, so a terminal's Ctrl-C reaches them only through
  the launcher. A rank ignores both until it can act on them; one sent before
  that is read from the launcher's stop pipe when the rank starts listening.
- A rank whose launcher dies is sent SIGTERM (Linux), so it never trains on alone:
  it stops as on Ctrl-C, after a checkpoint.
- The exit status is that of the rank that failed first and said why
  (``errors.run_reported``); when none did (a rank killed by a signal), the
  launcher says which rank ended how. When every rank finished, it is 0, even
  if a stop signal came as they ended.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time

from splatscale.errors import QUIET_EXIT, SplatscaleError, interrupt
from splatscale.messages import say
from splatscale.parent_death import die_with_parent

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOP_PIPE = "SPLATSCALE_STOP_FD"  # set in a rank's environment by this launcher
STOP_GRACE = 10.0  # seconds the other ranks get to stop by themselves after one fails


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _rank_starts() -> None:
    """In a rank, before it runs Python: a process group of its own, and the stop
    signals ignored, so that its start-up is not cut by one."""
    os.setpgid(0, 0)
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


class _Launch:
    """The ranks of one launch, and the stop signals the launcher passed on."""

    def __init__(self) -> None:
        self.ranks: list[subprocess.Popen] = []
        self.signalled = False
        self.stop_read, self.stop_write = os.pipe()

    def start(self, argv: list[str], rank: int, nproc: int, port: int) -> None:
        environment = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank),
                           WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                           **{STOP_PIPE: str(self.stop_read)})
        self.ranks.append(subprocess.Popen(
            [sys.executable, "-m", "splatscale", *argv], env=environment,
            pass_fds=(self.stop_read,), preexec_fn=_rank_starts))

    def forward(self, signum: int, frame) -> None:
        if not self.signalled:
            os.write(self.stop_write, b"s")  # for the ranks not listening yet
        self.signalled = True
        for process in self.ranks:
            if process.poll() is None:
                try:
                    os.kill(process.pid, signum)
                except ProcessLookupError:
                    pass

    def close(self) -> None:
        os.close(self.stop_read)
        os.close(self.stop_write)


def spawn(argv: list[str], nproc: int) -> int:
    """Run ``splatscale argv`` as ``nproc`` local ranks; return the run's exit status."""
    launch, port = _Launch(), _free_port()
    previous = {s: signal.signal(s, launch.forward) for s in STOP_SIGNALS}
    try:
        for rank in range(nproc):
            if not launch.signalled:
                launch.start(argv, rank, nproc, port)
        exits = _wait(launch)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        launch.close()
    return _outcome(exits, nproc, launch.signalled)


def _wait(launch: _Launch) -> list[tuple[int, int]]:
    """(rank, exit code) in the order the ranks ended. Once one fails, the others get
    ``STOP_GRACE`` seconds to stop by themselves (their collectives fail), then are
    killed: a rank without its peers can do nothing more; it ends as having stopped
    quietly (``QUIET_EXIT``), since it is not the cause. After a stop signal every
    rank was told, and each stops by itself however long its checkpoint takes."""
    processes = launch.ranks
    exits: list[tuple[int, int]] = []
    killed: set[int] = set()
    deadline = None
    while len(exits) < len(processes):
        time.sleep(0.1)
        for rank, process in enumerate(processes):
            code = process.poll()
            if code is not None and rank not in {r for r, _ in exits}:
                exits.append((rank, QUIET_EXIT if rank in killed else code))
                if code != 0 and deadline is None and not launch.signalled:
                    deadline = time.monotonic() + STOP_GRACE
        if deadline is not None and time.monotonic() > deadline:
            for rank, process in enumerate(processes):
                if process.poll() is None:
                    process.kill()
                    killed.add(rank)
    return exits


def _outcome(exits: list[tuple[int, int]], nproc: int, signalled: bool) -> int:
    """The exit status of a launch; a line when no rank said why it ended."""
    codes = [code for _, code in exits]
    if codes == [0] * nproc:  # every rank finished: a stop that came since changed nothing
        return 0
    if signalled:
        if 130 not in codes:
            say("interrupted")
        return 130
    for rank, code in exits:
        if code in (0, QUIET_EXIT):
            continue
        if code > 0:
            return code  # that rank said why
        name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        raise SplatscaleError(f"rank {rank} of {nproc} was killed by {name}; the other "
                              "ranks were stopped")
    if QUIET_EXIT in codes:
        raise SplatscaleError("the ranks lost contact with each other (one stopped "
                              "answering) and none could say why")
    return 0


def launched() -> bool:
    """Whether this process is a rank this launcher started (which holds the lock)."""
    return STOP_PIPE in os.environ


def as_launched_rank() -> None:
    """In a rank this launcher started (else nothing): die with the launcher, take the
    stop signals from here on, and stop quietly if one came before (KeyboardInterrupt,
    as Ctrl-C during start-up)."""
    if not launched():
        return
    die_with_parent(signal.SIGTERM)  # elsewhere than Linux, the stop pipe's end tells
    for signum in STOP_SIGNALS:
        signal.signal(signum, interrupt)
    readable, _, _ = select.select([int(os.environ[STOP_PIPE])], [], [], 0)
    if readable:  # a stop byte, or the end of the pipe: the launcher is gone
        raise KeyboardInterrupt

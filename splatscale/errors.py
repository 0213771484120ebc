"""Errors a user can act on: the message names the file (or flag) and the problem.

``run_reported`` prints each as one line, ``splatscale: error: <message>``, and
returns its ``exit_code``; anything else that escapes is a bug of ours.

With several ranks, one voice: an error every rank meets together (``voice``
"rank 0": the run diverged, was interrupted, or the ranks did not all join) is
said by rank 0; an error one rank meets alone is said by that rank, as
``rank R: <message>``; a rank that stops because another failed says nothing
and exits with ``QUIET_EXIT``, so that the launcher knows who spoke.
"""

from __future__ import annotations

import sys
import traceback
from typing import Callable

from splatscale.messages import rank, say

QUIET_EXIT = 3  # a rank that stopped without a word, because another failed or was stopped


class SplatscaleError(Exception):
    """Base of the errors the CLI reports as one line, without a traceback."""

    exit_code = 2
    voice = "self"  # who says it among ranks: "self" (the rank that met it) or "rank 0"
    heading = "error: "  # what the line says it is


class DataError(SplatscaleError, ValueError):
    """Input data that cannot be used."""


class TrainingDiverged(SplatscaleError):
    """A training step produced a non-finite loss or parameter."""

    exit_code = 1
    voice = "rank 0"


class Interrupted(SplatscaleError):
    """Ctrl-C: the run stopped after a step and saved a checkpoint, as the user asked:
    not an error."""

    exit_code = 130
    voice = "rank 0"
    heading = ""


class StoppedByPeer(Exception):
    """Another rank failed (and says why); this one stops without a word."""


_signalled = False  # a stop signal arrived before training took the signals over
_ended = False  # the command has ended (``run_reported``): a stop has nothing left to stop


def interrupt(signum: int, frame) -> None:
    """A stop signal's handler until training takes them over: stop now, and remember
    why, so that an import the KeyboardInterrupt cut short (numpy's, say, which then
    fails oddly) reads as the interruption it is, not as a bug. Once the command has
    ended, its outcome stands: the signal passes, and the process ends as it would
    have (a finished run is not said to be interrupted)."""
    global _signalled
    if _ended:
        return
    _signalled = True
    raise KeyboardInterrupt


def interruption(error: BaseException) -> bool:
    """Whether ``error`` is a stop signal's KeyboardInterrupt, however a library wrapped
    it: numba turns one raised as a kernel calls back into Python (to box its result)
    into a SystemError, whose cause is the KeyboardInterrupt."""
    pending: list[BaseException | None] = [error]
    seen: set[int] = set()
    while pending:
        link = pending.pop()
        if link is None or id(link) in seen:
            continue
        if isinstance(link, KeyboardInterrupt):
            return True
        seen.add(id(link))
        pending += [link.__cause__, link.__context__]
    return False


# What gloo says when a peer process has gone or stopped answering.
_LOST_PEER = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
              "Timed out", "timed out", "Socket closed")


def lost_peer(error: BaseException) -> bool:
    """Whether ``error`` is a collective failing because another rank stopped."""
    if isinstance(error, StoppedByPeer):
        return True
    dist = sys.modules.get("torch.distributed")
    if dist is not None and isinstance(error, getattr(dist, "DistNetworkError", ())):
        return True
    return isinstance(error, RuntimeError) and any(s in str(error) for s in _LOST_PEER)


def run_reported(call: Callable[[], int | None]) -> int:
    """``call()``'s exit status, every failure turned into one line on stderr, said
    by the rank whose failure it is. A stop signal that comes once ``call`` has ended
    changes nothing (``interrupt``)."""
    global _ended
    _ended = False
    try:
        try:
            return call() or 0
        finally:
            _ended = True
    except (Exception, KeyboardInterrupt) as error:  # noqa: BLE001 - each said as it should be
        return _report(error, rank())


def _silence_finalisers() -> None:
    """A stop may cut a library's object short while it is being made (an image writer
    of viser's, say), whose finaliser then fails as the process ends: the command has
    said how it ended, and what such finalisers raise from here on is not said."""
    sys.unraisablehook = lambda unraisable: None


def _report(error: BaseException, me: int | None) -> int:
    if me is not None and lost_peer(error):
        return QUIET_EXIT
    prefix = f"rank {me}: " if me is not None else ""
    if interruption(error) or _signalled:
        _silence_finalisers()
        if me in (None, 0):
            say("interrupted")
            return 130
        return QUIET_EXIT
    if isinstance(error, SplatscaleError):
        if _speaks(error.voice, me):
            say(f"{error.heading}{'' if error.voice != 'self' else prefix}{error}")
        return error.exit_code
    if isinstance(error, OSError):  # the disk, permissions, a path that is a file
        where = f"{error.filename}: " if error.filename else ""
        say(f"error: {prefix}{where}{error.strerror or error}")
        return 2
    traceback.print_exc()  # anything else is our bug: say so, keep the traceback
    say(f"internal error: {prefix}this is a bug in splatscale, not in your input; "
        "please report it with the traceback above")
    return 1


def _speaks(voice: str, me: int | None) -> bool:
    return me is None or voice == "self" or me == 0

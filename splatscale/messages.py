"""What the user is told on stderr: one voice however many ranks run.

Ranks started together meet the same inputs and make the same decisions, so
only rank 0 speaks (``RANK`` is set by torchrun and by ``--nproc``'s spawning).
The launching process checks the inputs before spawning ranks, with notices
``muted``: rank 0 says them again when it checks the same inputs. Notices said
while a run checks its inputs are ``held`` until every check has passed. An
error that one rank meets alone is said by that rank (``errors.run_reported``).
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Iterator

_muted = False
_held: list[str] | None = None


def rank() -> int | None:
    """This process' rank when it is one of several; None when it trains alone."""
    try:
        world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ["RANK"])
    except (KeyError, ValueError):  # a launcher's bad variables are reported elsewhere
        return None
    return rank if world > 1 and 0 <= rank < world else None


def speaks() -> bool:
    return not _muted and rank() in (None, 0)


def say(message: str) -> None:
    """``splatscale: <message>`` on stderr, whatever the rank."""
    print(f"splatscale: {message}", file=sys.stderr, flush=True)


def notice(message: str) -> None:
    """``splatscale: <message>`` on stderr, from rank 0 alone."""
    if not speaks():
        return
    if _held is not None:
        _held.append(message)
    else:
        say(message)


@contextmanager
def held() -> Iterator[None]:
    """Notices said inside wait: they are said when the block succeeds, and dropped
    when it fails, so that a refused run says one line, why."""
    global _held
    _held = []
    try:
        yield
    except BaseException:
        _held = None
        raise
    pending, _held = _held, None
    for message in pending:
        say(message)


@contextmanager
def muted() -> Iterator[None]:
    global _muted
    _muted = True
    try:
        yield
    finally:
        _muted = False

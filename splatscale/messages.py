"""What the user is told on stderr besides errors: one voice however many ranks run.

Ranks started together meet the same inputs and make the same decisions, so
only rank 0 speaks (``RANK`` is set by torchrun and by ``--nproc``'s spawning).
The launching process checks the inputs before spawning ranks, with notices
``muted``: rank 0 says them again when it checks the same inputs.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Iterator

_muted = False


def speaks() -> bool:
    return not _muted and os.environ.get("RANK", "0") == "0"


def notice(message: str) -> None:
    """``splatscale: <message>`` on stderr, from rank 0 alone."""
    if speaks():
        print(f"splatscale: {message}", file=sys.stderr)


@contextmanager
def muted() -> Iterator[None]:
    global _muted
    _muted = True
    try:
        yield
    finally:
        _muted = False

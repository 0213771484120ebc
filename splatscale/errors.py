"""Errors a user can act on: the message names the file (or flag) and the problem.

``run_reported`` prints each as one line, ``splatscale: error: <message>``, and
returns its ``exit_code``; anything else that escapes is a bug of ours.
"""

import traceback
from typing import Callable

from splatscale.messages import notice


class SplatscaleError(Exception):
    """Base of the errors the CLI reports as one line, without a traceback."""

    exit_code = 2


class DataError(SplatscaleError, ValueError):
    """Input data that cannot be used."""


class TrainingDiverged(SplatscaleError):
    """A training step produced a non-finite loss or parameter."""

    exit_code = 1


class Interrupted(SplatscaleError):
    """Ctrl-C: the run stopped after a step and saved a checkpoint."""

    exit_code = 130


def run_reported(call: Callable[[], int | None]) -> int:
    """``call()``'s exit status, every failure turned into one line on stderr (printed
    by rank 0 alone when ranks run together: they all meet the same bad input)."""
    try:
        return call() or 0
    except SplatscaleError as error:
        notice(f"error: {error}")
        return error.exit_code
    except OSError as error:  # the disk, permissions, a path that is a file: the environment
        where = f"{error.filename}: " if error.filename else ""
        notice(f"error: {where}{error.strerror or error}")
        return 2
    except KeyboardInterrupt:
        notice("interrupted")
        return 130
    except Exception:  # noqa: BLE001 - anything else is our bug: say so, keep the traceback
        traceback.print_exc()
        notice("internal error: this is a bug in splatscale, not in your input; "
            "please report it with the traceback above")
        return 1

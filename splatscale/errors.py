"""Errors a user can act on: the message names the file (or flag) and the problem.

The CLI prints each as one line, ``splatscale: error: <message>``, and exits
with its ``exit_code``; anything else that escapes is a bug of ours.
"""


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

"""Errors a user can act on: the message names the file and the problem."""


class SplatscaleError(Exception):
    """Base of the errors the CLI reports as one line, without a traceback."""


class DataError(SplatscaleError, ValueError):
    """Input data that cannot be used."""

"""The ranges the numbers of a run's settings take, for the flags and the settings file."""

MAX_SEED = 2 ** 32 - 1  # numpy's generators take no larger seed
MAX_COUNT = 2 ** 62     # beyond it, counts overflow the 64-bit integers of torch and numpy

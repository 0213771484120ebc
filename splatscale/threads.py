"""CPU threads: the cores this process may use, how many threads torch and the numba
kernels run, and which of numba's threading layers they run on.

numba prefers TBB wherever ``libtbb`` is installed (OpenCV's packages bring it).
With TBB a process whose kernels ran from a worker thread (the offload engine's
host Adam) can spin forever in ``tbb::finalize`` at exit, and training runs
slower than on OpenMP. So OpenMP comes first, then the workqueue, and TBB only
where neither loads. A layer the user names in numba's own variables wins.
"""

from __future__ import annotations

import os

from splatscale.numba_config import set_read_option

PRIORITY = ("omp", "workqueue", "tbb")


def choose_threading_layer() -> None:
    """Prefer ``PRIORITY``, unless NUMBA_THREADING_LAYER(_PRIORITY) says otherwise."""
    if "NUMBA_THREADING_LAYER" in os.environ or "NUMBA_THREADING_LAYER_PRIORITY" in os.environ:
        return
    os.environ["NUMBA_THREADING_LAYER_PRIORITY"] = " ".join(PRIORITY)
    set_read_option("THREADING_LAYER_PRIORITY", list(PRIORITY))


def threading_layer() -> str:
    """The layer numba's parallel kernels run on ("none" before any has run)."""
    import numba

    try:
        return numba.threading_layer()
    except ValueError:  # no parallel kernel has run in this process yet
        return "none"


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, where the OS tells it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def ready_vector_math() -> None:
    """torch's exp and log, once each, on this thread alone. torch's vector math (MKL's
    on x86) readies itself on its first call, and two of torch's threads making that
    call at once were seen to compute one thread's share to about 14 bits (on an Intel
    Emerald Rapids machine, about one process in seven): the same command then trained
    another model."""
    import torch

    one = torch.ones(1)
    torch.exp(one)
    torch.log(one)


def use_threads(threads: int) -> None:
    """Compute threads for torch and the numba kernels alike."""
    import numba
    import torch

    torch.set_num_threads(threads)
    numba.set_num_threads(threads)

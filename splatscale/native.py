"""Native libraries that take the stop signals over as they load, loaded so that
Python keeps them: ``from splatscale.native import pycolmap``.

pycolmap sets glog's failure-signal handler as it loads, for SIGTERM among the
crash signals: a SIGTERM then prints a native stack dump and kills the process
behind Python's back, so a stopped command says nothing useful and leaves its
folder's lock. Loaded from here, such a library loads with SIGINT and SIGTERM
blocked in this thread, and Python's handlers for both are set again before they
are unblocked: a stop that arrives meanwhile waits, then reaches Python's handler
(Ctrl-C's clean stop). The crash signals stay glog's: a crash is a bug of native
code, and its stack is what a report of it needs.

Measured by a SIGTERM sent after the import to a process with a Python handler
set before it: pycolmap 4.2 takes SIGTERM; torch, numba, viser, av and gsplat take
neither signal (nor do numba's and torch's thread pools when they start, nor
viser's server).

A stop must not cut torch's import short either: as it loads, its C++ side calls
back into Python (pybind11), and a KeyboardInterrupt raised there ends the process
through std::terminate, with a native dump and no word. So the CLI loads every
library with the stop signals held (``stop_signals_held``); a stop sent meanwhile
is taken once they have loaded.
"""

from __future__ import annotations

import importlib
import signal
import threading
from contextlib import contextmanager
from types import ModuleType
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:  # what ``__getattr__`` loads, as the type checker should see it
    import pycolmap as pycolmap

STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
TAKE_SIGNALS_OVER = ("pycolmap",)


def __getattr__(name: str) -> ModuleType:
    """``splatscale.native.<name>`` for a library of ``TAKE_SIGNALS_OVER``: loaded on
    first use, as ``load_keeping_stop_signals`` loads it."""
    if name not in TAKE_SIGNALS_OVER:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = load_keeping_stop_signals(name)
    globals()[name] = module  # later lookups find it without coming here
    return module


def load_keeping_stop_signals(name: str) -> ModuleType:
    """The module ``name``, imported with Python's handlers for SIGINT and SIGTERM
    kept: a stop signal sent while it loads is delivered to Python's handler once it
    has loaded. Main thread only, the one where Python sets handlers (RuntimeError
    elsewhere). A thread started earlier, which does not block the stop signals, could
    still take one while the library loads, and run the library's handler (or Python's,
    failing the load): ``load_all`` before any thread starts leaves none."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(f"{name} takes signals over as it loads: load it first from "
                           "the main thread, where Python's handlers can be set again")
    with stop_signals_held():
        return importlib.import_module(name)


@contextmanager
def stop_signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held while the block runs (in the main thread), then Python's
    handlers for both set again, whatever the block set: a stop sent meanwhile is
    delivered to Python's handler as the block ends."""
    handlers = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    # Threads the block starts inherit this mask, so they never take a stop signal.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        for signum, handler in handlers.items():
            if handler is not None:  # None: set outside Python, which cannot set it again
                signal.signal(signum, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def load_all() -> None:
    """Load every library of ``TAKE_SIGNALS_OVER`` now. Called before any thread
    starts (numpy's OpenBLAS pool starts as numpy loads), every thread alive while
    they load blocks the stop signals, and a stop signal waits for them."""
    for name in TAKE_SIGNALS_OVER:
        __getattr__(name)

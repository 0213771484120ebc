"""numba's options set where numba has read its environment already (imported before
splatscale)."""

from __future__ import annotations

import sys


def set_read_option(name: str, value: object) -> None:
    """Where numba was imported before splatscale (so its configuration is read already
    from its environment variables), set its option ``name`` to ``value`` as well; else
    nothing (the environment variable splatscale set is read when numba is imported)."""
    config = sys.modules.get("numba.core.config")
    if config is not None:
        # numba makes its options module globals at run time, so its types lack them
        setattr(config, name, value)

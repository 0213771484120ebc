"""Whether numba's on-disk cache holds the CPU kernels compiled for their present
source, so that a run can say before its first step that it compiles them."""

from __future__ import annotations

from splatscale.render import compositing_kernels, projection_kernels

# The largest kernels, which take most of the first compile.
LARGEST = (compositing_kernels.forward, compositing_kernels.backward,
           projection_kernels.project_backward)


def kernels_cached() -> bool:
    """True when each of the largest kernels has a compiled version cached for its
    source as it is now (numba reads an index whose stamp is stale as empty)."""
    try:
        return all(kernel._cache._cache_file._load_index() for kernel in LARGEST)
    except (AttributeError, OSError):  # numba's cache internals moved: say nothing
        return True

"""splatscale: 3D Gaussian Splatting training from a laptop CPU to many GPUs."""

from splatscale.allocator import keep_freed_memory

__version__ = "0.1.0"

keep_freed_memory()

"""splatscale: 3D Gaussian Splatting training from a laptop CPU to many GPUs."""

from splatscale.allocator import keep_freed_memory
from splatscale.kernel_cache import key_kernel_cache
from splatscale.threads import choose_threading_layer
from splatscale.vector_width import prefer_full_vectors

__version__ = "0.1.0"

keep_freed_memory()
key_kernel_cache()
choose_threading_layer()
prefer_full_vectors()

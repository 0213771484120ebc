"""splatscale: 3D Gaussian Splatting training from a laptop CPU to many GPUs."""

__version__ = "0.1.0"

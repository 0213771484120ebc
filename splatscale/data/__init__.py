"""Scene data: cameras, readers for COLMAP and transforms.json, images."""

from splatscale.data.cameras import Camera

__all__ = ["Camera"]

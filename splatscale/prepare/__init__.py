"""From photos or videos to a COLMAP scene: images normalised once, then SfM with pycolmap."""

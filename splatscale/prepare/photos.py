"""Photos made upright once, so that SfM and training read the same pixels.

A photo that needs nothing (upright, JPEG or PNG) is copied byte for byte,
keeping its EXIF, which gives SfM a focal length to start from. A photo with an
EXIF orientation is turned upright (a JPEG stays a JPEG, at quality 95, its EXIF
kept without the orientation); any other format (TIFF, WebP, HEIC, ...) becomes a
lossless 8-bit PNG named by the whole file name, ``a.tif.png``, so that ``a.tif``
and ``a.png`` stay two images.

HEIC photos open through pillow-heif, decoded upright by their own rotation and
mirroring (HEIF's ``irot``/``imir``, which the format says rule over EXIF); it sets
their EXIF orientation to 1, so they are not turned twice.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageOps
from pillow_heif import register_heif_opener

from splatscale.atomic import atomic_path
from splatscale.data.images import to_rgb8
from splatscale.errors import DataError
from splatscale.prepare.scene_folder import image_name

ORIENTATION, MAKE, MODEL = 0x0112, 0x010F, 0x0110
EXIF_IFD, FOCAL_LENGTH, FOCAL_35MM = 0x8769, 0x920A, 0xA405
KEPT_FORMATS = ("JPEG", "PNG")
JPEG_QUALITY = 95

register_heif_opener()


@dataclass(frozen=True)
class Photo:
    """One input photo, inspected: how to write it, and the camera it was taken with."""

    source: Path
    name: str                  # its file name in the scene's images/
    copy: bool                 # the file is written as it is
    camera: tuple              # photos with equal values share one camera in SfM


def inspect_photo(path: Path) -> Photo:
    """Decode ``path`` whole (a truncated file is refused here, before anything is
    written) and read what decides how it is written and which camera it shares."""
    try:
        with Image.open(path) as image:
            image.load()
            exif = image.getexif()
            size, fmt = image.size, image.format
    except (OSError, SyntaxError, ValueError) as error:
        reason = " ".join(str(error).split())  # libheif's end in a newline: one line
        raise DataError(f"{path}: not a readable image ({reason})") from None
    orientation = exif.get(ORIENTATION, 1)
    if orientation in (5, 6, 7, 8):  # a quarter turn: width and height swap
        size = size[::-1]
    details = exif.get_ifd(EXIF_IFD)
    camera = (exif.get(MAKE), exif.get(MODEL), details.get(FOCAL_LENGTH),
              details.get(FOCAL_35MM), size)
    copy = orientation == 1 and fmt in KEPT_FORMATS
    name = image_name(path.name) + ("" if fmt in KEPT_FORMATS else ".png")
    return Photo(path, name, copy, tuple(str(v) if v is not None else None for v in camera))


def write_photo(photo: Photo, folder: Path) -> None:
    """Write ``photo`` upright into ``folder``, atomically."""
    with atomic_path(folder / photo.name) as tmp:
        if photo.copy:
            shutil.copyfile(photo.source, tmp)
            return
        with Image.open(photo.source) as image:
            upright = ImageOps.exif_transpose(image)
            if image.format == "JPEG":
                upright.convert("RGB").save(tmp, format="JPEG", quality=JPEG_QUALITY,
                                            exif=upright.getexif())
            else:
                Image.fromarray(to_rgb8(upright, (0.0, 0.0, 0.0))).save(tmp, format="PNG")


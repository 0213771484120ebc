"""Masks: which pixels of each photo train and which are ignored.

A mask is a greyscale image of its photo's size: white (a level of 128 or more) trains,
black (below 128) is ignored, or the other way round with ``invert``. It is found
beside the scene's images, or is the image's own alpha channel:

- a COLMAP scene: ``masks/IMG_01.png`` or ``masks/IMG_01.jpg.png`` (COLMAP's own
  naming) for ``images/IMG_01.jpg``, in the ``masks`` folder beside ``images`` or in
  the folder given, sub-folders as the images';
- a transforms.json scene: each frame's ``mask_path`` (as nerfstudio writes it), or,
  in the folder given, the image's file name so named;
- ``alpha``: an image's alpha channel (transparent is ignored).

The store (``images.py``) carries a mask as a fourth uint8 channel of its image, 0 or
255; the colours under it are set to zero before the image is resampled, so nothing
under a mask reaches training, and un-premultiplied after (``settled``), so that the
pixels at a mask's edge keep their own colours.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePath

import numpy as np
from PIL import Image

from splatscale.data.scene import Scene, View
from splatscale.errors import DataError
from splatscale.messages import notice

FOLDER = "masks"  # beside a COLMAP scene's images folder
TRAINS = 128  # the least grey level that trains
# Pillow's single-channel modes wider than 8 bits, and the full scale of each.
WIDE_GREY = {"I;16": 65535, "I;16B": 65535, "I;16L": 65535, "I;16N": 65535,
             "I": 65535, "F": 1.0}


@dataclass(frozen=True)
class MaskSource:
    """Where each view's mask comes from: ``files[i]``, view i's mask file, or None for
    a view without one (every pixel trains); ``files`` None: each image's alpha
    channel (an image without one trains every pixel where ``skip_missing``, and is
    refused otherwise). ``invert``: black trains, white is ignored."""

    files: tuple[Path | None, ...] | None
    invert: bool = False
    skip_missing: bool = False

    def file(self, index: int) -> Path | None:
        return None if self.files is None else self.files[index]

    def key(self, index: int) -> str:
        """What view ``index``'s mask is, for the image cache: its file, size and
        modification time, or the alpha channel; and whether it is inverted."""
        path = self.file(index)
        if self.files is None:
            what = "alpha"
        elif path is None:
            what = "none"
        else:
            stat = path.stat()
            what = f"{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}"
        return f"{what}\0{'inverted' if self.invert else 'plain'}"

    def check(self, index: int, image: Image.Image, image_path: Path) -> None:
        """View ``index``'s mask is readable and of its image's size (headers only)."""
        path = self.file(index)
        if self.files is None:
            if not has_alpha(image) and not self.skip_missing:
                raise DataError(f"{image_path}: --alpha-mask, but the image has no alpha "
                                "channel; --skip-missing-masks trains every pixel of such "
                                "images")
            return
        if path is None:
            return
        try:
            with Image.open(path) as mask:
                size = mask.size
                mask.verify()
        except OSError as error:
            raise DataError(f"{path}: not a readable mask ({error})") from None
        _check_size(path, size, image_path, image.size)

    def read(self, index: int, image: Image.Image, image_path: Path) -> np.ndarray:
        """View ``index``'s mask at its image's size: uint8 [h, w], 255 where the pixel
        trains and 0 where it is ignored (all 255 for a view without a mask)."""
        path = self.file(index)
        width, height = image.size
        if self.files is None:
            if not has_alpha(image):
                return np.full((height, width), 255, np.uint8)
            grey = np.asarray(image.convert("RGBA"))[..., 3]
        elif path is None:
            return np.full((height, width), 255, np.uint8)
        else:
            grey = _read_grey(path)
            _check_size(path, (grey.shape[1], grey.shape[0]), image_path, image.size)
        trains = grey >= TRAINS
        return np.where(trains != self.invert, 255, 0).astype(np.uint8)

    def what(self, index: int, image_path: Path) -> str:
        """How a message names view ``index``'s mask."""
        path = self.file(index)
        return f"{image_path}'s alpha channel" if path is None else str(path)


def has_alpha(image: Image.Image) -> bool:
    return "A" in image.mode or "a" in image.mode or "transparency" in image.info


def _read_grey(path: Path) -> np.ndarray:
    """A mask file as uint8 grey levels [h, w] (16-bit and float grey scaled to 0..255)."""
    try:
        with Image.open(path) as mask:
            mask.load()
            if mask.mode in WIDE_GREY:
                grey = np.asarray(mask, dtype=np.float64) / WIDE_GREY[mask.mode]
                return np.clip(np.rint(grey * 255.0), 0, 255).astype(np.uint8)
            return np.asarray(mask.convert("L"))
    except OSError as error:
        raise DataError(f"{path}: not a readable mask ({error})") from None


def _check_size(path: Path, size: tuple[int, int], image_path: Path,
                image_size: tuple[int, int]) -> None:
    if size != image_size:
        raise DataError(f"{path}: the mask is {size[0]}x{size[1]}, its image {image_path} "
                        f"is {image_size[0]}x{image_size[1]}")


def premultiplied(colours: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """uint8 [h, w, 4]: the colours, zero where the mask is 0, and the mask."""
    kept = np.where(mask[..., None] > 0, colours, 0).astype(np.uint8)
    return np.concatenate([kept, mask[..., None]], axis=2)


def settled(image: np.ndarray) -> np.ndarray:
    """A resampled ``premultiplied`` image (uint8, or float where it was resized) back
    to uint8 colours and a mask of 0 and 255: a pixel trains where its resampled mask
    is at least 128, and its colour is the resampled colour over the resampled mask
    (the masked-in pixels' weighted mean); the others are zero."""
    colours, mask = image[..., :3].astype(np.float64), image[..., 3].astype(np.float64)
    trains = mask >= TRAINS - 0.5
    scale = np.where(trains, 255.0 / np.maximum(mask, 1.0), 0.0)
    kept = np.clip(np.rint(colours * scale[..., None]), 0, 255).astype(np.uint8)
    return np.concatenate([kept, np.where(trains, 255, 0).astype(np.uint8)[..., None]],
                          axis=2)


def find_masks(scene: Scene, folder: str, alpha: bool = False, invert: bool = False,
               skip_missing: bool = False) -> MaskSource:
    """Each view's mask: in ``folder`` ("": where the scene keeps them), or each image's
    alpha channel (``alpha``). A view whose mask is missing is refused, naming it, or
    with ``skip_missing`` trains every pixel (said once, with how many)."""
    if alpha:
        return MaskSource(None, invert, skip_missing)
    files = [_mask_file(scene, view, Path(folder) if folder else None)
             for view in scene.views]
    missing = [view.camera.name for view, found in zip(scene.views, files) if found is None]
    if len(missing) == len(files):
        where = folder or _default_place(scene)
        raise DataError(f"{where}: no mask for any of the {len(files)} images")
    if missing and not skip_missing:
        view = scene.views[files.index(None)]
        raise DataError(f"{view.image_path}: no mask ({_looked_at(scene, view, folder)}); "
                        f"{len(missing)} of the {len(files)} images have none; "
                        "--skip-missing-masks trains every pixel of those")
    if missing:
        notice(f"{len(missing)} of the {len(files)} images have no mask: every pixel of "
               "those trains (--skip-missing-masks)")
    return MaskSource(tuple(files), invert, skip_missing)


def _candidates(scene: Scene, view: View, folder: Path | None) -> list[Path]:
    """Where view's mask may be, in the order looked at."""
    if folder is None and view.mask_path is not None:
        return [view.mask_path]
    if scene.image_dir is not None:  # COLMAP: the image's name in images/, sub-folders too
        name = PurePath(view.image_path.relative_to(scene.image_dir))
        base = folder or scene.image_dir.parent / FOLDER
    else:  # transforms.json: the file's own name
        name = PurePath(view.image_path.name)
        base = folder or view.image_path.parent.parent / FOLDER
    return [base / name.with_suffix(".png"), base / f"{name}.png"]


def _mask_file(scene: Scene, view: View, folder: Path | None) -> Path | None:
    return next((path for path in _candidates(scene, view, folder) if path.is_file()), None)


def _looked_at(scene: Scene, view: View, folder: str) -> str:
    return "looked for " + " and ".join(
        str(path) for path in _candidates(scene, view, Path(folder) if folder else None))


def _default_place(scene: Scene) -> str:
    if scene.image_dir is not None:
        return str(scene.image_dir.parent / FOLDER)
    return f"{scene.source} (its frames' mask_path, or the masks folder beside the images)"

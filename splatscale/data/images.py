"""ImageStore: scene images decoded lazily, kept as uint8, downscaled and cached on disk."""

from __future__ import annotations

import hashlib
import math
import os
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from tqdm import tqdm

from splatscale.atomic import atomic_path
from splatscale.backends import backend_for
from splatscale.cache_home import default_cache_dir
from splatscale.data.cameras import Camera
from splatscale.data.image_memory import ImageMemory
from splatscale.data.masks import MaskSource, premultiplied, settled
from splatscale.data.scene import Scene, View
from splatscale.data.undistort import undistort_image
from splatscale.errors import DataError


# Pillow's single-channel modes wider than 8 bits, and the full scale of each.
WIDE_GREY = {"I;16": 65535, "I;16B": 65535, "I;16L": 65535, "I;16N": 65535,
             "I": 65535, "F": 1.0}


def _decode(path: Path, background: tuple[float, float, float]) -> np.ndarray:
    """uint8 RGB [h, w, 3] whatever Pillow's mode; alpha is composited over ``background``.

    16-bit and 32-bit integer grey (PNG, TIFF) are scaled from 0..65535, float
    grey from 0..1; Pillow's own conversion would clip them to white.
    """
    try:
        with Image.open(path) as image:
            image.load()
            return to_rgb8(image, background)
    except OSError as error:  # PIL's UnidentifiedImageError and truncated data are OSErrors
        raise DataError(f"{path}: not a readable image ({error})") from None


def to_rgb8(image: Image.Image, background: tuple[float, float, float]) -> np.ndarray:
    if image.mode in WIDE_GREY:
        grey = np.asarray(image, dtype=np.float64) / WIDE_GREY[image.mode]
        grey = np.clip(np.rint(grey * 255.0), 0, 255).astype(np.uint8)
        return np.repeat(grey[..., None], 3, axis=2)
    if "A" in image.mode or "a" in image.mode or "transparency" in image.info:
        rgba = np.asarray(image.convert("RGBA"), dtype=np.float32) / 255.0
        bg = np.asarray(background, dtype=np.float32)
        rgb = rgba[..., :3] * rgba[..., 3:] + bg * (1.0 - rgba[..., 3:])
        return np.clip(np.rint(rgb * 255.0), 0, 255).astype(np.uint8)
    return np.array(image.convert("RGB"), dtype=np.uint8)


def write_png(array: np.ndarray, path: Path) -> None:
    """Atomically: a half-written file must never be read back."""
    with atomic_path(path) as tmp:
        Image.fromarray(array).save(tmp, format="PNG")


def _check_size(view: View, size: tuple[int, int]) -> None:
    """An image must have its camera's size: the distorted camera's exactly, a pinhole
    camera's or a multiple of it with the same aspect (a downscaled copy)."""
    width, height = size
    if view.distortion is not None:
        expected = (view.distortion.width, view.distortion.height)
        if size != expected:
            raise DataError(f"{view.image_path}: image is {width}x{height}, its camera says "
                            f"{expected[0]}x{expected[1]}")
        return
    cam = view.camera
    if abs(width / height - cam.width / cam.height) > 0.01:
        raise DataError(f"{view.image_path}: image is {width}x{height}, its camera says "
                        f"{cam.width}x{cam.height}")


class ImageStore:
    """The images of a scene at the training resolution, with matching cameras.

    ``resolution`` divides every image size (1, 2, 4, 8); ``max_width`` instead
    caps the width, and ``max_pixels`` the pixel count (the aspect kept).
    Undistorted and downscaled copies are written once under ``cache_dir`` and
    read from there afterwards. Decoded images stay in memory as
    uint8 up to ``memory_budget`` bytes (None: all of them); the others are kept
    as raw files under ``cache_dir`` (``image_memory.py``). ``decode_share`` (r, n):
    ``check`` decodes every n-th image from the r-th and, with n > 1, writes its raw
    file, so that the n ranks of one machine decode the images between them and each
    reads the others' from the cache they share. ``masks``, where given, says where
    each image's mask is (``masks.py``): an image is then uint8 [h, W, 4], its mask
    the fourth channel (255 trains, 0 is ignored), cached and counted with it.
    """

    def __init__(self, scene: Scene, resolution: int = 1, max_width: int | None = None,
                 cache_dir: Path | None = None, background=(0.0, 0.0, 0.0),
                 memory_budget: int | None = None,
                 decode_share: tuple[int, int] = (0, 1), max_pixels: int | None = None,
                 masks: MaskSource | None = None) -> None:
        if resolution not in (1, 2, 4, 8):
            raise ValueError(f"resolution must be 1, 2, 4 or 8, got {resolution}")
        self.scene = scene
        self.masks = masks
        red, green, blue = background
        self.background = (float(red), float(green), float(blue))
        self.memory = ImageMemory(memory_budget, self._raw, self._load)
        self.decode_share = decode_share
        self._cameras = [self._scaled(v.camera, resolution, max_width, max_pixels)
                         for v in scene.views]
        key = hashlib.sha1(str(Path(scene.source).resolve()).encode()).hexdigest()[:16]
        self.cache_dir = (cache_dir or default_cache_dir()) / key

    @staticmethod
    def _scaled(camera: Camera, resolution: int, max_width: int | None,
                max_pixels: int | None) -> Camera:
        scale = 1.0 / resolution
        if max_width is not None and camera.width * scale > max_width:
            scale = max_width / camera.width
        pixels = camera.width * camera.height
        if max_pixels is not None and pixels * scale ** 2 > max_pixels:
            scale = math.sqrt(max_pixels / pixels)
        if scale == 1.0:
            return camera
        width, height = max(1, round(camera.width * scale)), max(1, round(camera.height * scale))
        K = camera.K.clone()
        K[0] *= width / camera.width
        K[1] *= height / camera.height
        return Camera(camera.viewmat, K, width, height, camera.name, camera.model)

    def __len__(self) -> int:
        return len(self._cameras)

    def check(self, decode: bool = True, progress: bool = False) -> None:
        """Every image now, so that a missing or unreadable file, one whose size does not
        fit its camera, or an image cache that cannot be written is reported before
        training writes anything. ``decode``: each image of this process' share is
        decoded (undistorted, resized and cached) as training reads it; otherwise its
        header alone is read."""
        shared = self.decode_share[1] > 1
        spills = self.memory.budget is not None and self.decoded_bytes() > self.memory.budget
        if spills or shared or any(self._needs_work(i) for i in range(len(self))):
            self._check_cache()
        # Shown only when slow, and cleared: a refused run's one line stands alone.
        with tqdm(total=len(self), desc="checking images", unit="image", leave=False,
                  delay=1.0, disable=not progress) as bar:
            for index, view in enumerate(self.scene.views):
                try:
                    with Image.open(view.image_path) as image:
                        size = image.size
                        if self.masks is not None:
                            self.masks.check(index, image, view.image_path)
                        image.verify()
                except OSError as error:
                    raise DataError(f"{view.image_path}: not a readable image ({error})"
                                    ) from None
                _check_size(view, size)
                if decode and index % self.decode_share[1] == self.decode_share[0]:
                    self.image(index)
                    if shared:
                        self.memory.share(index)
                bar.update()

    def _check_cache(self) -> None:
        """The cache folder takes a file (it may be a file itself, or full, or read-only)."""
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.cache_dir, prefix=".probe.") as probe:
                probe.write(bytes(4096))
                probe.flush()
                os.fsync(probe.fileno())
        except OSError as error:
            raise DataError(f"{self.cache_dir}: the image cache cannot be written there "
                            f"({error.strerror or error}); choose another with --cache-dir"
                            ) from None

    def fingerprint(self) -> str:
        """A digest of every view's camera (at this resolution) and image file size, so
        a checkpoint can tell whether it is resumed on the same scene."""
        digest = hashlib.sha1()
        for camera, view in zip(self._cameras, self.scene.views):
            numbers = torch.cat([camera.viewmat.flatten(), camera.K.flatten()]).double()
            digest.update(f"{camera.name}:{camera.width}x{camera.height}:"
                          f"{view.image_path.stat().st_size}:".encode())
            if camera.model != "pinhole":  # pinhole scenes' fingerprints as they were
                digest.update(f"{camera.model}:".encode())
            digest.update(numbers.mul(1e6).round().numpy().tobytes())
        return digest.hexdigest()

    def camera(self, index: int) -> Camera:
        return self._cameras[index]

    def image(self, index: int, rows: tuple[int, int] | None = None) -> torch.Tensor:
        """uint8 [h, W, 3] of view ``index``, or only its rows ``[y0, y1)``."""
        return self.memory.get(index, rows)

    def read_ahead(self, indices: list[int]) -> None:
        """Start reading the images of ``indices`` that are not in memory."""
        self.memory.read_ahead(indices)

    def decoded_bytes(self) -> int:
        """Every image decoded, in bytes."""
        return sum(int(np.prod(self._shape(i))) for i in range(len(self)))

    @property
    def masked(self) -> bool:
        """Whether images carry a mask (a fourth channel)."""
        return self.masks is not None

    def _shape(self, index: int) -> tuple[int, int, int]:
        camera = self._cameras[index]
        return camera.height, camera.width, 4 if self.masked else 3

    def _raw(self, index: int) -> tuple[Path, tuple[int, int, int]]:
        """Where image ``index`` is kept decoded on disk, and its shape."""
        return self._cache_path(index, "rgb"), self._shape(index)

    def _cache_path(self, index: int, kind: str = "png") -> Path:
        """Keyed by the source file's name, size and modification time, so an edited
        image is processed again rather than read stale from the cache."""
        camera, source = self._cameras[index], self.scene.views[index].image_path
        stat = source.stat()
        key = f"{camera.name}\0{stat.st_size}\0{stat.st_mtime_ns}"
        if self.masks is not None:
            key += f"\0{self.masks.key(index)}"
        name = hashlib.sha1(key.encode()).hexdigest()[:16]
        bg = "".join(f"{round(c * 255):02x}" for c in self.background)
        model = "" if camera.model == "pinhole" else f"_{camera.model}"
        return self.cache_dir / f"{camera.width}x{camera.height}_{bg}{model}" / f"{name}.{kind}"

    def _needs_work(self, index: int) -> bool:
        """Whether the image is undistorted or resized (and so cached) before use."""
        view = self.scene.views[index]
        return view.distortion is not None or self._cameras[index] is not view.camera

    def _load(self, index: int) -> np.ndarray:
        view, camera = self.scene.views[index], self._cameras[index]
        needs_work = self._needs_work(index)
        cached = self._cache_path(index)
        if needs_work and cached.is_file():
            return _decode_cached(cached) if self.masked else _decode(cached, self.background)
        image = self._decode_source(index)
        if view.distortion is not None:
            try:
                image = undistort_image(image, view.distortion, view.camera.K.numpy(),
                                        view.camera.width, view.camera.height,
                                        view.camera.model)
            except ValueError as error:
                raise DataError(f"{view.image_path}: {error}") from None
        elif image.shape[:2] != (view.camera.height, view.camera.width):
            image = self._fit(image, view)
        if image.shape[:2] != (camera.height, camera.width):
            image = _resized(image, (camera.width, camera.height))
        if self.masks is not None:
            image = settled(image)
            if not image[..., 3].any():
                raise DataError(f"{self.masks.what(index, view.image_path)}: the mask "
                                f"leaves no pixel of {view.image_path} to train on")
        if needs_work:
            write_png(image, cached)
        return image

    @staticmethod
    def _fit(image: np.ndarray, view: View) -> np.ndarray:
        """An image stored at another size than its camera (same aspect: ``check``)."""
        _check_size(view, (image.shape[1], image.shape[0]))
        return _resized(image, (view.camera.width, view.camera.height))

    def _decode_source(self, index: int) -> np.ndarray:
        """Image ``index`` from its file: RGB, or with a mask ``premultiplied``."""
        path = self.scene.views[index].image_path
        if self.masks is None:
            return _decode(path, self.background)
        try:
            with Image.open(path) as image:
                image.load()
                return premultiplied(to_rgb8(image, self.background),
                                     self.masks.read(index, image, path))
        except OSError as error:
            raise DataError(f"{path}: not a readable image ({error})") from None

    def as_float(self, index: int, rows: tuple[int, int] | None = None,
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return pixels_as_float(self.image(index, rows), dtype)


def _resized(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """``image`` resized to ``size`` (Lanczos). An image with a mask (a fourth channel,
    ``masks.premultiplied``) is resized channel by channel in float32 and not clamped,
    so that its colours over its mask stay the masked-in pixels' mean even where
    Lanczos overshoots (and Pillow's RGBA resize would premultiply it again)."""
    if image.shape[2] == 3:
        return np.array(Image.fromarray(image).resize(size, Image.Resampling.LANCZOS))
    return np.stack([np.asarray(Image.fromarray(np.ascontiguousarray(
        image[..., c], dtype=np.float32)).resize(size, Image.Resampling.LANCZOS))
        for c in range(4)], axis=-1)


def _decode_cached(path: Path) -> np.ndarray:
    """A cached image with its mask: uint8 [h, w, 4] as written."""
    try:
        with Image.open(path) as image:
            return np.array(image.convert("RGBA"), dtype=np.uint8)
    except OSError as error:
        raise DataError(f"{path}: not a readable image ({error})") from None


def pixels_as_float(pixels: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 pixels as ``dtype`` in [0, 1], the same on every device (the host's
    division by 255), by the backend of their device."""
    return backend_for(pixels.device).pixels_as_float(pixels, dtype)

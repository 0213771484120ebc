"""Masks as users bring them: found beside a scene's images, read with the images
(undistorted, resized, cached, within the memory budget), refused when they cannot be
used, and trained through the command line: nothing under a mask reaches the model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from splatscale.cli import main
from splatscale.data import load_scene
from splatscale.data.images import ImageStore
from splatscale.data.masks import find_masks
from splatscale.errors import DataError
from tests.test_bad_input import assert_clean_error

WIDTH, HEIGHT = 64, 48


def disc(width: int = WIDTH, height: int = HEIGHT) -> np.ndarray:
    """[h, w] bool: True (trains) outside a disc and right of the first 3 columns."""
    y, x = np.mgrid[:height, :width]
    return ((y - 0.4 * height) ** 2 + (x - 0.6 * width) ** 2 > (0.3 * height) ** 2) & (x >= 3)


def photo(seed: int, noise_under: np.ndarray | None = None) -> np.ndarray:
    """A smooth uint8 [h, w, 3] photo; with ``noise_under``, noise where it is False."""
    y, x = np.mgrid[:HEIGHT, :WIDTH]
    image = np.stack([(x * 4 + seed * 20) % 256, (y * 5) % 256, (x + y + seed) % 256], -1)
    image = image.astype(np.uint8)
    if noise_under is not None:
        noise = np.random.default_rng(seed).integers(0, 256, image.shape, dtype=np.uint8)
        image = np.where(noise_under[..., None], image, noise)
    return image


def colmap_scene(root: Path, model: str = "PINHOLE 64 48 60 62 32 24", count: int = 4,
                 noise: bool = False, masks: bool = True) -> Path:
    """A COLMAP text scene of ``count`` photos a.jpg, b.jpg, ... (PNG bytes), 30
    points, and masks: the even ones named masks/a.png, the odd ones masks/b.jpg.png."""
    sparse = root / "sparse" / "0"
    sparse.mkdir(parents=True)
    (root / "images").mkdir()
    (sparse / "cameras.txt").write_text(f"1 {model}\n")
    lines = []
    for k in range(count):
        name = f"{chr(ord('a') + k)}.jpg"
        lines.append(f"{k + 1} 1 0 0 0 {0.2 * k - 0.3} 0 3 1 {name}\n\n")
        Image.fromarray(photo(k, disc() if noise else None)).save(root / "images" / name,
                                                                   format="PNG")
        if masks:
            (root / "masks").mkdir(exist_ok=True)
            mask_name = name.replace(".jpg", ".png") if k % 2 == 0 else name + ".png"
            Image.fromarray(np.where(disc(), 255, 0).astype(np.uint8)).save(
                root / "masks" / mask_name)
    (sparse / "images.txt").write_text("".join(lines))
    points = np.random.default_rng(0).uniform(-0.5, 0.5, (30, 3))
    (sparse / "points3D.txt").write_text("".join(
        f"{i + 1} {x} {y} {z} 200 120 80 0.5\n" for i, (x, y, z) in enumerate(points)))
    return root


def masked_store(root: Path, cache: Path, **options) -> ImageStore:
    scene = load_scene(root)
    masks = find_masks(scene, options.pop("folder", ""), options.pop("alpha", False),
                       options.pop("invert", False), options.pop("skip_missing", False))
    return ImageStore(scene, cache_dir=cache, masks=masks, **options)


def test_masks_are_found_by_either_name_and_read_as_0_or_255(tmp_path):
    root = colmap_scene(tmp_path / "scene")
    grey = np.tile(np.array([0, 127, 128, 255], np.uint8).repeat(16), (HEIGHT, 1))
    Image.fromarray(grey).save(root / "masks" / "a.png")
    store = masked_store(root, tmp_path / "cache")
    image = store.image(0)
    assert image.shape == (HEIGHT, WIDTH, 4) and image.dtype == torch.uint8
    want = torch.from_numpy(np.where(grey >= 128, 255, 0).astype(np.uint8))
    assert torch.equal(image[..., 3], want), "128 and above trains, below is ignored"
    assert torch.equal(image[..., :3][want > 0], torch.from_numpy(photo(0))[want > 0])
    assert torch.all(image[..., :3][want == 0] == 0), "the colours under a mask are gone"
    assert torch.equal(store.image(1)[..., 3], torch.from_numpy(np.where(disc(), 255, 0)
                                                                .astype(np.uint8)))
    inverted = masked_store(root, tmp_path / "cache", invert=True).image(0)
    assert torch.equal(inverted[..., 3], 255 - want)
    assert store.decoded_bytes() == 4 * WIDTH * HEIGHT * 4, "the budget counts the masks"
    spilled = masked_store(root, tmp_path / "cache", memory_budget=0)
    spilled.check()
    assert torch.equal(spilled.image(1, rows=(5, 30)), store.image(1)[5:30])


@pytest.mark.parametrize("options", [{"resolution": 2},
                                     {"model": "SIMPLE_RADIAL 64 48 58 31 23 0.05"}])
def test_noise_under_the_masks_never_reaches_the_images(tmp_path, options):
    """Resized or undistorted: the same pixels, masks and cached copies whatever lies
    under the masks; and a masked-in pixel at a mask's edge keeps its own colours."""
    model = options.pop("model", "PINHOLE 64 48 60 62 32 24")
    stores = [masked_store(colmap_scene(tmp_path / kind, model, noise=kind == "noise"),
                           tmp_path / "cache", **options) for kind in ("clean", "noise")]
    for index in range(4):
        clean, noisy = (store.image(index) for store in stores)
        assert torch.equal(clean, noisy), index
        assert clean[..., 3].any() and not clean[..., 3].all()
    # Cached copies read back the same.
    again = masked_store(tmp_path / "noise", tmp_path / "cache", **options)
    assert torch.equal(again.image(2), stores[0].image(2))
    # An even colour stays even up to the mask's edge (un-premultiplied).
    flat = tmp_path / "flat"
    colmap_scene(flat, model)
    Image.fromarray(np.full((HEIGHT, WIDTH, 3), 200, np.uint8)).save(flat / "images" / "a.jpg",
                                                                       format="PNG")
    image = masked_store(flat, tmp_path / "cache", **options).image(0)
    inside = image[..., 3] > 0
    assert (image[..., :3][inside].int() - 200).abs().max() <= 3


def test_transforms_frames_mask_path_and_a_masks_folder(tmp_path):
    root = tmp_path / "ns"
    (root / "images").mkdir(parents=True)
    (root / "elsewhere").mkdir()
    (root / "masks").mkdir()
    frames = []
    for k in range(3):
        Image.fromarray(photo(k)).save(root / "images" / f"f{k}.png")
        mask = np.where(disc(), 255, 0).astype(np.uint8)
        Image.fromarray(mask if k else 255 - mask).save(root / "elsewhere" / f"m{k}.png")
        Image.fromarray(mask).save(root / "masks" / f"f{k}.png")
        pose = np.eye(4)
        pose[0, 3] = 0.2 * k
        frames.append({"file_path": f"images/f{k}.png", "mask_path": f"elsewhere/m{k}.png",
                       "transform_matrix": pose.tolist()})
    (root / "transforms.json").write_text(json.dumps(
        {"fl_x": 60.0, "w": WIDTH, "h": HEIGHT, "frames": frames}))
    trains = torch.from_numpy(np.where(disc(), 255, 0).astype(np.uint8))
    by_frame = masked_store(root, tmp_path / "cache")
    assert torch.equal(by_frame.image(0)[..., 3], 255 - trains), "frame 0's own mask"
    assert torch.equal(by_frame.image(1)[..., 3], trains)
    in_folder = masked_store(root, tmp_path / "cache", folder=str(root / "masks"))
    assert torch.equal(in_folder.image(0)[..., 3], trains), "the folder's, by file name"


def test_the_alpha_channel_as_the_mask(tmp_path):
    root = colmap_scene(tmp_path / "scene", masks=False)
    rgba = np.concatenate([photo(0), np.where(disc(), 255, 0).astype(np.uint8)[..., None]], -1)
    Image.fromarray(rgba).save(root / "images" / "a.jpg", format="PNG")
    store = masked_store(root, tmp_path / "cache", alpha=True, skip_missing=True)
    assert torch.equal(store.image(0)[..., 3], torch.from_numpy(np.where(disc(), 255, 0)
                                                                .astype(np.uint8)))
    assert torch.all(store.image(1)[..., 3] == 255), "no alpha: every pixel trains"
    with pytest.raises(DataError, match="b.jpg: --alpha-mask, but the image has no alpha"):
        masked_store(root, tmp_path / "cache", alpha=True).check(decode=False)


def train(scene: Path, output: Path, *flags: str) -> int:
    return main(["train", str(scene), "-o", str(output), "--iterations", "6", "--eval",
                 "--quiet", "--cache-dir", str(output.parent / "cache"), *flags])


def test_a_masked_run_trains_the_same_model_whatever_lies_under_the_masks(tmp_path, capsys):
    """Through the command line, at half resolution: the same PLY, bit for bit; test
    scores over the masked-in pixels, as report.json says, and as ``eval`` scores the
    run's model."""
    outputs = []
    for kind in ("clean", "noise"):
        scene = colmap_scene(tmp_path / kind, noise=kind == "noise")
        outputs.append(tmp_path / f"run-{kind}")
        assert train(scene, outputs[-1], "--masks", "--resolution", "2") == 0
    clean, noisy = ((out / "point_cloud.ply").read_bytes() for out in outputs)
    assert clean == noisy
    report = json.loads((outputs[0] / "report.json").read_text())
    assert report["test_masked"] is True
    capsys.readouterr()
    assert main(["eval", str(outputs[0]), "--cache-dir", str(tmp_path / "cache")]) == 0
    scored = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert scored["masked"] is True
    assert scored["psnr"] == pytest.approx(report["test"]["psnr"], rel=1e-6)
    assert train(tmp_path / "noise", tmp_path / "plain", "--resolution", "2") == 0
    assert (tmp_path / "plain" / "point_cloud.ply").read_bytes() != clean
    assert json.loads((tmp_path / "plain" / "report.json").read_text())["test_masked"] is False


def wrong_size(root: Path) -> None:
    Image.fromarray(np.zeros((HEIGHT, WIDTH + 2), np.uint8) + 255).save(root / "masks" / "a.png")


def missing(root: Path) -> None:
    (root / "masks" / "b.jpg.png").unlink()


def everything(root: Path) -> None:
    Image.fromarray(np.zeros((HEIGHT, WIDTH), np.uint8)).save(root / "masks" / "c.png")


@pytest.mark.parametrize("breaks, flags, fragment", [
    (wrong_size, ["--masks"], "masks/a.png: the mask is 66x48, its image"),
    (missing, ["--masks"], "b.jpg: no mask (looked for"),
    (everything, ["--masks"], "masks/c.png: the mask leaves no pixel of"),
    (lambda root: None, ["--invert-masks"], "--invert-masks: only with --masks"),
    (lambda root: None, ["--masks", "--alpha-mask"], "--alpha-mask: the masks are the"),
    (lambda root: None, ["--masks", "nowhere"], "nowhere: no such folder"),
])
def test_masks_that_cannot_be_used_are_refused_before_any_write(tmp_path, capsys, breaks,
                                                                flags, fragment):
    scene = colmap_scene(tmp_path / "scene")
    breaks(scene)
    try:
        code = train(scene, tmp_path / "run", *flags)
    except SystemExit as usage_error:  # argparse's refusals
        code = usage_error.code
    assert_clean_error(code, capsys.readouterr().err, fragment)
    assert not (tmp_path / "run").exists()


def test_skip_missing_masks_trains_every_pixel_of_those(tmp_path, capsys):
    scene = colmap_scene(tmp_path / "scene")
    missing(scene)
    assert train(scene, tmp_path / "run", "--masks", "--skip-missing-masks") == 0
    assert "1 of the 4 images have no mask" in capsys.readouterr().err
    # A resumed run keeps its masks, with no flag saying so again.
    assert main(["train", "-o", str(tmp_path / "run"), "--resume", "--iterations", "8",
                 "--quiet", "--cache-dir", str(tmp_path / "cache")]) == 0
    assert json.loads((tmp_path / "run" / "report.json").read_text())["test_masked"] is True

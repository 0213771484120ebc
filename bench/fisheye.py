"""A fisheye capture trained natively against the same capture undistorted to a pinhole.

``make``: a fisheye rendition of a scene from a model trained on it. Each view's pose
is seen through a fisheye lens (OPENCV_FISHEYE with ``--k``, ``--diagonal`` degrees
across its diagonal, ``--size`` pixels), each pixel the mean of 4 x 4 rays through
it, read from a wide pinhole render of the model at that pose (bilinear; a pinhole
cannot see 90 degrees off axis, so the lens stays under 180 degrees across). It is
written as a COLMAP scene, ``fisheye/`` (that camera, the scene's poses and points),
and as COLMAP's image_undistorter makes it a pinhole scene, ``pinhole/``
(``pycolmap.undistort_images``: the pinhole of no blank pixels, cropped).

Train each (``splatscale train DIR/fisheye -o A --eval ...``, the same for
``pinhole``), then ``score``: how much of the fisheye's field of view the pinhole
keeps (its pixels, and their solid angle), and each model's test PSNR and SSIM on
the held-out views (every 8th, the same names in both), through the fisheye cameras
and through the pinhole ones. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from scipy.ndimage import map_coordinates
from scipy.spatial.transform import Rotation

from splatscale.data import load_scene
from splatscale.data.cameras import Camera
from splatscale.data.fisheye import equidistant_rays
from splatscale.data.images import ImageStore
from splatscale.model.files import read_model
from splatscale.native import pycolmap
from splatscale.render import render
from splatscale.train.metrics import ImageMetrics

from report import emit

SUPERSAMPLE = 4  # rays per pixel side


def fisheye_camera(width: int, height: int, diagonal_degrees: float,
                   k: tuple[float, ...]) -> pycolmap.Camera:
    """An OPENCV_FISHEYE camera with distortion ``k`` whose corners are half
    ``diagonal_degrees`` off axis."""
    theta = math.radians(diagonal_degrees / 2)
    distorted = theta * (1 + sum(c * theta ** (2 * i + 2) for i, c in enumerate(k)))
    f = math.hypot(width, height) / 2 / distorted
    return pycolmap.Camera(model="OPENCV_FISHEYE", width=width, height=height,
                           params=[f, f, width / 2, height / 2, *k])


def wide_pinhole(viewmat: torch.Tensor, photo: pycolmap.Camera, rays: np.ndarray) -> Camera:
    """A pinhole at the same pose, of the photo's focal length, wide enough for ``rays``."""
    f = photo.focal_length_x
    reach = np.abs(rays[..., :2] / rays[..., 2:]).reshape(-1, 2).max(axis=0) * f
    width, height = (2 * math.ceil(r) + 2 for r in reach)
    K = torch.tensor([[f, 0.0, width / 2], [0.0, f, height / 2], [0.0, 0.0, 1.0]],
                     dtype=torch.float64)
    return Camera(viewmat, K, width, height)


def photo_rays(photo: pycolmap.Camera) -> np.ndarray:
    """[S * S, h, w, 3]: the rays of S x S points inside each of the photo's pixels."""
    offsets = (np.arange(SUPERSAMPLE) + 0.5) / SUPERSAMPLE
    rays = []
    for dy in offsets:
        for dx in offsets:
            u, v = np.meshgrid(np.arange(photo.width) + dx, np.arange(photo.height) + dy)
            positions = np.stack([u.ravel(), v.ravel()], 1)  # COLMAP's: corners at integers
            rays.append(photo.cam_ray_from_img(positions).reshape(photo.height, photo.width, 3))
    return np.stack(rays)


def fisheye_image(model, viewmat: torch.Tensor, photo: pycolmap.Camera,
                  rays: np.ndarray) -> np.ndarray:
    """uint8 [h, w, 3]: the model seen through the fisheye ``photo`` at ``viewmat``, each
    pixel the mean of its ``rays`` read from a wide pinhole render (bilinear)."""
    pinhole = wide_pinhole(viewmat, photo, rays)
    with torch.no_grad():
        wide = render(model, pinhole).rgb.clamp(0, 1).double().numpy()
    K = pinhole.K.numpy()
    x = rays[..., 0] / rays[..., 2] * K[0, 0] + K[0, 2] - 0.5
    y = rays[..., 1] / rays[..., 2] * K[1, 1] + K[1, 2] - 0.5
    mean = np.stack([map_coordinates(wide[..., c], [y, x], order=1).mean(axis=0)
                     for c in range(3)], -1)
    return np.clip(np.rint(mean * 255), 0, 255).astype(np.uint8)


def text(*numbers) -> str:
    """Numbers as COLMAP's text files hold them, exactly."""
    return " ".join(repr(float(number)) for number in numbers)


def make(args: argparse.Namespace) -> None:
    scene = load_scene(args.scene)
    model = read_model(Path(args.model)).model
    photo = fisheye_camera(*args.size, args.diagonal, tuple(args.k))
    rays = photo_rays(photo)
    root = Path(args.out) / "fisheye"
    sparse = root / "sparse" / "0"
    sparse.mkdir(parents=True)
    (root / "images").mkdir()
    (sparse / "cameras.txt").write_text(
        f"1 OPENCV_FISHEYE {photo.width} {photo.height} {text(*photo.params)}\n")
    lines = []
    for index, view in enumerate(scene.views):
        name = Path(view.camera.name).name
        image = fisheye_image(model, view.camera.viewmat, photo, rays)
        Image.fromarray(image).save(root / "images" / f"{Path(name).stem}.png")
        x, y, z, w = Rotation.from_matrix(view.camera.viewmat[:3, :3].numpy()).as_quat()
        lines.append(f"{index + 1} {text(w, x, y, z, *view.camera.viewmat[:3, 3])} 1 "
                     f"{Path(name).stem}.png\n\n")
    (sparse / "images.txt").write_text("".join(lines))
    (sparse / "points3D.txt").write_text("".join(
        f"{i + 1} {text(*p)} {c[0]} {c[1]} {c[2]} 0\n"
        for i, (p, c) in enumerate(zip(scene.points, scene.colors))))
    pycolmap.undistort_images(str(Path(args.out) / "pinhole"), str(sparse),
                              str(root / "images"))
    emit({"made": args.out, "views": len(scene.views), "photo_camera": photo.params.tolist(),
          "size": args.size, "diagonal_degrees": args.diagonal})


def inside_pinhole(fisheye: Camera, pinhole: Camera) -> tuple[np.ndarray, np.ndarray]:
    """[h, w] of the fisheye: whether each pixel's ray lands inside the pinhole image (at
    the same pose), and the solid angle it sees (up to a constant)."""
    K, P = fisheye.K.numpy(), pinhole.K.numpy()
    u, v = np.meshgrid(np.arange(fisheye.width) + 0.5, np.arange(fisheye.height) + 0.5)
    x, y = (u - K[0, 2]) / K[0, 0], (v - K[1, 2]) / K[1, 1]
    rays = equidistant_rays(x, y)
    ahead = rays[..., 2] > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        pu = rays[..., 0] / rays[..., 2] * P[0, 0] + P[0, 2]
        pv = rays[..., 1] / rays[..., 2] * P[1, 1] + P[1, 2]
    inside = ahead & (pu >= 0) & (pu <= pinhole.width) & (pv >= 0) & (pv <= pinhole.height)
    # An equidistant pixel sees a solid angle proportional to sin(theta) / theta.
    return inside, np.sinc(np.hypot(x, y) / np.pi)


def field_kept(inside: np.ndarray, solid_angle: np.ndarray) -> dict:
    return {"pixels": round(float(inside.mean()), 4),
            "solid_angle": round(float(solid_angle[inside].sum() / solid_angle.sum()), 4)}


def scores(model, store: ImageStore, ids: list[int], inside: np.ndarray | None = None) -> dict:
    """PSNR and SSIM of the test views; with ``inside``, PSNR inside and outside it too."""
    metrics = ImageMetrics()
    errors = {"inside_pinhole": [0.0, 0], "outside_pinhole": [0.0, 0]}
    for i in ids:
        with torch.no_grad():
            rgb = render(model, store.camera(i)).rgb.clamp(0, 1)
        target = store.as_float(i)
        metrics.add(rgb, target)
        if inside is not None:
            squared = ((rgb.double() - target.double()) ** 2).sum(-1).numpy()
            for region, where in (("inside_pinhole", inside), ("outside_pinhole", ~inside)):
                errors[region][0] += float(squared[where].sum())
                errors[region][1] += 3 * int(where.sum())
    result = {name: round(value, 4) for name, value in metrics.summary().items()}
    if inside is not None:
        result.update({f"psnr_{region}": round(-10 * math.log10(total / count), 4)
                       for region, (total, count) in errors.items()})
    return result


def score(args: argparse.Namespace) -> None:
    base = Path(args.out)
    stores = {kind: ImageStore(load_scene(base / kind), resolution=args.resolution,
                               cache_dir=base / "cache") for kind in ("fisheye", "pinhole")}
    names = [[store.camera(i).name for i in range(len(store))] for store in stores.values()]
    assert names[0] == names[1], "the two scenes hold the same views"
    _, test_ids = stores["fisheye"].scene.split(True)
    fisheye, pinhole = stores["fisheye"].camera(0), stores["pinhole"].camera(0)
    inside, solid_angle = inside_pinhole(fisheye, pinhole)
    result = {"fisheye": [fisheye.width, fisheye.height, round(float(fisheye.K[0, 0]), 3)],
              "pinhole": [pinhole.width, pinhole.height, round(float(pinhole.K[0, 0]), 3)],
              "pinhole_keeps": field_kept(inside, solid_angle), "test_views": len(test_ids)}
    for name, run in (("native_fisheye", args.fisheye_run), ("undistorted_pinhole",
                                                             args.pinhole_run)):
        model = read_model(Path(run) / "point_cloud.ply").model
        result[name] = {"gaussians": len(model),
                        "through_fisheye": scores(model, stores["fisheye"], test_ids, inside),
                        "through_pinhole": scores(model, stores["pinhole"], test_ids)}
    emit(result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="stage", required=True)
    making = sub.add_parser("make")
    making.add_argument("scene")
    making.add_argument("model", help="a model of the scene (PLY, .splat, .spz)")
    making.add_argument("--out", required=True)
    making.add_argument("--size", type=int, nargs=2, default=(320, 240))
    making.add_argument("--diagonal", type=float, default=150.0,
                        help="degrees the photos see across their diagonal")
    making.add_argument("--k", type=float, nargs=4, default=(0.03, -0.005, 0.0005, 0.0),
                        help="OPENCV_FISHEYE's k1..k4 of the photos' lens")
    scoring = sub.add_parser("score")
    scoring.add_argument("--out", required=True, help="the folder make wrote")
    scoring.add_argument("--fisheye-run", required=True)
    scoring.add_argument("--pinhole-run", required=True)
    scoring.add_argument("--resolution", type=int, choices=(1, 2, 4, 8), default=1,
                         help="the runs' --resolution")
    args = parser.parse_args()
    make(args) if args.stage == "make" else score(args)


if __name__ == "__main__":
    main()

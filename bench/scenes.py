"""The scenes the benchmarks share, built from the test data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from scipy.spatial import cKDTree

from splatscale.data.cameras import Camera
from splatscale.data.colmap import read_colmap
from splatscale.data.images import ImageStore
from splatscale.model import init_from_points
from splatscale.model.gaussians import GaussianModel

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"


def snowmiku_init() -> tuple[ImageStore, GaussianModel]:
    """snowmiku's images and its SfM points at 3DGS initialisation."""
    scene = read_colmap(DATA / "snowmiku")
    return ImageStore(scene, background=scene.background), init_from_points(scene.points,
                                                                              scene.colors)


def garden_scene(count: int, seed: int = 0) -> tuple[GaussianModel, list[Camera]]:
    """``count`` of the garden splats' points (3DGS initialisation) and the three garden
    cameras: a random choice of them, or all of them and then copies, each with a jitter
    of its nearest-neighbour distance."""
    data = np.load(DATA / "garden_splats.npz")
    points, colors = data["means3d"].astype(np.float64), data["colors"]
    rng = np.random.default_rng(seed)
    if count <= len(points):
        chosen = rng.choice(len(points), count, replace=False)
        model = init_from_points(points[chosen], colors[chosen].clip(0, 1))
    else:
        spacing = cKDTree(points).query(points, k=2)[0][:, 1]
        copies = rng.integers(0, len(points), count - len(points))
        jittered = points[copies] + rng.normal(size=(len(copies), 3)) * spacing[copies, None]
        model = init_from_points(np.concatenate([points, jittered]),
                                 np.concatenate([colors, colors[copies]]).clip(0, 1))
    cameras = [Camera(torch.from_numpy(v).float(), torch.from_numpy(k).float(),
                      int(data["width"]), int(data["height"]), f"garden{i}")
               for i, (v, k) in enumerate(zip(data["viewmats"], data["Ks"]))]
    return model, cameras


def tiled_garden(per_tile: int, rows: int, columns: int) -> tuple[GaussianModel, list[Camera]]:
    """``garden_scene(per_tile)`` laid ``rows`` x ``columns`` times side by side on the
    ground (the x-y plane), each copy shifted by the span of the garden's points (2nd to
    98th percentile). The copy at the origin is the front row: the first garden camera,
    looking along +x, sees its own copy and little of those behind and beside it."""
    model, cameras = garden_scene(per_tile)
    low, high = np.percentile(model.means.numpy(), [2, 98], axis=0)
    span = torch.tensor([high[0] - low[0], high[1] - low[1], 0.0], dtype=model.means.dtype)
    offsets = [span * torch.tensor([i, j, 0.0], dtype=span.dtype)
               for i in range(1 - rows, 1) for j in range(-(columns // 2), columns - columns // 2)]
    joined = {name: torch.cat([tensor + offset if name == "means" else tensor
                               for offset in offsets])
              for name, tensor in model.parameters().items()}
    return GaussianModel(**joined, sh_degree=model.sh_degree), cameras


def moved_views(cameras: list[Camera], centre: torch.Tensor, count: int,
                generator: torch.Generator) -> list[Camera]:
    """``count`` views: the cameras in turn, each moved by up to 2 % of its distance
    to ``centre``."""
    views = []
    for i in range(count):
        camera = cameras[i % len(cameras)]
        distance = float((camera.center - centre).norm())
        offset = (torch.rand(3, generator=generator) * 2 - 1) * 0.02 * distance
        viewmat = camera.viewmat.clone()
        viewmat[:3, 3] -= viewmat[:3, :3] @ offset  # the centre moves by +offset
        views.append(Camera(viewmat, camera.K, camera.width, camera.height, f"{camera.name}+"))
    return views


def write_video(images: list[Path], path: Path, fps: int = 10) -> None:
    """An MPEG-4 video of ``images`` (cropped to even sizes), as a phone would film them."""
    import av
    from PIL import Image

    with Image.open(images[0]) as first:
        width, height = first.width // 2 * 2, first.height // 2 * 2
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.bit_rate = 4_000_000
        for image_path in images:
            with Image.open(image_path) as image:
                frame = av.VideoFrame.from_image(image.crop((0, 0, width, height)))
            container.mux(stream.encode(frame))
        container.mux(stream.encode())

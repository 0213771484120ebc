"""Model files: the INRIA 3DGS PLY layout (read and write) and the .splat format."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np
import torch
from plyfile import PlyData, PlyElement

from splatscale.atomic import atomic_path
from splatscale.errors import DataError
from splatscale.model.gaussians import MAX_SH_DEGREE, SH_C0, SH_REST, GaussianModel

BASE = (["x", "y", "z", "nx", "ny", "nz"] + [f"f_dc_{i}" for i in range(3)])
TAIL = ["opacity"] + [f"scale_{i}" for i in range(3)] + [f"rot_{i}" for i in range(4)]


def ply_properties(sh_coefficients: int = SH_REST) -> list[str]:
    return BASE + [f"f_rest_{i}" for i in range(3 * sh_coefficients)] + TAIL


def write_ply(model: GaussianModel, path: str | Path,
              extras: np.ndarray | None = None) -> None:
    """Write ``model`` in the INRIA layout (f_rest channel-major, logit opacity, log scales),
    and the per-Gaussian properties ``extras`` (a structured array, ``read_extras``) after."""
    if extras is None or not extras.dtype.names:
        write_ply_parts([model], len(model), path)
        return
    records = _records(model)
    rows = np.empty(len(model), dtype=[(name, "<f4") for name in ply_properties()]
                    + [(name, extras.dtype[name].str) for name in extras.dtype.names])
    for i, name in enumerate(ply_properties()):
        rows[name] = records[:, i]
    for name in extras.dtype.names:
        rows[name] = extras[name]
    with atomic_path(path) as tmp:
        PlyData([PlyElement.describe(rows, "vertex")]).write(str(tmp))


def write_ply_parts(parts: Iterable[GaussianModel], count: int, path: str | Path) -> None:
    """One PLY of ``count`` Gaussians from consecutive ``parts``, one part in memory at a
    time (a distributed run streams its shards)."""
    properties = ply_properties()
    header = ("ply\nformat binary_little_endian 1.0\n"
              f"element vertex {count}\n"
              + "".join(f"property float {name}\n" for name in properties) + "end_header\n")
    written = 0
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        handle.write(header.encode("ascii"))
        for part in parts:
            handle.write(_records(part).tobytes())
            written += len(part)
        if written != count:
            raise ValueError(f"write_ply_parts: {written} Gaussians written, {count} announced")


def _records(model: GaussianModel) -> np.ndarray:
    """The model's rows as little-endian float32 records of ``ply_properties()``."""
    n = len(model)
    p = {name: t.detach().cpu().to(torch.float32).numpy() for name, t in model.parameters().items()}
    columns = [p["means"], np.zeros((n, 3), np.float32), p["sh0"].reshape(n, 3),
               p["shN"].transpose(0, 2, 1).reshape(n, 3 * SH_REST),
               p["opacity_logits"][:, None], p["log_scales"], p["quats"]]
    return np.ascontiguousarray(np.concatenate(columns, axis=1), dtype="<f4")


def read_ply(path: str | Path, dtype: torch.dtype = torch.float32) -> GaussianModel:
    """Read an INRIA-layout PLY (any SH degree 0..3; missing higher bands are zero).

    An empty model, or one with NaN or infinite values, is refused.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:
        vertex = PlyData.read(str(path))["vertex"]
    except Exception as error:  # plyfile raises its own parse errors, KeyError, ValueError...
        raise DataError(f"{path}: not a 3DGS PLY file ({type(error).__name__}: {error})") from None
    model = _model_of(vertex, path, dtype)
    if len(model) == 0:
        raise DataError(f"{path}: the model has no Gaussians")
    bad = model.non_finite_rows()
    if len(bad):
        rows = ", ".join(map(str, bad[:5].tolist())) + (", ..." if len(bad) > 5 else "")
        raise DataError(f"{path}: {len(bad)} of {len(model)} Gaussians have NaN or infinite "
                        f"values (rows {rows})")
    return model


def read_extras(path: str | Path) -> np.ndarray:
    """The vertex properties of a model file that are not the INRIA layout's (a
    trainer's own per-Gaussian values), as a structured array; read after ``read_ply``."""
    data = PlyData.read(str(path))["vertex"].data
    known = set(BASE + TAIL) | {n for n in data.dtype.names if n.startswith("f_rest_")}
    extra = [name for name in data.dtype.names if name not in known]
    return data[extra] if extra else np.empty(len(data), dtype=[])


def _model_of(vertex, path: Path, dtype: torch.dtype) -> GaussianModel:
    names = set(vertex.data.dtype.names)
    missing = [name for name in BASE[:3] + BASE[6:] + TAIL if name not in names]
    if missing:
        raise DataError(f"{path}: missing PLY properties {', '.join(missing)}")
    rest = sorted((n for n in names if n.startswith("f_rest_")), key=lambda n: int(n[7:]))
    per_channel = len(rest) // 3
    degree = round((per_channel + 1) ** 0.5) - 1
    if len(rest) % 3 or (degree + 1) ** 2 - 1 != per_channel or degree > MAX_SH_DEGREE:
        raise DataError(f"{path}: {len(rest)} f_rest properties is no SH degree 0..3")
    n = len(vertex.data)
    column = lambda *keys: np.stack([np.asarray(vertex[k], np.float64) for k in keys], 1)  # noqa: E731
    shN = np.zeros((n, SH_REST, 3))
    if per_channel:
        shN[:, :per_channel] = column(*rest).reshape(n, 3, per_channel).transpose(0, 2, 1)
    as_tensor = lambda a: torch.as_tensor(a, dtype=dtype)  # noqa: E731
    return GaussianModel(
        means=as_tensor(column("x", "y", "z")),
        quats=as_tensor(column(*[f"rot_{i}" for i in range(4)])),
        log_scales=as_tensor(column(*[f"scale_{i}" for i in range(3)])),
        opacity_logits=as_tensor(column("opacity")[:, 0]),
        sh0=as_tensor(column("f_dc_0", "f_dc_1", "f_dc_2"))[:, None],
        shN=as_tensor(shN), sh_degree=degree)


def write_splat(model: GaussianModel, path: str | Path) -> None:
    """The 32-byte-per-Gaussian .splat format of web viewers, most important first."""
    with torch.no_grad():
        scales = model.scales.float()
        opacity = model.opacities.float()
        order = torch.argsort(-(scales.prod(dim=1) * opacity), stable=True)
        rgb = (0.5 + SH_C0 * model.sh0[:, 0].float()).clamp(0, 1)
        rgba = torch.cat([rgb, opacity[:, None]], 1)
        quats = model.rotations.float()
    records = np.zeros(len(model), dtype=[("position", "<f4", 3), ("scale", "<f4", 3),
                                          ("rgba", "u1", 4), ("rotation", "u1", 4)])
    records["position"] = model.means.detach().float()[order].numpy()
    records["scale"] = scales[order].numpy()
    records["rgba"] = (rgba[order] * 255).round().clamp(0, 255).numpy()
    records["rotation"] = (quats[order] * 128 + 128).round().clamp(0, 255).numpy()
    with atomic_path(path) as tmp:
        tmp.write_bytes(records.tobytes())

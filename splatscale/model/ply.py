"""Model files: the INRIA 3DGS PLY layout and the .splat format, read and written.

A PLY we write may record its world's up direction (``model.orientation``) as a
header comment, ``comment splatscale up X Y Z``, which other tools ignore. An
anti-aliased model (``GaussianModel.antialiased``) says so as Brush does,
``comment SplatRenderMode: mip``; a plain one writes no such comment. Reading,
Postshot's ``comment antialiased 0|1`` is understood as well, and where several
say, the last holds."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np
import torch
from plyfile import PlyData, PlyElement, PlyParseError

from splatscale.atomic import atomic_path
from splatscale.errors import DataError
from splatscale.model.gaussians import MAX_SH_DEGREE, SH_C0, SH_REST, GaussianModel

BASE = (["x", "y", "z", "nx", "ny", "nz"] + [f"f_dc_{i}" for i in range(3)])
TAIL = ["opacity"] + [f"scale_{i}" for i in range(3)] + [f"rot_{i}" for i in range(4)]
UP_COMMENT = "splatscale up"
# How other tools mark a PLY's render mode: the words of the comment, and what each
# value means (anti-aliased or not).
RENDER_MODE_COMMENTS = {"SplatRenderMode:": {"mip": True, "default": False},  # Brush's
                        "antialiased": {"1": True, "0": False}}             # Postshot's
ANTIALIASED_COMMENT = "SplatRenderMode: mip"
# antimatter15's .splat rows, as web viewers read them.
SPLAT_ROW = np.dtype([("position", "<f4", 3), ("scale", "<f4", 3), ("rgba", "u1", 4),
                      ("rotation", "u1", 4)])


def ply_properties(sh_coefficients: int = SH_REST) -> list[str]:
    return BASE + [f"f_rest_{i}" for i in range(3 * sh_coefficients)] + TAIL


def write_ply(model: GaussianModel, path: str | Path,
              extras: np.ndarray | None = None, up: np.ndarray | None = None) -> None:
    """Write ``model`` in the INRIA layout (f_rest channel-major, logit opacity, log scales),
    and the per-Gaussian properties ``extras`` (a structured array, ``read_extras``) after;
    ``up``, the world's up direction, and whether it is anti-aliased, in the header."""
    if extras is None or not extras.dtype.names:
        write_ply_parts([model], len(model), path, up, model.antialiased)
        return
    records = _records(model)
    rows = np.empty(len(model), dtype=[(name, "<f4") for name in ply_properties()]
                    + [(name, extras.dtype[name].str) for name in extras.dtype.names])
    for i, name in enumerate(ply_properties()):
        rows[name] = records[:, i]
    for name in extras.dtype.names:
        rows[name] = extras[name]
    with atomic_path(path) as tmp:
        PlyData([PlyElement.describe(rows, "vertex")],
                comments=_comments(up, model.antialiased)).write(str(tmp))


def write_ply_parts(parts: Iterable[GaussianModel], count: int, path: str | Path,
                    up: np.ndarray | None = None, antialiased: bool = False) -> None:
    """One PLY of ``count`` Gaussians from consecutive ``parts``, one part in memory at a
    time (a distributed run streams its shards); ``up`` and ``antialiased`` (the parts'
    render mode) in its header."""
    properties = ply_properties()
    header = ("ply\nformat binary_little_endian 1.0\n"
              + "".join(f"comment {line}\n" for line in _comments(up, antialiased))
              + f"element vertex {count}\n"
              + "".join(f"property float {name}\n" for name in properties) + "end_header\n")
    written = 0
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        handle.write(header.encode("ascii"))
        for part in parts:
            handle.write(_records(part).tobytes())
            written += len(part)
        if written != count:
            raise ValueError(f"write_ply_parts: {written} Gaussians written, {count} announced")


def _comments(up: np.ndarray | None, antialiased: bool) -> list[str]:
    """The header comments: ``up`` (none without it), its numbers as Python writes
    floats, so that they read back exactly; the render mode of an anti-aliased model."""
    comments = [] if up is None else [UP_COMMENT + "".join(f" {float(v)!r}" for v in up)]
    return comments + ([ANTIALIASED_COMMENT] if antialiased else [])


def recorded_antialiased(comments: list[str], path: str | Path) -> bool:
    """Whether a PLY's header ``comments`` say its splats are anti-aliased (the last
    comment that says either way holds; none: not anti-aliased)."""
    antialiased = False
    for comment in comments:
        words = comment.split()
        meanings = RENDER_MODE_COMMENTS.get(words[0]) if words else None
        if meanings is None:
            continue
        if len(words) != 2 or words[1] not in meanings:
            raise DataError(f"{path}: its header's 'comment {comment}' is no render mode this "
                            f"reads ({words[0]} {' or '.join(meanings)})")
        antialiased = meanings[words[1]]
    return antialiased


def recorded_up(path: str | Path) -> np.ndarray | None:
    """The up direction a PLY's header records, or None (a PLY of another tool)."""
    with open(path, "rb") as handle:
        for line in handle:
            words = line.decode("ascii", errors="replace").split()
            if words[:1] == ["end_header"]:
                return None
            if words[:3] == ["comment", *UP_COMMENT.split()]:
                return _direction(words[3:], path)
    return None


def _direction(words: list[str], path: str | Path) -> np.ndarray:
    try:
        up = np.array([float(word) for word in words])
    except ValueError:
        up = np.zeros(0)
    if up.shape != (3,) or not np.isfinite(up).all() or not np.linalg.norm(up) > 0:
        raise DataError(f"{path}: its header's 'comment {UP_COMMENT}' is not a direction "
                        f"(three finite numbers, not all zero): {' '.join(words)!r}")
    return up / np.linalg.norm(up)


def _records(model: GaussianModel) -> np.ndarray:
    """The model's rows as little-endian float32 records of ``ply_properties()``."""
    n = len(model)
    p = {name: t.detach().cpu().to(torch.float32).numpy() for name, t in model.parameters().items()}
    shN = np.zeros((n, SH_REST, 3), np.float32)  # every band's, zero where not held
    shN[:, :p["shN"].shape[1]] = p["shN"]
    columns = [p["means"], np.zeros((n, 3), np.float32), p["sh0"].reshape(n, 3),
               shN.transpose(0, 2, 1).reshape(n, 3 * SH_REST),
               p["opacity_logits"][:, None], p["log_scales"], p["quats"]]
    return np.ascontiguousarray(np.concatenate(columns, axis=1), dtype="<f4")


def read_ply(path: str | Path, dtype: torch.dtype = torch.float32) -> GaussianModel:
    """Read an INRIA-layout PLY (any SH degree 0..3; missing higher bands are zero).

    An empty model, or one with NaN or infinite values, is refused.
    """
    path = existing_file(path)
    with open(path, "rb") as handle:
        if handle.read(4).rstrip(b"\r\n") != b"ply":
            raise DataError(f"{path}: not a 3DGS PLY file (it does not begin with 'ply'; a "
                            "model file is read as a PLY unless its name ends in .splat or "
                            ".spz)")
    try:
        data = PlyData.read(str(path))
        vertex = data["vertex"]
    except PlyParseError as error:  # its messages say where and what
        raise DataError(f"{path}: not a 3DGS PLY file ({error})") from None
    except Exception as error:  # KeyError (no vertex element), ValueError...
        raise DataError(f"{path}: not a 3DGS PLY file ({type(error).__name__}: {error})") from None
    model = _model_of(vertex, path, dtype)
    model.antialiased = recorded_antialiased(data.comments, path)
    return usable_model(model, path)


def existing_file(path: str | Path) -> Path:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    return path


def usable_model(model: GaussianModel, path: Path) -> GaussianModel:
    """``model`` as read from ``path``; refused if it is empty or holds a NaN or an
    infinite value."""
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
    records = np.zeros(len(model), dtype=SPLAT_ROW)
    records["position"] = model.means.detach().float()[order].numpy()
    records["scale"] = scales[order].numpy()
    records["rgba"] = (rgba[order] * 255).round().clamp(0, 255).numpy()
    records["rotation"] = (quats[order] * 128 + 128).round().clamp(0, 255).numpy()
    with atomic_path(path) as tmp:
        tmp.write_bytes(records.tobytes())


def read_splat(path: str | Path, dtype: torch.dtype = torch.float32) -> GaussianModel:
    """A .splat file's Gaussians (``write_splat``'s rows, in any order): degree-0
    colours, opacities and rotations to the format's 8 bits."""
    path = existing_file(path)
    size = path.stat().st_size
    if size == 0 or size % SPLAT_ROW.itemsize:
        raise DataError(f"{path}: not a .splat file ({size:,} bytes is not a whole number "
                        f"of {SPLAT_ROW.itemsize}-byte splats)")
    rows = np.fromfile(path, dtype=SPLAT_ROW)
    rgba = rows["rgba"] / 255.0
    # A byte stands for the values within half a step of it: opacities 0 and 1, whose
    # logits are infinite, are read as the nearest values they stand for.
    opacity = np.clip(rgba[:, 3], 0.5 / 255, 1 - 0.5 / 255)
    with np.errstate(divide="ignore", invalid="ignore"):  # a zero or negative scale: refused
        log_scales = np.log(rows["scale"].astype(np.float64))
    as_tensor = lambda a: torch.as_tensor(a, dtype=dtype)  # noqa: E731
    model = GaussianModel(
        means=as_tensor(rows["position"]),
        quats=as_tensor((rows["rotation"] - 128.0) / 128.0),
        log_scales=as_tensor(log_scales),
        opacity_logits=as_tensor(np.log(opacity / (1 - opacity))),
        sh0=as_tensor((rgba[:, :3] - 0.5) / SH_C0)[:, None],
        shN=torch.zeros(len(rows), SH_REST, 3, dtype=dtype), sh_degree=0)
    return usable_model(model, path)

"""Models as Niantic's .spz files (compressed splats that web viewers read), packed and
unpacked by gsply.

An .spz file holds its splats in RUB axes (x right, y up, z back: OpenGL's and
three.js's), where ours (and a PLY's) are RDF (OpenCV's: y down, z forward). The
two differ by a half turn about x, (x, y, z) -> (x, -y, -z), which we apply
before packing (and after unpacking: it is its own inverse): centres and
quaternions' y and z change sign, and each spherical-harmonic coefficient
changes sign with the parity of its basis function in y and z.

An anti-aliased model sets the header's flag the format defines for it
(``FLAG_ANTIALIASED`` of nianticlabs/spz's ``PackedGaussiansHeader.flags``), which
gsply neither writes nor reads: we set it in the file gsply packed, and read it
from the header ourselves.
"""

from __future__ import annotations

import gzip
import math
import struct
import zlib
from pathlib import Path

import numpy as np
import torch

from splatscale.atomic import atomic_path
from splatscale.errors import DataError
from splatscale.model.gaussians import SH_REST, GaussianModel, sh_rest
from splatscale.model.ply import existing_file, usable_model

SPZ_VERSION = 3  # gzip container, read by every .spz reader
MAX_FRACTIONAL_BITS = 12  # the format's usual precision of centres: 1/4096
# The sign each SH coefficient of degree 1..3 takes under (x, y, z) -> (x, -y, -z),
# in gsplat's order (tests/test_spz.py derives it from the basis functions).
HALF_TURN_SH_SIGNS = np.array([-1, -1, 1,
                               -1, 1, 1, -1, 1,
                               -1, 1, -1, -1, 1, -1, 1], dtype=np.float32)
FLIP = np.array([1.0, -1.0, -1.0], dtype=np.float32)  # the half turn on centres
QUAT_FLIP = np.array([1.0, 1.0, -1.0, -1.0], dtype=np.float32)  # and on wxyz quaternions
# The header every version begins with (version 4 adds to it, uncompressed; earlier
# versions are gzipped whole): magic, version, count, SH degree, fractional bits, flags.
HEADER = struct.Struct("<IIIBBB")
MAGIC = 0x5053474E  # "NGSP"
FLAGS_AT = 14       # the flags byte's offset in the header
FLAG_ANTIALIASED = 0x1


def write_spz(model: GaussianModel, path: str | Path) -> None:
    """``model`` as an .spz file at ``path`` (at the SH degree it uses), written atomically.
    Its centres are fixed point with as many fractional bits (up to 12) as their
    largest coordinate leaves; its header flags it anti-aliased where it is."""
    from gsply import GSData
    from gsply.spz import write_spz as pack

    p = {name: t.detach().cpu().float().numpy() for name, t in model.parameters().items()}
    rest = sh_rest(model.sh_degree)
    data = GSData(means=np.ascontiguousarray(p["means"] * FLIP),
                  scales=p["log_scales"],
                  quats=np.ascontiguousarray(_unit(p["quats"]) * QUAT_FLIP),
                  opacities=p["opacity_logits"],
                  sh0=np.ascontiguousarray(p["sh0"][:, 0]),
                  shN=np.ascontiguousarray(p["shN"][:, :rest] * HALF_TURN_SH_SIGNS[:rest, None]))
    bits = fractional_bits(float(np.abs(p["means"]).max()), path)
    with atomic_path(path) as tmp:
        pack(tmp, data, version=SPZ_VERSION, fractional_bits=bits)
        if model.antialiased:
            _flag_antialiased(tmp)


def _flag_antialiased(path: Path) -> None:
    """Set the anti-aliased flag in the header of the gzipped (version 3) file at
    ``path``."""
    raw = bytearray(gzip.decompress(path.read_bytes()))
    raw[FLAGS_AT] |= FLAG_ANTIALIASED
    path.write_bytes(gzip.compress(bytes(raw), mtime=0))


def read_spz(path: str | Path, dtype: torch.dtype = torch.float32) -> GaussianModel:
    """An .spz file's Gaussians (any version gsply reads), in our axes, within the
    format's quantisation, anti-aliased where its header's flag says."""
    from gsply.spz import read_spz as unpack

    path = existing_file(path)
    try:
        data = unpack(path)
    except ValueError as error:  # gsply's word for every malformed file
        reason = str(error).removesuffix(f": {path}")
        raise DataError(f"{path}: not a readable .spz file ({reason})") from None
    n = len(data.means)
    shN, rest = np.zeros((n, SH_REST, 3), dtype=np.float32), 0
    if data.shN is not None:  # None at degree 0
        rest = data.shN.shape[1]
        shN[:, :rest] = data.shN * HALF_TURN_SH_SIGNS[:rest, None]
    as_tensor = lambda a: torch.as_tensor(np.asarray(a), dtype=dtype)  # noqa: E731
    model = GaussianModel(means=as_tensor(data.means * FLIP),
                          quats=as_tensor(data.quats * QUAT_FLIP),
                          log_scales=as_tensor(data.scales),
                          opacity_logits=as_tensor(data.opacities).reshape(n),
                          sh0=as_tensor(data.sh0).reshape(n, 1, 3),
                          shN=as_tensor(shN), sh_degree=round(math.sqrt(rest + 1)) - 1,
                          antialiased=bool(_header_flags(path) & FLAG_ANTIALIASED))
    return usable_model(model, path)


def _header_flags(path: Path) -> int:
    """The flags byte of the header of the .spz file at ``path`` (one gsply has read)."""
    with open(path, "rb") as handle:
        start = handle.read(4096)
    if start[:2] == b"\x1f\x8b":  # versions 1 to 3: the header is gzipped with the rest
        start = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS).decompress(start, HEADER.size)
    if len(start) < HEADER.size or HEADER.unpack_from(start)[0] != MAGIC:
        raise DataError(f"{path}: not a readable .spz file (its header is cut short)")
    return start[FLAGS_AT]



def fractional_bits(largest: float, path: str | Path) -> int:
    """The most fractional bits (up to 12) of a 24-bit signed fixed point that holds
    coordinates up to ``largest``."""
    bits = MAX_FRACTIONAL_BITS if largest <= 0 else min(
        MAX_FRACTIONAL_BITS, math.floor(math.log2((2 ** 23 - 1) / largest)))
    if bits < 1:
        raise DataError(f"{path}: coordinates up to {largest:g} do not fit an .spz file "
                        f"(24-bit fixed point: below {2 ** 22:g})")
    return bits


def _unit(quats: np.ndarray) -> np.ndarray:
    """Unit quaternions; a zero one (no rotation to the renderer) as the identity."""
    norms = np.linalg.norm(quats, axis=1, keepdims=True)
    identity = np.tile(np.array([1.0, 0.0, 0.0, 0.0], dtype=quats.dtype), (len(quats), 1))
    return np.divide(quats, norms, out=identity, where=norms > 0)

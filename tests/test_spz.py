"""The .spz export: the axis change's SH signs from the basis functions, a round trip
through gsply's reader, and Niantic's own reader (where installed) giving back the
model within the format's quantisation."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from splatscale.model.gaussians import GaussianModel
from splatscale.model.spz import HALF_TURN_SH_SIGNS, write_spz
from splatscale.render.sh import sh_basis
from tests.conftest import random_model

REFERENCE = os.environ.get("SPLATSCALE_SPZ_REFERENCE")  # a folder holding @spz-loader/core
SCRIPT = Path(__file__).with_name("spz_reference.mjs")


def test_the_sh_signs_are_the_basis_functions_parities():
    directions = torch.nn.functional.normalize(torch.randn(64, 3, dtype=torch.float64), dim=1)
    turned = directions * torch.tensor([1.0, -1.0, -1.0], dtype=torch.float64)
    basis, turned_basis = sh_basis(3, directions)[:, 1:], sh_basis(3, turned)[:, 1:]
    torch.testing.assert_close(turned_basis, basis * torch.from_numpy(HALF_TURN_SH_SIGNS).double())


def small_model() -> GaussianModel:
    model = random_model(200, seed=5, dtype=torch.float32, log_scale=(-5.0, -1.0))
    model.shN.mul_(0.2)  # as trained models' are: within the format's range
    return model


def unit_quats(model: GaussianModel) -> np.ndarray:
    return torch.nn.functional.normalize(model.quats, dim=1).numpy()


def same_rotation(a: np.ndarray, b: np.ndarray, atol: float) -> None:
    """Unit quaternions equal up to sign."""
    sign = np.sign(np.sum(a * b, axis=1, keepdims=True))
    np.testing.assert_allclose(a, b * sign, atol=atol)


def test_gsply_reads_back_the_model_turned(tmp_path):
    from gsply.spz import read_spz

    model = small_model()
    write_spz(model, tmp_path / "model.spz")
    assert (tmp_path / "model.spz").read_bytes()[:2] == b"\x1f\x8b"  # gzip container
    back = read_spz(tmp_path / "model.spz")
    flip = np.array([1.0, -1.0, -1.0])
    np.testing.assert_allclose(back.means * flip, model.means.numpy(), atol=2 ** -12)
    np.testing.assert_allclose(back.scales, model.log_scales.numpy(), atol=1 / 32 + 1e-6)
    same_rotation(back.quats * np.array([1.0, 1.0, -1.0, -1.0]), unit_quats(model), atol=2e-3)
    np.testing.assert_allclose(back.shN * HALF_TURN_SH_SIGNS[:, None],
                               model.shN.numpy(), atol=1 / 16 + 1e-6)


def reference_or_skip() -> Path:
    if not REFERENCE:
        pytest.skip("SPLATSCALE_SPZ_REFERENCE is not set (a folder with @spz-loader/core)")
    folder = Path(REFERENCE)
    assert (folder / "node_modules" / "@spz-loader" / "core").is_dir(), \
        f"SPLATSCALE_SPZ_REFERENCE={folder} holds no node_modules/@spz-loader/core"
    assert shutil.which("node"), "node is needed to run the reference reader"
    return folder


def niantics_reading(folder: Path, path: Path) -> dict:
    done = subprocess.run(["node", str(SCRIPT), str(folder), str(path)],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_niantics_reader_gives_back_the_model(tmp_path):
    folder = reference_or_skip()
    model = small_model()
    write_spz(model, tmp_path / "model.spz")
    cloud = niantics_reading(folder, tmp_path / "model.spz")
    n = len(model)
    assert cloud["numPoints"] == n and cloud["shDegree"] == 3
    assert cloud["antialiased"] is False
    array = lambda name, *shape: np.asarray(cloud[name], dtype=np.float64).reshape(n, *shape)  # noqa: E731
    # Positions: 24-bit fixed point with 12 fractional bits.
    np.testing.assert_allclose(array("positions", 3), model.means.numpy(), atol=2 ** -12)
    # Log scales in steps of 1/16; opacities and colours in steps of 1/255 of their range.
    np.testing.assert_allclose(np.log(array("scales", 3)), model.log_scales.numpy(),
                               atol=1 / 32 + 1e-5)
    np.testing.assert_allclose(array("alphas"), model.opacities.numpy(), atol=1 / 255)
    dc_step = 1 / (0.15 * 255)
    np.testing.assert_allclose(array("colors", 3) - 0.5, model.sh0[:, 0].numpy(),
                               atol=dc_step / 2 + 1e-5)
    xyzw = array("rotations", 4)
    same_rotation(np.concatenate([xyzw[:, 3:], xyzw[:, :3]], axis=1), unit_quats(model),
                  atol=3e-3)
    # Degree 1 in 5 bits, 2 and 3 in 4 bits, of a range of 2.
    sh = array("sh", 15, 3)
    step = np.array([2 ** -4] * 3 + [2 ** -3] * 12)[:, None]
    assert np.all(np.abs(sh - model.shN.numpy()) <= step / 2 + 1e-5 + 2 / 256)


def test_export_writes_spz(tmp_path, capsys):
    from splatscale.cli import main
    from splatscale.model.ply import write_ply

    model = small_model()
    write_ply(model, tmp_path / "model.ply")
    assert main(["export", str(tmp_path / "model.ply"), "--format", "spz"]) == 0
    spz, ply = tmp_path / "model.spz", tmp_path / "model.ply"
    assert f"wrote {spz}" in capsys.readouterr().out
    assert spz.stat().st_size < ply.stat().st_size / 4
    assert math.isclose(spz.stat().st_mode & 0o777, 0o666 & ~_umask())


def _umask() -> int:
    from splatscale.atomic import umask
    return umask()


def test_far_centres_keep_their_place_with_fewer_fractional_bits(tmp_path):
    from gsply.spz import read_spz

    model = small_model()
    model.means.mul_(3000.0)  # beyond 2048, where 12 fractional bits end
    model.quats[:3] = 0.0  # no rotation, to the renderer
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        write_spz(model, tmp_path / "far.spz")
    back = read_spz(tmp_path / "far.spz")
    np.testing.assert_allclose(back.means * np.array([1.0, -1.0, -1.0]), model.means.numpy(),
                               atol=2 ** -11)
    np.testing.assert_allclose(back.quats[:3], [[1.0, 0.0, 0.0, 0.0]] * 3, atol=2e-3)


def test_export_refuses_what_spz_cannot_hold_and_what_is_not_a_file(tmp_path, capfd):
    from splatscale.cli import main
    from splatscale.model.ply import write_ply

    model = small_model()
    write_ply(model, tmp_path / "model.ply")
    (tmp_path / "folder").mkdir()
    assert main(["export", str(tmp_path / "model.ply"), "--format", "spz",
                 "-o", str(tmp_path / "folder")]) == 2
    model.means[0, 0] = 1e30
    write_ply(model, tmp_path / "huge.ply")
    assert main(["export", str(tmp_path / "huge.ply"), "--format", "spz"]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 2, err
    assert f"{tmp_path / 'folder'}: a .spz file's name ends in .spz" in err[0]
    assert "do not fit an .spz file" in err[1] and not (tmp_path / "huge.spz").exists()

    (tmp_path / "real.spz").write_bytes(b"")
    (tmp_path / "link.spz").symlink_to("real.spz")
    assert main(["export", str(tmp_path / "model.ply"), "--format", "spz",
                 "-o", str(tmp_path / "link.spz"), "--overwrite"]) == 0
    assert (tmp_path / "link.spz").is_symlink() and (tmp_path / "real.spz").stat().st_size > 0


def unpacked(path: Path) -> bytes:
    """A gzipped .spz file's bytes: its 16-byte header (magic, version, count, SH degree,
    fractional bits, flags, reserved), then its sections."""
    import gzip
    return gzip.decompress(path.read_bytes())


def test_an_antialiased_model_sets_the_formats_flag_alone_and_reads_back_so(tmp_path):
    from splatscale.model.spz import read_spz

    model = small_model()
    model.antialiased = True
    write_spz(model, tmp_path / "aa.spz")
    model.antialiased = False
    write_spz(model, tmp_path / "plain.spz")
    aa, plain = unpacked(tmp_path / "aa.spz"), unpacked(tmp_path / "plain.spz")
    assert aa[14] == 0x1 and plain[14] == 0  # nianticlabs/spz's FlagAntialiased
    assert aa[:14] + aa[15:] == plain[:14] + plain[15:]  # nothing else changes
    assert read_spz(tmp_path / "aa.spz").antialiased
    assert not read_spz(tmp_path / "plain.spz").antialiased


def test_niantics_reader_sees_an_antialiased_model(tmp_path):
    folder = reference_or_skip()
    model = small_model()
    model.antialiased = True
    write_spz(model, tmp_path / "aa.spz")
    assert niantics_reading(folder, tmp_path / "aa.spz")["antialiased"] is True
def test_the_flag_of_a_version_4_file_is_read(tmp_path):
    """Version 4 (NGSP with zstd) keeps its header uncompressed, the flags at byte 14."""
    from gsply import GSData
    from gsply.spz import _HAS_ZSTD, write_spz as gsply_write
    from splatscale.model.spz import read_spz

    if not _HAS_ZSTD:
        pytest.skip("gsply writes version 4 only with zstandard")
    model = small_model()
    gsply_write(tmp_path / "v4.spz", GSData(
        means=model.means.numpy(), scales=model.log_scales.numpy(),
        quats=model.quats.numpy(), opacities=model.opacity_logits.numpy(),
        sh0=model.sh0[:, 0].numpy(), shN=model.shN.numpy()), version=4)
    assert not read_spz(tmp_path / "v4.spz").antialiased
    raw = bytearray((tmp_path / "v4.spz").read_bytes())
    raw[14] |= 0x1
    (tmp_path / "v4.spz").write_bytes(bytes(raw))
    assert read_spz(tmp_path / "v4.spz").antialiased

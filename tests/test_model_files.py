"""Model files as ``view`` reads them: a PLY's recorded up direction (and a PLY of
another tool, which records none), .splat and .spz read back within their
quantisation, and a file none of them is refused in one line naming it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from plyfile import PlyData, PlyElement

from splatscale.cli import main
from splatscale.errors import DataError
from splatscale.model.files import read_model
from splatscale.model.gaussians import SH_C0
from splatscale.model.ply import (ply_properties, read_ply, recorded_up, write_ply,
                                  write_ply_parts, write_splat)
from splatscale.model.spz import write_spz
from tests.conftest import data_path, random_model

UP = np.array([0.1, -0.9, 0.3]) / np.linalg.norm([0.1, -0.9, 0.3])


def model(sh_degree: int = 3):
    made = random_model(200, seed=5, dtype=torch.float32, log_scale=(-5.0, -1.0),
                        sh_degree=sh_degree)
    made.shN.mul_(0.2)  # as trained models' are: within .spz's range
    return made


@pytest.mark.parametrize("writer", ["whole", "parts"])
def test_a_ply_records_its_up_and_reads_as_before(tmp_path, writer):
    written = model()
    path = tmp_path / "model.ply"
    if writer == "whole":
        write_ply(written, path, up=UP)
    else:
        write_ply_parts([written], len(written), path, up=UP)
    # Written as Python writes floats, read back exactly, but for the renormalising.
    np.testing.assert_allclose(recorded_up(path), UP, rtol=0, atol=1e-15)
    assert read_model(path).up is not None
    back = read_ply(path)
    for name, tensor in written.parameters().items():
        assert torch.equal(getattr(back, name), tensor), name
    assert PlyData.read(str(path)).comments == [
        "splatscale up " + " ".join(repr(float(value)) for value in UP)]


def test_a_ply_of_another_tool_records_no_up(tmp_path):
    assert recorded_up(data_path("interop", "snowmiku_opensplat.ply")) is None
    rows = np.zeros(3, dtype=[(name, "f4") for name in ply_properties()])
    PlyData([PlyElement.describe(rows, "vertex")], comments=["made elsewhere"]).write(
        str(tmp_path / "other.ply"))
    assert read_model(tmp_path / "other.ply").up is None
    write_ply(model(), tmp_path / "ours.ply")  # no up given: none recorded
    assert recorded_up(tmp_path / "ours.ply") is None


def test_a_broken_up_comment_is_refused_naming_the_file(tmp_path):
    rows = np.zeros(3, dtype=[(name, "f4") for name in ply_properties()])
    for words in ("0 0", "0 0 0", "1 nan 0", "up down left"):
        path = tmp_path / "bad.ply"
        PlyData([PlyElement.describe(rows, "vertex")],
                comments=[f"splatscale up {words}"]).write(str(path))
        with pytest.raises(DataError, match=r"bad.ply: its header's 'comment splatscale up' "
                                            r"is not a direction"):
            recorded_up(path)


def by_position(positions: np.ndarray) -> np.ndarray:
    return np.lexsort(positions.T[::-1])


def same_rotation(a: np.ndarray, b: np.ndarray, atol: float) -> None:
    """Quaternions equal up to sign and length."""
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    np.testing.assert_allclose(a * np.sign(np.sum(a * b, axis=1, keepdims=True)), b, atol=atol)


def test_a_splat_file_reads_back_within_its_bytes(tmp_path):
    written = model()
    write_splat(written, tmp_path / "model.splat")
    back, up = read_model(tmp_path / "model.splat")
    assert up is None and len(back) == len(written) and back.sh_degree == 0
    # The file sorts its rows by importance: match them by position, which it keeps.
    ours, theirs = by_position(written.means.numpy()), by_position(back.means.numpy())
    np.testing.assert_array_equal(back.means.numpy()[theirs], written.means.numpy()[ours])
    np.testing.assert_allclose(back.log_scales.numpy()[theirs], written.log_scales.numpy()[ours],
                               atol=1e-6)
    half_byte = 0.5 / 255 + 1e-6
    np.testing.assert_allclose(back.opacities.numpy()[theirs], written.opacities.numpy()[ours],
                               atol=half_byte)
    colours = np.clip(SH_C0 * written.sh0[:, 0].numpy() + 0.5, 0, 1)
    np.testing.assert_allclose((SH_C0 * back.sh0[:, 0].numpy() + 0.5)[theirs], colours[ours],
                               atol=half_byte)
    same_rotation(back.quats.numpy()[theirs], written.quats.numpy()[ours], atol=2 / 128)


@pytest.mark.parametrize("sh_degree", [0, 1, 3])
def test_an_spz_file_reads_back_within_its_quantisation(tmp_path, sh_degree):
    written = model(sh_degree)
    write_spz(written, tmp_path / "model.spz")
    back, up = read_model(tmp_path / "model.spz")
    assert up is None and back.sh_degree == sh_degree and len(back) == len(written)
    np.testing.assert_allclose(back.means.numpy(), written.means.numpy(), atol=2 ** -12)
    np.testing.assert_allclose(back.log_scales.numpy(), written.log_scales.numpy(),
                               atol=1 / 32 + 1e-6)
    np.testing.assert_allclose(back.opacities.numpy(), written.opacities.numpy(),
                               atol=0.5 / 255 + 1e-6)
    np.testing.assert_allclose(back.sh0.numpy(), written.sh0.numpy(),
                               atol=0.5 / (0.15 * 255) + 1e-6)  # colours: 255 steps of 1/0.15
    same_rotation(back.quats.numpy(), written.quats.numpy(), atol=2e-3)
    used = (sh_degree + 1) ** 2 - 1
    step = np.array([2 ** -4] * 3 + [2 ** -3] * 12)[:used, None]  # 5 bits, then 4, of 2
    assert np.all(np.abs(back.shN.numpy()[:, :used] - written.shN.numpy()[:, :used])
                  <= step / 2 + 2 / 256 + 1e-6)
    assert not back.shN[:, used:].any()


def unreadable(whole_spz: bytes) -> dict[str, bytes]:
    """Files no reader takes, by name."""
    return {"model.spz": b"not gzip at all",
            "cut.spz": whole_spz[:len(whole_spz) // 2],
            "model.splat": b"\x00" * 33,
            "empty.splat": b"",
            "model.ply": b"\x1f\x8b\x08\x00binary",
            "model.bin": b"ply\nformat ascii 1.0\nelement vertex 1\nend_header\n"}


def test_view_refuses_an_unreadable_model_in_one_line(tmp_path, capfd):
    write_spz(model(), tmp_path / "whole.spz")
    files = unreadable((tmp_path / "whole.spz").read_bytes())
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
        assert main(["view", str(tmp_path / name)]) == 2, name
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == len(files), err
    for line, name in zip(err, files):
        assert line.startswith(f"splatscale: error: {tmp_path / name}: "), line
        assert "Error" not in line, line  # no exception's name: a reason
    assert "not a readable .spz file" in err[0] and "gunzip" in err[1]
    assert "33 bytes is not a whole number of 32-byte splats" in err[2]
    assert "0 bytes" in err[3] and "does not begin with 'ply'" in err[4]
    assert "not a 3DGS PLY file (element 'vertex': row 0: early end-of-file)" in err[5]


def test_export_converts_any_model_file_keeping_its_up(tmp_path, capsys):
    model = random_model(30, dtype=torch.float32)
    write_ply(model, tmp_path / "model.ply", up=np.array([0.0, 0.0, 1.0]))
    assert main(["export", str(tmp_path / "model.ply"), "--format", "spz"]) == 0
    assert main(["export", str(tmp_path / "model.spz"), "--format", "ply", "-o",
                 str(tmp_path / "back.ply")]) == 0
    assert len(read_model(tmp_path / "back.ply").model) == 30
    assert main(["export", str(tmp_path / "model.ply"), "--format", "ply", "-o",
                 str(tmp_path / "copy.ply")]) == 0
    assert read_model(tmp_path / "copy.ply").up == pytest.approx([0.0, 0.0, 1.0])

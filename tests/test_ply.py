"""Model files: PLY round trip, a PLY written by another trainer, .splat export."""

import numpy as np
import pytest
import torch

from splatscale.data.colmap import read_colmap
from splatscale.errors import DataError
from splatscale.model.ply import ply_properties, read_ply, write_ply, write_splat
from splatscale.render import render
from tests.conftest import random_model, data_path


def test_write_then_read_is_identity(tmp_path):
    model = random_model(50, seed=1, dtype=torch.float32)
    write_ply(model, tmp_path / "m.ply")
    back = read_ply(tmp_path / "m.ply")
    assert back.sh_degree == 3
    for name, tensor in model.parameters().items():
        assert torch.equal(getattr(back, name), tensor), name


def test_inria_layout_is_channel_major(tmp_path):
    from plyfile import PlyData

    model = random_model(3, seed=2, dtype=torch.float32)
    write_ply(model, tmp_path / "m.ply")
    vertex = PlyData.read(str(tmp_path / "m.ply"))["vertex"]
    assert list(vertex.data.dtype.names) == ply_properties()
    # f_rest_{c * 15 + k} is coefficient k of colour channel c.
    assert vertex["f_rest_16"][1] == model.shN[1, 1, 1]
    assert vertex["opacity"][2] == model.opacity_logits[2]


def test_reads_and_renders_a_ply_from_another_trainer():
    model = read_ply(data_path("interop", "snowmiku_opensplat.ply"))
    assert len(model) == 25_784
    camera = read_colmap(data_path("snowmiku")).views[0].camera
    out = render(model, camera)
    assert out.rgb.shape == (371, 495, 3) and torch.isfinite(out.rgb).all()
    assert out.alpha.mean() > 0.5, "a trained model covers the view"


def test_missing_properties_are_named(tmp_path):
    from plyfile import PlyData, PlyElement

    records = np.zeros(4, dtype=[(n, "f4") for n in ply_properties() if n != "scale_1"])
    PlyData([PlyElement.describe(records, "vertex")]).write(str(tmp_path / "bad.ply"))
    with pytest.raises(DataError, match=r"bad.ply: missing PLY properties scale_1"):
        read_ply(tmp_path / "bad.ply")


def test_splat_export_has_32_bytes_per_gaussian(tmp_path):
    model = random_model(20, seed=3, dtype=torch.float32)
    write_splat(model, tmp_path / "m.splat")
    data = np.fromfile(tmp_path / "m.splat", dtype=[("position", "<f4", 3), ("scale", "<f4", 3),
                                                    ("rgba", "u1", 4), ("rotation", "u1", 4)])
    assert len(data) == 20
    assert set(map(tuple, np.round(data["position"], 5))) == \
        set(map(tuple, np.round(model.means.numpy(), 5)))


def test_export_keeps_extra_properties_or_says_which_it_dropped(tmp_path, capsys):
    """Another trainer's per-Gaussian values (here a float and a byte) stay in a PLY;
    the .splat format, which has no place for them, names them."""
    from numpy.lib import recfunctions
    from plyfile import PlyData, PlyElement

    from splatscale.cli import main

    write_ply(random_model(6, seed=3, dtype=torch.float32), tmp_path / "plain.ply")
    plain = PlyData.read(str(tmp_path / "plain.ply"))["vertex"].data
    extra = {"confidence": np.linspace(0, 1, 6, dtype="f4"), "label": np.arange(6, dtype="u1")}
    rows = recfunctions.append_fields(plain, list(extra), list(extra.values()), usemask=False)
    PlyData([PlyElement.describe(rows, "vertex")]).write(str(tmp_path / "rich.ply"))

    assert main(["export", str(tmp_path / "rich.ply"), "--format", "ply",
                 "-o", str(tmp_path / "out.ply")]) == 0
    out = PlyData.read(str(tmp_path / "out.ply"))["vertex"].data
    for name, values in extra.items():
        assert out.dtype[name] == values.dtype and np.array_equal(out[name], values), name
    for name, tensor in read_ply(tmp_path / "rich.ply").parameters().items():
        assert torch.equal(getattr(read_ply(tmp_path / "out.ply"), name), tensor), name

    assert main(["export", str(tmp_path / "rich.ply"), "--format", "splat"]) == 0
    assert "extra properties, dropped: confidence, label" in capsys.readouterr().err

"""Model files: PLY round trip, a PLY written by another trainer, .splat export, an
anti-aliased model's header comment."""

import numpy as np
import pytest
import torch

from splatscale.data.colmap import read_colmap
from splatscale.errors import DataError
from splatscale.model.ply import (ply_properties, read_ply, write_ply, write_ply_parts,
                                  write_splat)
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


@pytest.mark.parametrize("writer", ["whole", "parts"])
def test_an_antialiased_model_says_so_as_brush_does_and_reads_back_so(tmp_path, writer):
    from plyfile import PlyData

    model = random_model(8, seed=4, dtype=torch.float32)
    model.antialiased = True
    path = tmp_path / "m.ply"
    if writer == "whole":
        write_ply(model, path)
    else:
        write_ply_parts([model], len(model), path, antialiased=True)
    assert PlyData.read(str(path)).comments == ["SplatRenderMode: mip"]
    assert read_ply(path).antialiased
    model.antialiased = False
    write_ply(model, path)
    assert PlyData.read(str(path)).comments == [] and not read_ply(path).antialiased


@pytest.mark.parametrize("comments, antialiased", [
    ([], False), (["made elsewhere"], False),
    (["Exported from Brush", "SplatRenderMode: mip"], True),   # Brush's
    (["SplatRenderMode: default"], False),
    (["antialiased 1"], True), (["antialiased 0"], False),     # Postshot's
    (["antialiased 1", "SplatRenderMode: default"], False),    # the last holds
])
def test_other_tools_render_mode_comments_are_read(tmp_path, comments, antialiased):
    from plyfile import PlyData, PlyElement

    rows = np.zeros(3, dtype=[(name, "f4") for name in ply_properties()])
    PlyData([PlyElement.describe(rows, "vertex")], comments=comments).write(
        str(tmp_path / "m.ply"))
    assert read_ply(tmp_path / "m.ply").antialiased is antialiased


@pytest.mark.parametrize("comment", ["SplatRenderMode: 2dgs", "SplatRenderMode:",
                                     "antialiased yes", "antialiased 1 0"])
def test_a_render_mode_this_cannot_render_is_refused_naming_the_file(tmp_path, comment):
    from plyfile import PlyData, PlyElement

    rows = np.zeros(3, dtype=[(name, "f4") for name in ply_properties()])
    PlyData([PlyElement.describe(rows, "vertex")], comments=[comment]).write(
        str(tmp_path / "bad.ply"))
    with pytest.raises(DataError, match=rf"bad.ply: its header's 'comment {comment}' is no "
                                        r"render mode this reads"):
        read_ply(tmp_path / "bad.ply")


def test_export_keeps_antialiasing_or_says_the_format_cannot(tmp_path, capsys):
    from splatscale.cli import main
    from splatscale.model.spz import read_spz

    model = random_model(6, seed=3, dtype=torch.float32)
    model.antialiased = True
    write_ply(model, tmp_path / "aa.ply")
    assert main(["export", str(tmp_path / "aa.ply"), "--format", "spz"]) == 0
    assert read_spz(tmp_path / "aa.spz").antialiased
    assert main(["export", str(tmp_path / "aa.spz"), "--format", "ply",
                 "-o", str(tmp_path / "back.ply")]) == 0
    assert read_ply(tmp_path / "back.ply").antialiased
    capsys.readouterr()
    assert main(["export", str(tmp_path / "aa.ply"), "--format", "splat"]) == 0
    assert "no place for anti-aliased splats" in capsys.readouterr().err
    write_ply(random_model(6, seed=3, dtype=torch.float32), tmp_path / "plain.ply")
    assert main(["export", str(tmp_path / "plain.ply"), "--format", "splat"]) == 0
    assert "anti-aliased" not in capsys.readouterr().err

"""Which tiles (binning) and 8x4 blocks (the compositing kernels) a splat may reach,
against its sigma at every pixel centre in float64: none where alpha can reach 1/255
may be left out, and few others may be let in."""

from __future__ import annotations

import math

import pytest
import torch

from splatscale.render import compositing_kernels
from splatscale.render.binning import bin_tiles
from splatscale.render.compositing_kernels import BLOCK_H, BLOCK_W, BLOCKS_X

WIDTH, HEIGHT, TILE = 90, 70, 16


def splats(dtype, seed=0, n=150):
    """Round, tiny, huge and needle-thin splats at every angle, some of them faint."""
    g = torch.Generator().manual_seed(seed)
    means2d = torch.rand(n, 2, generator=g, dtype=torch.float64) * torch.tensor(
        [WIDTH + 20.0, HEIGHT + 20.0], dtype=torch.float64) - 10
    angle = torch.rand(n, generator=g, dtype=torch.float64) * math.pi
    major = torch.exp(torch.rand(n, generator=g, dtype=torch.float64) * 7 - 1)
    minor = torch.where(torch.arange(n) % 3 == 0, torch.full((n,), 0.3, dtype=torch.float64),
                        major * torch.rand(n, generator=g, dtype=torch.float64))
    c, s = torch.cos(angle), torch.sin(angle)
    cov = torch.stack([c * c * major + s * s * minor, c * s * (major - minor),
                       s * s * major + c * c * minor], 1) + torch.tensor([0.3, 0.0, 0.3],
                                                                          dtype=torch.float64)
    det = cov[:, 0] * cov[:, 2] - cov[:, 1] ** 2
    conics = torch.stack([cov[:, 2] / det, -cov[:, 1] / det, cov[:, 0] / det], 1)
    opacities = torch.rand(n, generator=g, dtype=torch.float64) * 0.99 + 0.005
    sigmas = torch.sqrt(2 * torch.log(opacities * 255))
    radii = torch.ceil(sigmas[:, None] * torch.sqrt(cov[:, [0, 2]])).to(torch.int32)
    return means2d.to(dtype), conics.to(dtype), opacities.to(dtype), radii


def sigma_at_pixels(means2d, conics):
    """[n, HEIGHT, WIDTH]: each splat's sigma at each pixel centre, in float64."""
    means2d, conics = means2d.double(), conics.double()
    ys, xs = torch.meshgrid(torch.arange(HEIGHT, dtype=torch.float64) + 0.5,
                            torch.arange(WIDTH, dtype=torch.float64) + 0.5, indexing="ij")
    dx, dy = means2d[:, 0, None, None] - xs, means2d[:, 1, None, None] - ys
    a, b, c = (conics[:, i, None, None] for i in range(3))
    return 0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy


def reached_cells(reached, cell_w, cell_h):
    """[n, rows, columns]: whether any pixel of each cell (tile or block) is reached."""
    n = reached.shape[0]
    rows, columns = -(-HEIGHT // cell_h), -(-WIDTH // cell_w)
    padded = torch.zeros(n, rows * cell_h, columns * cell_w, dtype=torch.bool)
    padded[:, :HEIGHT, :WIDTH] = reached
    return padded.reshape(n, rows, cell_h, columns, cell_w).any(4).any(2)


def check(let_in, needed, what, needless_share):
    """Every cell ``needed`` is let in, and at most ``needless_share`` of that many more."""
    missing = needed & ~let_in
    assert not missing.any(), f"{int(missing.sum())} {what} reached but left out"
    extra = int((let_in & ~needed).sum())
    assert extra <= needless_share * int(needed.sum()), (
        f"{extra} of {int(let_in.sum())} {what} needless")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", [0, 1])
def test_binning_keeps_every_tile_a_splat_reaches_and_few_more(dtype, seed):
    means2d, conics, opacities, radii = splats(dtype, seed)
    reached = sigma_at_pixels(means2d, conics) <= torch.log(opacities.double() * 255)[:, None,
                                                                                       None]
    needed = reached_cells(reached, TILE, TILE)
    bins = bin_tiles(means2d, radii, torch.arange(1.0, len(means2d) + 1), torch.arange(
        len(means2d)), WIDTH, (0, HEIGHT), conics, opacities)
    let_in = torch.zeros_like(needed)
    tile_of = torch.repeat_interleave(torch.arange(len(bins.offsets) - 1), bins.offsets.diff())
    let_in[bins.splat_ids, tile_of // bins.tiles_x, tile_of % bins.tiles_x] = True
    check(let_in, needed, "tiles", 0.035)
    boxes_only = bin_tiles(means2d, radii, torch.arange(1.0, len(means2d) + 1),
                           torch.arange(len(means2d)), WIDTH, (0, HEIGHT))
    assert len(bins.splat_ids) < 0.9 * len(boxes_only.splat_ids), "needles miss tiles of their box"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_blocks_reached_hold_every_block_a_splat_reaches_and_few_more(dtype):
    means2d, conics, opacities, radii = splats(dtype, seed=2)
    reached = sigma_at_pixels(means2d, conics) <= torch.log(opacities.double() * 255)[:, None,
                                                                                       None]
    needed = reached_cells(reached, BLOCK_W, BLOCK_H)
    n = len(means2d)
    bins = bin_tiles(means2d, radii, torch.arange(1.0, n + 1), torch.arange(n), WIDTH,
                     (0, HEIGHT), conics, opacities)
    masks = bins.blocks
    tile_of = torch.repeat_interleave(torch.arange(len(bins.offsets) - 1), bins.offsets.diff())
    let_in = torch.zeros_like(needed)
    for block in range(compositing_kernels.BLOCKS):
        row = tile_of // bins.tiles_x * (TILE // BLOCK_H) + block // BLOCKS_X
        column = tile_of % bins.tiles_x * (TILE // BLOCK_W) + block % BLOCKS_X
        hit = (masks >> block & 1).bool() & (row < needed.shape[1]) & (column < needed.shape[2])
        let_in[bins.splat_ids[hit], row[hit], column[hit]] = True
    check(let_in, needed, "blocks", 0.02)

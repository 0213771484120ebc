"""Tile binning against a per-splat enumeration of the tiles each box covers."""

import math

import numpy as np
import pytest
import torch

from splatscale.render.binning import (SHORT_RUN, TILE_SIZE, _by_key, _first_at_least,
                                       _order_ties_by_key, bin_tiles)


def test_bins_hold_each_tile_splats_nearest_first():
    g = torch.Generator().manual_seed(0)
    n, width, height = 300, 75, 53
    means2d = torch.rand(n, 2, generator=g) * torch.tensor([width + 40.0, height + 40.0]) - 20
    radii = torch.randint(0, 30, (n, 2), generator=g, dtype=torch.int32)
    depths = torch.rand(n, generator=g) * 10 + 0.1
    rows = (7, 45)
    bins = bin_tiles(means2d, radii, depths, torch.arange(n), width, rows)

    tiles_x = math.ceil(width / TILE_SIZE)
    row0, row1 = rows[0] // TILE_SIZE, math.ceil(rows[1] / TILE_SIZE)
    expected = {t: [] for t in range(tiles_x * (row1 - row0))}
    for i in torch.argsort(depths).tolist():
        if (radii[i] <= 0).any():
            continue
        (mx, my), (rx, ry) = means2d[i].tolist(), radii[i].tolist()
        for ty in range(max(row0, math.floor((my - ry) / 16)),
                        min(row1, math.ceil((my + ry) / 16))):
            for tx in range(max(0, math.floor((mx - rx) / 16)),
                            min(tiles_x, math.ceil((mx + rx) / 16))):
                expected[(ty - row0) * tiles_x + tx].append(i)
    assert bins.tile_row0 == row0 and bins.tiles_x == tiles_x
    for tile, splats in expected.items():
        got = bins.splat_ids[bins.offsets[tile]:bins.offsets[tile + 1]].tolist()
        assert got == splats, f"tile {tile}"


def test_equal_depths_are_ordered_by_key_not_storage():
    """Three splats at one depth on one tile, stored in the reverse of their keys' order."""
    means2d = torch.full((4, 2), 8.0)
    radii = torch.full((4, 2), 3, dtype=torch.int32)
    depths = torch.tensor([2.0, 2.0, 1.0, 2.0])
    keys = torch.tensor([30, 20, 99, 10])
    bins = bin_tiles(means2d, radii, depths, keys, 16, (0, 16))
    assert bins.splat_ids.tolist() == [2, 3, 1, 0]
    permuted = [3, 0, 2, 1]
    again = bin_tiles(means2d[permuted], radii[permuted], depths[permuted], keys[permuted], 16,
                      (0, 16))
    assert keys[permuted][again.splat_ids].tolist() == keys[bins.splat_ids].tolist()


def test_runs_of_equal_depths_sort_stably_by_key():
    """Runs of every length up to 40 and one of 5,000, duplicate keys among them, alone
    and among runs of other depths (one of 700): the order numpy's stable sort by key
    gives."""
    g = np.random.default_rng(0)
    for count in [*range(1, 41), 5000]:
        run = g.permutation(10 * count)[:count]
        keys = g.integers(0, max(2, count // 3), size=10 * count)
        want = run[np.argsort(keys[run], kind="stable")]
        assert np.array_equal(_by_key(run, keys), want), count
    # Runs across the kernel's parallel chunks (256 splats), one across several.
    lengths = np.insert(g.integers(1, 2 * SHORT_RUN, size=300), 150, 700)
    depth_bits = np.repeat(np.arange(len(lengths), dtype=np.int32), lengths)
    order = g.permutation(len(depth_bits))
    keys = g.integers(0, 50, size=len(depth_bits))
    want = order[np.lexsort((keys[order], depth_bits))]  # by depth, then key, stably
    _order_ties_by_key(depth_bits, keys, order)
    assert np.array_equal(order, want)


def test_the_first_index_at_least_a_value_is_numpys_searchsorted():
    ascending = np.array([0, 0, 3, 3, 3, 7, 12], np.int64)
    for value in [-1.0, 0.0, 0.5, 3.0, 3.2, 7.0, 11.9, 12.0, 12.5]:
        assert _first_at_least(ascending, value) == np.searchsorted(ascending, value), value
    assert _first_at_least(np.empty(0, np.int64), 1.0) == 0


def test_conics_and_opacities_of_another_dtype_are_refused():
    """Binning reads them in means2d's dtype: a wider conic would be rounded first."""
    means2d, radii = torch.full((2, 2), 8.0), torch.full((2, 2), 3, dtype=torch.int32)
    conics = torch.tensor([[0.5, 0.0, 0.5]] * 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="one dtype"):
        bin_tiles(means2d, radii, torch.ones(2), torch.arange(2), 16, (0, 16), conics,
                  torch.ones(2, dtype=torch.float64))

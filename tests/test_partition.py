"""The distributed engine's partition, routing and cost model, against brute force."""

from __future__ import annotations

import math

import pytest
import torch

from splatscale.engine.distributed.cost_model import FittedRowCost, RowCost
from splatscale.engine.distributed.exchange import HALO, render_rows, rendered_workload, route
from splatscale.engine.distributed.partition import (bands_per_rank, cut, partition,
                                                     row_costs, tile_row_work)
from splatscale.render import project
from splatscale.render.conventions import TILE_SIZE
from tests.conftest import orbit_cameras, random_model


@pytest.fixture(scope="module")
def batch():
    cameras = orbit_cameras(3, 61, 45) + orbit_cameras(1, 40, 70)  # sizes not 16-multiples
    with torch.no_grad():
        splats = project(random_model(400, seed=3), cameras)
    return splats, cameras


def test_tile_row_work_counts_every_intersection(batch):
    splats, cameras = batch
    expected = torch.zeros(len(cameras), max(-(-c.height // TILE_SIZE) for c in cameras),
                           dtype=torch.float64)
    for i in range(len(splats)):
        camera = cameras[int(splats.camera_ids[i])]
        x, y = splats.means2d[i].tolist()
        rx, ry = splats.radii[i].tolist()
        for tile_y in range(-(-camera.height // TILE_SIZE)):
            for tile_x in range(-(-camera.width // TILE_SIZE)):
                # The splat's tile box: tiles from floor((c - r) / 16) to ceil((c + r) / 16).
                if (math.floor((x - rx) / TILE_SIZE) <= tile_x < math.ceil((x + rx) / TILE_SIZE)
                        and math.floor((y - ry) / TILE_SIZE) <= tile_y
                        < math.ceil((y + ry) / TILE_SIZE)):
                    expected[int(splats.camera_ids[i]), tile_y] += 1
    assert torch.equal(tile_row_work(splats, cameras), expected)


@pytest.mark.parametrize("world", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("cost", [RowCost(), RowCost(1.0, 0.01), None])
def test_partition_cuts_equal_costs_covering_every_row_once(batch, world, cost):
    splats, cameras = batch
    work = tile_row_work(splats, cameras)
    bands = partition(work, cameras, world, cost)
    covered = [torch.zeros(c.height, dtype=torch.int64) for c in cameras]
    for rank_bands in bands:
        assert len({b.camera for b in rank_bands}) == len(rank_bands)  # one band per image
        for band in rank_bands:
            covered[band.camera][band.rows[0]:band.rows[1]] += 1
    assert all(torch.equal(c, torch.ones_like(c)) for c in covered)

    costs = (row_costs(work, cameras, cost) if cost is not None
             else torch.ones(sum(c.height for c in cameras), dtype=torch.float64))
    starts = torch.tensor([0] + [c.height for c in cameras]).cumsum(0)
    rank_costs = [sum(float(costs[starts[b.camera] + b.rows[0]:starts[b.camera] + b.rows[1]].sum())
                      for b in rank_bands) for rank_bands in bands]
    # Cuts fall on rows: each range is off the ideal by at most one row's cost.
    assert max(abs(c - float(costs.sum()) / world) for c in rank_costs) <= float(costs.max())


def test_cut_boundaries_are_ordered_and_complete():
    costs = torch.tensor([0.0, 5.0, 0.0, 0.0, 1.0, 1.0, 0.0, 3.0], dtype=torch.float64)
    for world in range(1, 10):
        boundaries = cut(costs, world)
        assert boundaries[0] == 0 and boundaries[-1] == len(costs)
        assert boundaries == sorted(boundaries) and len(boundaries) == world + 1


@pytest.mark.parametrize("world", [2, 3, 7])
def test_route_sends_each_splat_to_exactly_the_ranks_it_reaches(batch, world):
    splats, cameras = batch
    bands = bands_per_rank(cut(row_costs(tile_row_work(splats, cameras), cameras), world),
                           cameras)
    send, counts = route(splats, bands, cameras)
    sent = send.split(counts)
    for rank, rank_bands in enumerate(bands):
        expected = []
        for i in range(len(splats)):
            c = int(splats.camera_ids[i])
            y, r = float(splats.means2d[i, 1]), int(splats.radii[i, 1])
            for band in rank_bands:
                y0, y1 = render_rows(band, cameras[c])
                # Some pixel centre of the rendered rows inside the box's rows.
                if band.camera == c and y - r <= y1 - 0.5 and y + r >= y0 + 0.5:
                    expected.append(i)
        assert sorted(sent[rank].tolist()) == expected


def test_render_rows_widen_bands_by_the_halo_inside_the_image(batch):
    _, cameras = batch
    bands = bands_per_rank(cut(torch.ones(sum(c.height for c in cameras)), 6), cameras)
    for band in (b for rank_bands in bands for b in rank_bands):
        y0, y1 = render_rows(band, cameras[band.camera])
        assert y0 == max(0, band.rows[0] - HALO)
        assert y1 == min(cameras[band.camera].height, band.rows[1] + HALO)


def test_rendered_workload_counts_the_rows_a_rank_renders(batch):
    splats, cameras = batch
    work = tile_row_work(splats, cameras)
    bands = partition(work, cameras, 3)
    for rank_bands in bands:
        pixels, intersections = rendered_workload(work, rank_bands, cameras)
        rows = [render_rows(b, cameras[b.camera]) for b in rank_bands]
        assert pixels == sum((y1 - y0) * cameras[b.camera].width
                             for b, (y0, y1) in zip(rank_bands, rows))
        shares = sum(float(work[b.camera, y // TILE_SIZE])
                     / min(TILE_SIZE, cameras[b.camera].height - y // TILE_SIZE * TILE_SIZE)
                     for b, (y0, y1) in zip(rank_bands, rows) for y in range(y0, y1))
        assert intersections == pytest.approx(shares, rel=1e-12)


def test_fitted_cost_recovers_the_coefficients_from_noisy_times():
    generator = torch.Generator().manual_seed(0)
    fitted = FittedRowCost()
    for _ in range(20):
        pixels = torch.rand(3, generator=generator, dtype=torch.float64) * 1e5
        intersections = torch.rand(3, generator=generator, dtype=torch.float64) * 1e5
        noise = 1 + 0.02 * torch.randn(3, generator=generator, dtype=torch.float64)
        seconds = (2e-7 * pixels + 1e-6 * intersections) * noise
        fitted.add(torch.stack([pixels, intersections, seconds], 1))
    assert fitted.current.pixel / fitted.current.intersection == pytest.approx(0.2, rel=0.05)


def test_fitted_cost_keeps_its_coefficients_until_the_reports_make_sense():
    fitted = FittedRowCost(RowCost(0.3, 1.0))
    idle = torch.tensor([[0.0, 0.0, 0.0]] * 20, dtype=torch.float64)
    fitted.add(idle)  # ranks that rendered nothing are no evidence
    assert fitted.current == RowCost(0.3, 1.0) and not fitted.reports
    # More intersections taking less time: a negative cost, so noise; nothing changes.
    fitted.add(torch.tensor([[1e4, 1e4 * k, 1.0 / k] for k in range(1, 20)],
                            dtype=torch.float64))
    assert fitted.current == RowCost(0.3, 1.0)

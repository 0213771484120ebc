"""Distributed training at many ranks, predicted in one process; prints one JSON line.

``predicted``: a 1M-Gaussian scene made from the garden splats in the test
data (its 138,766 points, each copied with a jitter of its nearest-neighbour
distance up to ``--gaussians``; 3DGS initialisation), batches of B = W views
(the three garden cameras, each moved by up to 2 % of its distance to the
scene's centre), for W in ``--worlds``. For every rank, with the engine's own
sharding, partition and routing code, but no ranks spawned:

- ``sent_bytes`` / ``received_bytes``: the sparse exchange's traffic per step
  (splats there, their gradients back), mean and max over the ranks;
- ``imbalance``: max / mean of the ranks' estimated costs (``a`` per pixel,
  ``b`` per intersection, fitted on the measured runs below);
- ``memory_bytes``: what a rank holds: its shard's parameters, gradients, Adam
  moments, keys and statistics, the exchanged rows with their gradients, and
  the render buffers (a gradient row per tile intersection, a few values per
  pixel). Tensor bytes, not the process' RSS.

``checked``: W = 2 and W = 3 gloo ranks on snowmiku take ``--steps`` steps of
B = W (forward and backward, no update, so the model stays the one the
prediction sees) with the fixed default cost cut. Each measured quantity is
set beside its prediction from the same batches; ``within_10_percent`` says
whether every one agrees to 10 %.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numba
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from splatscale.data.cameras import Camera
from splatscale.engine import TrainView
from splatscale.engine.composed import ComposedEngine
from splatscale.engine.distributed.cost_model import FittedRowCost, RowCost
from splatscale.engine.distributed.exchange import FLOAT_COLUMNS, rendered_workload, route
from splatscale.engine.distributed.partition import partition, tile_row_work
from splatscale.engine.factory import RankOptions, make_engine, shard_of
from splatscale.model.gaussians import GaussianModel
from splatscale.render import project
from splatscale.render.compositing_kernels import PACKED_WIDTH
from splatscale.strategy import default

from report import emit
from scenes import garden_scene, moved_views, snowmiku_init

FLOAT_BYTES = 4  # float32 training
INT_COLUMNS = 4  # radii (2), key, camera: int64 each
# A splat's row on its way to a renderer, and its gradient on the way back.
FORWARD_BYTES = FLOAT_BYTES * sum(FLOAT_COLUMNS.values()) + 8 * INT_COLUMNS
GRADIENT_BYTES = FLOAT_BYTES * sum(FLOAT_COLUMNS.values())
# One packed row per intersection (its gradient row written over it) and its splat id;
# per pixel: rgb, transmittance and their gradients, and the last contributor's index
# (training renders no depth).
INTERSECTION_BYTES = FLOAT_BYTES * PACKED_WIDTH + 8
PIXEL_BYTES = FLOAT_BYTES * 2 * 4 + 4


def state_bytes(engine: ComposedEngine) -> int:
    """Bytes of what a rank keeps between steps (gradients counted: backward makes them)."""
    rows = engine.row_set
    for name in (default.GRAD_SUM, default.COUNT):  # 3DGS's statistics, there once observed
        rows.state_zeros(name)
    # The gradients, then the parameters, keys, Adam moments and statistics.
    tensors = [*rows.params.values(), *rows.tensors().values()]
    return sum(t.nbytes for t in tensors)


def traffic(sent_rows: float, received_rows: float) -> tuple[float, float]:
    """A rank's bytes sent and received: rows out and their gradients in, and back."""
    return (FORWARD_BYTES * sent_rows + GRADIENT_BYTES * received_rows,
            FORWARD_BYTES * received_rows + GRADIENT_BYTES * sent_rows)


def memory(state: float, rows_out: float, rows_in: float, pixels: float,
           intersections: float) -> float:
    """A rank's state, its exchanged rows (its own included) and its render buffers."""
    rows = (FORWARD_BYTES + GRADIENT_BYTES) * (rows_out + rows_in)
    return state + rows + INTERSECTION_BYTES * intersections + PIXEL_BYTES * pixels


def step_record(rows: torch.Tensor, workload: list[tuple[float, float]], seconds: list[float],
                states: list[float]) -> dict[str, list[float]]:
    """One step's per-rank quantities; ``rows[r, k]`` splats go from rank r to rank k."""
    own = rows.diagonal()
    sent, received = zip(*(traffic(float(o), float(i)) for o, i
                           in zip(rows.sum(1) - own, rows.sum(0) - own)))
    return {"sent_bytes": list(sent), "received_bytes": list(received),
            "workload": workload, "seconds": seconds,
            "memory_bytes": [memory(s, float(o), float(i), p, n) for s, o, i, (p, n)
                             in zip(states, rows.sum(1), rows.sum(0), workload)]}


def predict_step(shards: list[GaussianModel], cameras: list[Camera], cut_cost: RowCost,
                 per_gaussian: float) -> dict[str, list[float]]:
    """What each rank sends, receives, renders and holds in one step."""
    world = len(shards)
    with torch.no_grad():
        splats = [project(shard, cameras) for shard in shards]
    work = sum(tile_row_work(s, cameras) for s in splats)
    bands = partition(work, cameras, world, cut_cost)
    rows = torch.tensor([route(s, bands, cameras)[1] for s in splats], dtype=torch.float64)
    workload = [rendered_workload(work, rank_bands, cameras) for rank_bands in bands]
    return step_record(rows, workload, [], [per_gaussian * len(s) for s in shards])


def bytes_per_gaussian(model: GaussianModel) -> float:
    sample = shard_of(model, 0, max(1, len(model) // 1000))
    return state_bytes(make_engine(sample, 1, torch.zeros(3))) / len(sample)


def imbalance(costs: list[float]) -> float:
    return max(costs) / statistics.mean(costs)


def estimated(record: dict, cost: RowCost) -> list[float]:
    return [cost.pixel * p + cost.intersection * i for p, i in record["workload"]]


def summary(steps: list[dict], cost: RowCost) -> dict:
    """Means over the steps: traffic and memory (mean and max over the ranks), and the
    imbalance of the ranks' estimated costs."""
    out = {name: {"mean": round(statistics.mean(statistics.mean(s[name]) for s in steps)),
                  "max": round(statistics.mean(max(s[name]) for s in steps))}
           for name in ("sent_bytes", "received_bytes", "memory_bytes")}
    out["imbalance"] = round(statistics.mean(imbalance(estimated(s, cost)) for s in steps), 4)
    return out


def batches(views: int, size: int, count: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randperm(views, generator=generator)[:size].tolist() for _ in range(count)]


def measured_rank(rank: int, world: int, init_file: str, steps: int, out_file: str) -> None:
    """One gloo rank: ``steps`` steps of the real engine, each rank's traffic, time,
    workload and state gathered on rank 0 (the first step, warming up, is dropped)."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    store, model = snowmiku_init()
    engine = make_engine(shard_of(model, rank, world), world, torch.zeros(3),
                         ranks=RankOptions(fixed_cost=RowCost()))
    records = []
    for ids in batches(len(store), world, steps + 1):
        cameras = [store.camera(i) for i in ids]
        bands = engine.forward_backward([TrainView(c, store.as_float(i))
                                         for c, i in zip(cameras, ids)]).diagnostics["bands"]
        with torch.no_grad():
            counts = route(project(engine.model, cameras), bands, cameras)[1]
        rows = torch.zeros(world, world, dtype=torch.float64)
        rows[rank] = torch.tensor(counts, dtype=torch.float64)
        states = torch.zeros(world, dtype=torch.float64)
        states[rank] = state_bytes(engine)
        dist.all_reduce(rows)
        dist.all_reduce(states)
        reports = list(engine.compute.fitted_cost.reports)[-world:]
        records.append(step_record(rows, [(p, i) for p, i, _ in reports],
                                   [t for _, _, t in reports], states.tolist()))
        for parameter in engine.model.parameters().values():
            parameter.grad = None  # no update: the model stays the one predicted
    if rank == 0:
        torch.save(records[1:], out_file)
    dist.destroy_process_group()


def measure(world: int, steps: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "records.pt"
        mp.spawn(measured_rank, args=(world, str(Path(folder) / "init"), steps, str(out)),
                 nprocs=world)
        return torch.load(out, weights_only=False)


def predicted_like(world: int, steps: int) -> list[dict]:
    """The one-process prediction of ``measure(world, steps)``."""
    store, model = snowmiku_init()
    shards = [shard_of(model, r, world) for r in range(world)]
    per_gaussian = bytes_per_gaussian(model)
    return [predict_step(shards, [store.camera(i) for i in ids], RowCost(), per_gaussian)
            for ids in batches(len(store), world, steps + 1)[1:]]


def agreement(measured: list[dict], predicted: list[dict], cost: RowCost) -> dict:
    """Each quantity measured and predicted, means over steps and ranks."""
    out = {}
    for name in ("sent_bytes", "received_bytes", "memory_bytes"):
        out[name] = [statistics.mean(statistics.mean(s[name]) for s in runs)
                     for runs in (measured, predicted)]
    out["imbalance"] = [statistics.mean(imbalance(s["seconds"]) for s in measured),
                        statistics.mean(imbalance(estimated(s, cost)) for s in predicted)]
    return {name: {"measured": round(m, 4), "predicted": round(p, 4),
                   "relative_error": round(abs(p - m) / m, 4)}
            for name, (m, p) in out.items()}


def fit(records: list[dict]) -> RowCost:
    fitted = FittedRowCost()
    for record in records:
        fitted.add(torch.tensor([[p, i, t] for (p, i), t
                                 in zip(record["workload"], record["seconds"])],
                                dtype=torch.float64))
    return fitted.current


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gaussians", type=int, default=1_000_000)
    parser.add_argument("--worlds", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--steps", type=int, default=10, help="measured steps per world")
    parser.add_argument("--predicted-steps", type=int, default=2)
    args = parser.parse_args()

    measured = {w: measure(w, args.steps) for w in (2, 3)}
    cost = fit([record for runs in measured.values() for record in runs])
    checked = {w: agreement(runs, predicted_like(w, args.steps), cost)
               for w, runs in measured.items()}
    model, cameras = garden_scene(args.gaussians)
    per_gaussian = bytes_per_gaussian(model)
    generator = torch.Generator().manual_seed(0)
    centre = model.means.mean(0)
    predicted = {}
    for world in args.worlds:
        shards = [shard_of(model, r, world) for r in range(world)]
        steps = [predict_step(shards, moved_views(cameras, centre, world, generator), cost,
                              per_gaussian) for _ in range(args.predicted_steps)]
        predicted[world] = summary(steps, cost)
    within = all(v["relative_error"] <= 0.10 for c in checked.values() for v in c.values())
    emit({"gaussians": len(model), "batch_size": "W",
                      "cost": {"pixel": cost.pixel, "intersection": cost.intersection},
                      "bytes_per_gaussian": per_gaussian, "predicted": predicted,
                      "checked": checked, "within_10_percent": within})


if __name__ == "__main__":
    main()

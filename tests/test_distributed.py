"""The distributed engine on gloo equals the single process (DESIGN, invariant 2)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numba
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor

from splatscale.data.images import pixels_as_float
from splatscale.demo import demo_scene
from splatscale.engine import TrainView
from splatscale.engine.distributed.cost_model import RowCost
from splatscale.engine.distributed.exchange import render_rows
from splatscale.engine.factory import RankOptions, make_engine, shard_of
from splatscale.model.ply import read_ply
from splatscale.strategy.default import GradientNorms
from splatscale.train.checkpoint import KEYS, load_checkpoint, save_checkpoint
from splatscale.train.config import TrainConfig
from tests.conftest import TRAIN_STEPS as STEPS
from tests.conftest import (HANG_GUARD, absgrad_run, capped_run, densifying_run,
                            densifying_scene, mcmc_run, state_by_key, wait_until)

# 3DGS under a budget that binds, MCMC, and 3DGS with AbsGS's statistic (whose bands
# keep each pixel's gradient whole): each equal to the single process too.
STRATEGY_RUNS = {"capped": capped_run, "mcmc": mcmc_run, "absgrad": absgrad_run}


def gather_rows(tensor: Tensor) -> Tensor:
    """Every rank's rows of ``tensor``, concatenated in rank order, on every rank."""
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, torch.tensor([tensor.shape[0]]))
    most = max(int(s) for s in sizes)
    padded = tensor.new_zeros((most, *tensor.shape[1:]))
    padded[:tensor.shape[0]] = tensor
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded)
    return torch.cat([part[:int(size)] for part, size in zip(parts, sizes)])


def by_key(keys, tensors: dict) -> dict:
    order = torch.argsort(keys)
    return {"keys": keys[order], **{n: t[order] for n, t in tensors.items()}}


def ranks_engine(shard, batch_size: int, background: Tensor, **options):
    """This rank's engine over its ``shard``, the step computed by the ranks together."""
    return make_engine(shard, batch_size, background, ranks=RankOptions(**options))


def step_state(engine, keys) -> dict:
    return by_key(keys, engine.rows.gradients())


# What a checkpoint needs of the Trainer, as a Trainer of no step holds it; these tests
# save engines alone.
TRAINER_STATE = {"images_seen": 0, "steps": 0, "sh_degree": 0, "train_seconds": 0.0,
                 "order": torch.Generator().get_state(), "queue": [],
                 "config": TrainConfig().to_dict(), "scene": "", "eval_split": False}
assert set(TRAINER_STATE) == set(KEYS["trainer"])


def join(rank: int, world: int, init_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    torch.set_num_threads(1)
    numba.set_num_threads(1)


def save(engine, path: Path, images: int) -> None:
    save_checkpoint(path, {**TRAINER_STATE, "images_seen": images, "steps": images},
                    engine.state_dict(), engine.shard(), writes=engine.shard()[0] == 0)


def whole_state_saved(path: Path) -> dict:
    return load_checkpoint(path)[1]


def recording_reads(views: list[TrainView]) -> tuple[list[TrainView], list, list[TrainView]]:
    """``views`` whose targets, as uint8 pixels, are read when asked; the list of what
    was read: (view, rows) pairs, rows None for a whole image; and the same pixels'
    values given whole, in float64."""
    reads = []
    pixels = [(v.target * 255).round().to(torch.uint8) for v in views]

    def reader(index: int):
        def read(rows):
            reads.append((index, rows))
            return pixels[index] if rows is None else pixels[index][rows[0]:rows[1]]
        return read
    return ([TrainView(v.camera, read=reader(i)) for i, v in enumerate(views)], reads,
            [TrainView(v.camera, pixels_as_float(p).double()) for v, p in zip(views, pixels)])


def run_rank(rank: int, world: int, init_file: str, out_file: str) -> None:
    join(rank, world, init_file)
    views, model = densifying_scene()
    results = {"steps": {}}
    for batch_size in (1, 4):
        engine = ranks_engine(shard_of(model, rank, world), batch_size, torch.zeros(3))
        result = engine.forward_backward(views[:batch_size], GradientNorms())
        grads = {n: gather_rows(g) for n, g in engine.rows.gradients().items()}
        # Views read as pixels, rows alone, against the same values given whole.
        batch, reads, given = recording_reads(views[:batch_size])
        read_and_given = [ranks_engine(shard_of(model, rank, world), batch_size,
                                       torch.zeros(3)).forward_backward(b, GradientNorms())
                          for b in (batch, given)]
        assert read_and_given[0].loss == read_and_given[1].loss
        read_bands = read_and_given[0].diagnostics["bands"]
        results["steps"][batch_size] = (result.loss,
                                        by_key(gather_rows(engine.model.keys), grads),
                                        result.diagnostics["bands"], (reads, read_bands))
    engine = ranks_engine(shard_of(model, rank, world), 2, torch.zeros(3),
                          max_imbalance=1.0)  # rebalance after every densification
    results["losses"] = densifying_run(engine, views)
    for name, run in STRATEGY_RUNS.items():
        # Bands cut by a fixed cost, not one fitted to this machine's timings: a strategy
        # densifies by thresholds, and rows summed in another order may tip a Gaussian
        # on one across it, so the verdict would depend on the machine's speed.
        strategy_engine = ranks_engine(shard_of(model, rank, world), 2, torch.zeros(3),
                                       fixed_cost=RowCost(), max_imbalance=1.0)
        losses = run(strategy_engine, views)
        results[name] = (losses, {n: gather_rows(t.detach()) for n, t in
                          strategy_engine.model.parameters().items()},
                         gather_rows(strategy_engine.model.keys))
    results["shards"] = gather_rows(torch.tensor([len(engine.model)]))
    results["render"] = engine.render(views[1].camera)
    results["parts"] = [part.means for part in engine.model_parts()]  # rank 0's view
    checkpoint = Path(out_file).with_name("checkpoint.pt")
    save(engine, checkpoint, STEPS)
    dist.barrier()
    if rank == 0:
        results["state"] = whole_state_saved(checkpoint)
        torch.save(results, out_file)
    dist.destroy_process_group()


def resume_rank(rank: int, world: int, init_file: str, checkpoint: str, steps: range) -> None:
    """Continue the saved run at this world size for ``steps``, then save it."""
    join(rank, world, init_file)
    views, model = densifying_scene()
    engine = ranks_engine(shard_of(model, rank, world), 2, torch.zeros(3))
    engine.load_state_dict(load_checkpoint(Path(checkpoint), engine.shard())[1])
    densifying_run(engine, views, steps)
    save(engine, Path(checkpoint), steps.stop)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def single_process():
    views, model = densifying_scene()
    steps = {}
    for batch_size in (1, 4):
        engine = make_engine(model.detach(), batch_size, torch.zeros(3))
        loss = engine.forward_backward(views[:batch_size], GradientNorms()).loss
        steps[batch_size] = (loss, step_state(engine, engine.model.keys))
    engine = make_engine(model.detach(), 2, torch.zeros(3))
    runs = {}
    for name, run in STRATEGY_RUNS.items():
        strategy_engine = make_engine(model.detach(), 2, torch.zeros(3))
        runs[name] = (run(strategy_engine, views),
                      by_key(strategy_engine.model.keys,
                             {n: t.detach() for n, t in
                              strategy_engine.model.parameters().items()}))
    return {"steps": steps, "losses": densifying_run(engine, views), "state": engine.state_dict(),
            "render": engine.render(views[1].camera), **runs}


@pytest.mark.parametrize("world", [1, 2, 3])
def test_ranks_equal_the_single_process(world, single_process, tmp_path):
    out = tmp_path / "rank0.pt"
    mp.spawn(run_rank, args=(world, str(tmp_path / "init"), str(out)), nprocs=world)
    ranks = torch.load(out, weights_only=False)
    for batch_size in (1, 4):
        want_loss, want = single_process["steps"][batch_size]
        loss, got, bands, (reads, read_bands) = ranks["steps"][batch_size]
        assert loss == pytest.approx(want_loss, rel=1e-12)
        # Rank 0 read the rows it renders (its bands and their halo), nothing else.
        cameras = [view.camera for view in densifying_scene()[0][:batch_size]]
        assert sorted(reads) == sorted((band.camera, render_rows(band, cameras[band.camera]))
                                       for band in read_bands[0]), (reads, read_bands[0])
        if world > 1 and batch_size == 4:
            assert len({view for view, _ in reads}) < batch_size, reads
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=1e-9, atol=1e-14,
                                       msg=lambda m, name=name: f"B={batch_size} d/d{name}: {m}")
        if world > 1:
            cuts = [band.rows[0] for rank_bands in bands[1:] for band in rank_bands[:1]]
            assert any(cut % 16 for cut in cuts), f"some band must split a tile row: {bands}"
    assert ranks["losses"] == pytest.approx(single_process["losses"], rel=1e-9)
    shards = ranks["shards"].tolist()
    assert max(shards) - min(shards) <= 1, f"rebalanced shards: {shards}"
    assert torch.equal(torch.cat(ranks["parts"]), ranks["state"]["model"]["means"]), \
        "rank 0 receives every shard, in rank order"
    for name in ("rgb", "alpha", "depth"):
        torch.testing.assert_close(getattr(ranks["render"], name),
                                   getattr(single_process["render"], name), rtol=1e-12, atol=0)
    got, want = state_by_key(ranks["state"]), state_by_key(single_process["state"])
    assert len(want["keys"]) != 60, "densification must have happened"
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-9, atol=1e-14, msg=name)
    for strategy in STRATEGY_RUNS:
        want_losses, want = single_process[strategy]
        losses, params, keys = ranks[strategy]
        assert losses == pytest.approx(want_losses, rel=1e-9), strategy
        got = by_key(keys, params)
        assert torch.equal(got["keys"], want["keys"]), strategy
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=1e-9, atol=1e-14,
                                       msg=lambda m, name=name: f"{strategy} {name}: {m}")


def test_resume_at_other_world_sizes_continues_the_run(single_process, tmp_path):
    """1 rank for 4 steps, then 3 ranks for 4, then 2 ranks to the end: the single
    process' model and Adam state; no rank ever read or wrote the whole state."""
    views, model = densifying_scene()
    engine = make_engine(model.detach(), 2, torch.zeros(3))
    densifying_run(engine, views, range(0, 4))
    checkpoint = tmp_path / "checkpoint.pt"
    save(engine, checkpoint, 4)
    for world, steps in ((3, range(4, 8)), (2, range(8, STEPS))):
        mp.spawn(resume_rank, args=(world, str(tmp_path / f"init{world}"), str(checkpoint),
                                    steps), nprocs=world)
    assert sorted(p.name for p in tmp_path.glob("checkpoint.pt.*")) == [
        f"checkpoint.pt.{STEPS:09d}.rank{r}-of-2" for r in range(2)], "older shards removed"
    got = state_by_key(whole_state_saved(checkpoint))
    want = state_by_key(single_process["state"])
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-9, atol=1e-14, msg=name)


def test_nproc_trains_and_writes_once(tmp_path, capfd):
    from splatscale.cli import main

    cache = ["--cache-dir", str(tmp_path / "cache")]
    out = tmp_path / "run"
    assert main(["train", "-o", str(out), "--iterations", "20", "--nproc", "2", "--quiet",
                 *cache]) == 0
    report = json.loads(capfd.readouterr().out)
    assert report["iterations"] == 20
    assert json.loads((out / "config.json").read_text())["world_size"] == 2
    assert [json.loads(line)["images"] for line in
            (out / "metrics.jsonl").read_text().splitlines()] == [10, 20], "rank 0 logs alone"
    assert len(read_ply(out / "point_cloud.ply")) == report["num_gaussians"]

    assert main(["train", str(tmp_path / "nowhere"), "-o", str(tmp_path / "other"),
                 "--nproc", "2", *cache]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such file or folder" in err[0], err


def test_torchrun_on_two_nodes_trains_as_one_run(tmp_path):
    """Two torchrun agents of one rank each meet at a rendezvous endpoint, as two
    machines would (here both on localhost): one run, written once."""
    cache, out = tmp_path / "cache", tmp_path / "run"
    demo_scene(cache)  # its images exist before either node looks for them
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    node = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
            "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
            f"127.0.0.1:{port}", "--rdzv-id", "splatscale-test", "-m", "splatscale", "train",
            "-o", str(out), "--iterations", "20", "--quiet", "--threads", "1",
            "--cache-dir", str(cache)]
    nodes = [subprocess.Popen(node, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    finished = [n.communicate(timeout=HANG_GUARD) for n in nodes]
    assert [n.returncode for n in nodes] == [0, 0], [err[-2000:] for _, err in finished]
    reports = [json.loads(line) for output, _ in finished for line in output.splitlines()
               if line.startswith("{")]
    assert len(reports) == 1 and reports[0]["iterations"] == 20, "rank 0 reports alone"
    assert json.loads((out / "config.json").read_text())["world_size"] == 2
    assert [json.loads(line)["images"] for line in
            (out / "metrics.jsonl").read_text().splitlines()] == [10, 20]
    assert len(read_ply(out / "point_cloud.ply")) == reports[0]["num_gaussians"]


def children_of(pid: int) -> list[int]:
    """The spawned ranks among ``pid``'s child processes (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and b"splatscale" in command:
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the ranks through /proc")
def test_a_killed_rank_stops_the_run_naming_it(tmp_path):
    out = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "splatscale", "train", "-o", str(out), "--nproc", "2", "--quiet",
         "--iterations", "100000", "--checkpoint-every", "0", "--cache-dir",
         str(tmp_path / "cache")], stderr=subprocess.PIPE, text=True)
    wait_until((out / "metrics.jsonl").is_file, "training under way", process)
    ranks = children_of(process.pid)
    assert len(ranks) == 2, ranks
    os.kill(ranks[1], signal.SIGKILL)
    _, err = process.communicate(timeout=HANG_GUARD)  # the launcher stops the other rank
    assert process.returncode == 2 and "Traceback" not in err, err
    assert re.search(r"^splatscale: error: rank \d of 2 was killed by SIGKILL; the other ranks "
                     r"were stopped$", err.strip()), err
    assert not (out / "checkpoint.pt").exists(), "no torn or partial checkpoint"

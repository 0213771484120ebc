"""Images within a memory budget: the same pixels and the same training whatever the
budget, raw copies read without decoding, and resident memory bounded by the budget
however many views a scene has."""

from __future__ import annotations

import json
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from splatscale.commands import _store
from splatscale.data.images import ImageStore
from splatscale.demo import demo_scene
from splatscale.train.config import TrainConfig
from splatscale.train.trainer import RunOptions, Trainer


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return demo_scene(tmp_path_factory.mktemp("cache"))


def test_a_budget_changes_where_images_are_not_what_they_are(demo, tmp_path):
    whole = ImageStore(demo, cache_dir=tmp_path / "a")
    image_bytes = whole.decoded_bytes() // len(demo.views)
    budget = 10 * image_bytes + image_bytes // 2
    store = ImageStore(demo, cache_dir=tmp_path / "b", memory_budget=budget)
    store.check(decode=True)
    assert len(store.memory.kept) == 10 and store.memory.kept_bytes <= budget
    raws = list(store.cache_dir.rglob("*.rgb"))
    assert len(raws) == len(demo.views) - 10
    store.read_ahead([20, 21])
    for i in range(len(demo.views)):
        assert torch.equal(store.image(i), whole.image(i)), i

    again = ImageStore(demo, cache_dir=tmp_path / "b", memory_budget=0)

    def no_decoding(index):
        raise AssertionError(f"image {index} decoded again")

    again.memory.decode = no_decoding  # every image has its raw copy now, or is kept
    for i in range(10, len(demo.views)):
        assert torch.equal(again.image(i, rows=(5, 9)), whole.image(i)[5:9])


def test_the_ranks_of_one_machine_share_its_budget_and_decoding(demo, tmp_path, capsys):
    image_bytes = ImageStore(demo).decoded_bytes() // len(demo.views)
    args = Namespace(image_memory=20 * image_bytes, resolution=1, max_width=None,
                     max_pixels=None, cache_dir=tmp_path)
    decoded = {rank: [] for rank in range(4)}
    stores = [_store(args, demo, local=(rank, 4)) for rank in range(4)]
    assert stores[1].memory.budget == 5 * image_bytes
    assert "for each of 4 ranks" in capsys.readouterr().err
    for rank, store in enumerate(stores):
        decode = store.memory.decode
        store.memory.decode = lambda i, rank=rank, decode=decode: (decoded[rank].append(i),
                                                                   decode(i))[1]
        store.check(decode=True)  # this rank's share: every 4th image from its own
    views = len(demo.views)
    assert decoded == {rank: list(range(rank, views, 4)) for rank in range(4)}
    for i in range(views):  # every other image is read from its raw copy, undecoded
        assert torch.equal(stores[1].image(i), stores[0].image(i))
    assert decoded[1] == list(range(1, views, 4)), "no image decoded twice"


def test_reads_ahead_not_used_by_the_next_step_are_dropped(demo, tmp_path):
    store = ImageStore(demo, cache_dir=tmp_path, memory_budget=0)
    store.check(decode=True)  # every image has its raw copy
    store.read_ahead([1, 2])
    store.read_ahead([3])  # the step of 1 and 2 runs now: a rank may use neither
    assert set(store.memory._ahead) == {1, 2, 3}
    store.image(1)
    store.read_ahead([4])
    assert set(store.memory._ahead) == {3, 4}, "2 was not used in its step"


def test_training_reads_the_same_images_from_disk(demo, tmp_path):
    models = []
    for budget in (None, 0):
        out = tmp_path / f"run-{budget}"
        out.mkdir()
        store = ImageStore(demo, cache_dir=tmp_path / f"cache-{budget}", memory_budget=budget,
                           background=demo.background)
        trainer = Trainer(demo, store, TrainConfig(iterations=30, batch_size=2),
                          RunOptions(out, progress=False, checkpoint_every=0))
        trainer.run()
        models.append((out / "point_cloud.ply").read_bytes())
    assert models[0] == models[1]


# Reads every image of a scene of N views twice, in a fresh process; prints the growth
# of its peak resident memory, in bytes.
PEAK_GROWTH = """
import json, sys
from pathlib import Path
import numpy as np, torch
from PIL import Image
from splatscale.data.cameras import Camera
from splatscale.commands import _store
from splatscale.data.images import ImageStore
from splatscale.data.scene import Scene, View

folder, views, budget = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
K = torch.tensor([[300.0, 0, 160], [0, 300.0, 120], [0, 0, 1]], dtype=torch.float64)
scene = Scene([View(Camera.from_pose(torch.eye(3, dtype=torch.float64),
                                     torch.tensor([0.0, 0.0, float(i)], dtype=torch.float64),
                                     K, 320, 240, f"{i:05d}.png"), folder / f"{i:05d}.png")
               for i in range(views)], np.zeros((0, 3)), np.zeros((0, 3), np.uint8), folder)
store = ImageStore(scene, cache_dir=folder / "cache",
                   memory_budget=None if budget == "none" else int(budget))
def peak():  # this process' own high-water mark (ru_maxrss counts its parent's, forked)
    status = Path("/proc/self/status").read_text().splitlines()
    return int(next(line for line in status if line.startswith("VmHWM")).split()[1]) * 1024
before = peak()
store.check(decode=True)
total = 0
for i in range(views):
    store.read_ahead(list(range(i + 1, min(i + 3, views))))
    total += int(store.image(i).sum())
print(json.dumps({"growth": peak() - before,
                  "decoded": store.decoded_bytes()}))
"""


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads VmHWM (Linux)")
def test_resident_memory_stays_within_the_budget_with_thousands_of_views(tmp_path):
    views, budget = 2000, 16 * 2 ** 20
    rows = np.arange(240)[:, None, None]
    for i in range(views):  # cheap to write and to decode, distinct
        image = np.broadcast_to(((rows + i) % 256).astype(np.uint8), (240, 320, 3))
        Image.fromarray(np.ascontiguousarray(image)).save(tmp_path / f"{i:05d}.png")
    growth = {}
    for setting in ("none", str(budget)):
        done = subprocess.run([sys.executable, "-c", PEAK_GROWTH, str(tmp_path), str(views),
                               setting], capture_output=True, text=True, check=True)
        growth[setting] = json.loads(done.stdout)
    decoded = growth["none"]["decoded"]
    assert decoded == views * 320 * 240 * 3  # 461 MB
    assert growth["none"]["growth"] > 0.6 * decoded
    assert growth[str(budget)]["growth"] < budget + 64 * 2 ** 20, growth

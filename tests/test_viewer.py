"""The viewer without a browser: poses and splats in viser's terms, the port check,
and that watching a run (its model gathered, checkpoints, pauses) changes nothing.
Where the first view opens is tests/test_viewer_framing.py's."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import urllib.request
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import viser.transforms as vtf

from splatscale.cli import main
from splatscale.data.images import ImageStore
from splatscale.demo import demo_scene
from splatscale.engine.distributed.cost_model import RowCost
from splatscale.engine.factory import OffloadOptions, RankOptions, make_engine, shard_of
from splatscale.model.orientation import cameras_up
from splatscale.model.ply import recorded_up
from splatscale.train.config import TrainConfig
from splatscale.train.trainer import RunOptions, Trainer
from splatscale.train.watch import Bystander
from splatscale.viewer.poses import camera_at, pose_of
from splatscale.viewer.splats import browser_splats
from tests.conftest import HANG_GUARD, random_model


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return demo_scene(tmp_path_factory.mktemp("cache"))


def test_a_pose_gives_back_its_camera(demo):
    for view in demo.views[:5]:
        camera = view.camera
        pose = pose_of(camera)
        forward = vtf.SO3(pose.wxyz).apply(np.array([0.0, 0.0, 1.0]))
        towards_origin = -pose.position / np.linalg.norm(pose.position)
        assert forward @ towards_origin > 0.999  # the demo's cameras look at the origin
        again = camera_at(pose, camera.height, camera.name)
        assert (again.width, again.height) == (camera.width, camera.height)
        torch.testing.assert_close(again.viewmat, camera.viewmat.double(), rtol=0, atol=1e-9)
        torch.testing.assert_close(again.K, camera.K.double(), rtol=0, atol=1e-9)
    up = cameras_up([v.camera for v in demo.views])
    assert up @ np.array([0.0, -1.0, 0.0]) > 0.9  # the demo's floor is at +y, below


def test_a_page_opens_on_its_cameras_framing_and_hides_them_on_request(demo):
    from splatscale.viewer.app import served
    from splatscale.viewer.page import Page, Scenery

    train_ids, test_ids = demo.split(True)
    scenery = Scenery(ImageStore(demo, background=demo.background), train_ids, test_ids)
    framing = scenery.framing()
    with served("127.0.0.1", 0) as server:
        page = Page(server, scenery, torch.ones(3), "demo")
        start = server.initial_camera  # every browser's first view
        np.testing.assert_array_equal(start.position, framing.position)
        np.testing.assert_array_equal(start.look_at, framing.pivot)
        np.testing.assert_array_equal(start.up, framing.up)
        assert (start.fov, start.near, start.far) == (framing.fov, framing.near, framing.far)
        # The demo's cameras look at its origin from above its floor (y is down).
        np.testing.assert_allclose(framing.pivot, np.zeros(3), atol=1e-9)
        assert framing.up @ np.array([0.0, -1.0, 0.0]) > 0.99
        assert page.cameras.visible
        page.show_cameras.value = False
        assert not page.cameras.visible


def test_a_model_alone_opens_upright_by_its_recorded_up():
    from splatscale.viewer.app import served
    from splatscale.viewer.framing import model_framing
    from splatscale.viewer.page import Page

    model = random_model(50, dtype=torch.float32)
    up = np.array([0.0, -0.6, 0.8])
    with served("127.0.0.1", 0) as server:
        page = Page(server, None, torch.zeros(3), "model.ply", up)
        page.show_model(model)
        framing = model_framing(model.means.double().numpy(), page.unit, up)
        np.testing.assert_array_equal(server.initial_camera.up, up)
        np.testing.assert_allclose(server.initial_camera.position, framing.position)


def quaternion_matrix(q: np.ndarray) -> np.ndarray:
    w, x, y, z = q / np.linalg.norm(q)
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                     [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                     [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])


def test_splats_are_the_gaussians_in_scene_units():
    model = random_model(20, seed=3, log_scale=(-9.0, -5.0))  # below float16's normals
    unit = 0.01
    splats = browser_splats(model, unit)
    for i in range(len(model)):
        rotation = quaternion_matrix(model.quats[i].numpy())
        covariance = rotation @ np.diag(model.scales[i].numpy() ** 2) @ rotation.T
        np.testing.assert_allclose(splats.covariances[i] * unit ** 2, covariance,
                                   rtol=1e-4, atol=1e-16)
        sent = splats.covariances[i].astype(np.float16).astype(np.float64)  # as viser sends
        np.testing.assert_allclose(np.diag(sent) * unit ** 2, np.diag(covariance), rtol=2e-3)
    np.testing.assert_allclose(splats.centers * unit, model.means.numpy(), rtol=1e-6)
    np.testing.assert_allclose(splats.opacities[:, 0], model.opacities.numpy(), rtol=1e-6)
    np.testing.assert_allclose(splats.rgbs, np.clip(0.28209479177387814
                                                    * model.sh0[:, 0].numpy() + 0.5, 0, 1),
                               rtol=1e-6)


def taken_port() -> socket.socket:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    return holder


def test_a_port_in_use_is_refused_in_one_line(tmp_path, capfd):
    with taken_port() as holder:
        port = str(holder.getsockname()[1])
        ply = tmp_path / "model.ply"
        from splatscale.model.ply import write_ply
        write_ply(random_model(10, dtype=torch.float32), ply)
        assert main(["view", str(ply), "--port", port]) == 2
        out = tmp_path / "run"
        assert main(["train", "-o", str(out), "--viewer", "--port", port, "--iterations", "2",
                     "--cache-dir", str(tmp_path / "cache")]) == 2
        assert not out.exists()  # refused before the folder was made
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(f"--port {port}: already in use" in line for line in err), err


def test_view_refuses_a_folder_without_a_model_or_its_scene(tmp_path, capfd):
    from splatscale.model.ply import write_ply

    assert main(["view", str(tmp_path)]) == 2
    write_ply(random_model(10, dtype=torch.float32), tmp_path / "point_cloud.ply")
    (tmp_path / "config.json").write_text('{"data": "%s"}' % (tmp_path / "gone"))
    assert main(["view", str(tmp_path)]) == 2
    (tmp_path / "config.json").write_text("{not json")
    assert main(["view", str(tmp_path)]) == 2
    (tmp_path / "config.json").write_text('{"data": null, "resolution": 3}')
    assert main(["view", str(tmp_path)]) == 2
    lone = tmp_path / "lone" / "model.ply"
    lone.parent.mkdir()
    lone.write_bytes((tmp_path / "point_cloud.ply").read_bytes())
    assert main(["view", str(lone), "--host", ""]) == 2
    assert main(["train", "-o", str(tmp_path / "run"), "--port", "9000"]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 6, err
    assert "config.json: resolution must be 1, 2, 4 or 8, not 3" in err[3]
    assert "--host: empty" in err[4] and "--port: only with --viewer" in err[5]
    assert "without point_cloud.ply" in err[0]
    assert f"its run's scene {tmp_path / 'gone'} is not there" in err[1]
    assert "config.json: not a run's config.json" in err[2]


class ScriptedWatcher:
    """Asks for everything a page can: the model every step (and spoils the copy it is
    given), a checkpoint at step 3, a pause of three polls at step 4."""

    def __init__(self) -> None:
        self.steps, self.models, self.waits, self.saved, self.done = 0, [], 0, [], None

    def after_step(self, entry: dict, total_images: int) -> None:
        self.steps = entry["step"]

    def model_due(self) -> bool:
        return True

    def show_model(self, model) -> None:
        self.models.append(len(model))
        model.means.add_(1.0)  # a copy: training must not see this
        model.sh0.zero_()

    def checkpoint_requested(self) -> bool:
        return self.steps == 3 and not self.saved

    def checkpoint_saved(self, images: int) -> None:
        self.saved.append(images)

    def paused(self) -> bool:
        return self.steps == 4 and self.waits < 3

    def wait(self, seconds: float) -> None:
        self.waits += 1

    def serve(self) -> None:
        pass

    def finished(self, images: int) -> None:
        self.done = images


CONFIG = dict(iterations=40, batch_size=2, densify_from=10, densify_interval=10,
              densify_until=30, opacity_reset_interval=20, sh_degree_interval=10)


def trained(scene, out: Path, make_engine, watcher=None, writes: bool = True) -> bytes:
    store = ImageStore(scene, background=scene.background)
    out.mkdir(exist_ok=True)
    options = RunOptions(out, progress=False, checkpoint_every=0, writes=writes)
    trainer = Trainer(scene, store, TrainConfig(**CONFIG), options, make_engine=make_engine)
    trainer.run(watcher)
    return (out / "point_cloud.ply").read_bytes() if writes else b""


@pytest.mark.parametrize("engine", ["local", "offload"])
def test_a_watched_run_ends_as_an_unwatched_one(engine, demo, tmp_path):
    make = {"local": make_engine,
            "offload": partial(make_engine, offload=OffloadOptions(forwarding=True))}[engine]
    alone = trained(demo, tmp_path / "alone", make)
    watcher = ScriptedWatcher()
    watched = trained(demo, tmp_path / "watched", make, watcher)
    assert watched == alone
    assert watcher.waits == 3 and watcher.saved == [6] and watcher.done == 40
    assert len(watcher.models) == 21  # before the first step, then after each
    assert (tmp_path / "watched" / "checkpoint.pt").is_file()
    # The model records its training cameras' up, for a viewer of the PLY alone.
    train_ids, _ = demo.split(False)
    np.testing.assert_allclose(recorded_up(tmp_path / "watched" / "point_cloud.ply"),
                               cameras_up([demo.views[i].camera for i in train_ids]),
                               rtol=0, atol=1e-15)


def watched_rank(rank: int, world: int, init_file: str, cache: str, out: str,
                 watch: bool) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    torch.set_num_threads(1)

    def make(model, batch_size, background, ssim_weight):
        # Rows shared by a fixed cost: measured times would split them differently each run.
        return make_engine(shard_of(model, rank, world), batch_size, background, ssim_weight,
                           ranks=RankOptions(fixed_cost=RowCost()))

    watcher = (ScriptedWatcher() if rank == 0 else Bystander()) if watch else None
    trained(demo_scene(Path(cache)), Path(out), make, watcher, writes=rank == 0)
    if watch and rank == 0:
        assert watcher.waits == 3 and watcher.saved == [6] and len(watcher.models) == 21
    dist.destroy_process_group()


def test_a_watched_distributed_run_ends_as_an_unwatched_one(demo, tmp_path):
    runs = {}
    for watch in (False, True):
        out = tmp_path / f"watch-{watch}"
        mp.spawn(watched_rank, args=(2, str(tmp_path / f"init-{watch}"), str(demo.source.parent),
                                     str(out), watch), nprocs=2)
        runs[watch] = (out / "point_cloud.ply").read_bytes()
    assert runs[True] == runs[False]


def test_view_serves_until_a_stop_signal(tmp_path):
    from splatscale.model.ply import write_ply

    ply = tmp_path / "model.ply"
    write_ply(random_model(10, dtype=torch.float32), ply)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for stop in (signal.SIGTERM, signal.SIGINT):
        process = subprocess.Popen([sys.executable, "-m", "splatscale", "view", str(ply),
                                    "--port", str(port)], stderr=subprocess.PIPE, text=True)
        said = process.stderr.readline()
        assert f"at http://localhost:{port}" in said, said
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/") as page:
            assert page.status == 200
        process.send_signal(stop)
        # Its only way to end: said as every command's stop is, never as a success.
        assert process.wait(timeout=HANG_GUARD) == 130
        assert process.stderr.read() == "splatscale: interrupted\n"

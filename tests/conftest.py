"""Shared test helpers: the test data folder, small synthetic scenes, and waiting for
what a process or a page does."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import time
from typing import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from splatscale.backends import Backend, backend_named
from splatscale.data.cameras import Camera
from splatscale.engine import TrainView
from splatscale.model.gaussians import SH_REST, GaussianModel
from splatscale.model.init import nearest_neighbour_scales
from splatscale.render import render
from splatscale.strategy import default, mcmc
from splatscale.strategy.default import GradientNorms
from splatscale.strategy.mcmc import Regularisers

TEST_DATA = Path(__file__).resolve().parent / "data"


def data_path(*parts: str) -> Path:
    """A path under tests/data (see its README for what is there and the licences)."""
    path = TEST_DATA.joinpath(*parts)
    assert path.exists(), f"test data missing from the checkout: {path}"
    return path


# Seconds a test waits for a process, a page or a condition before it calls it hung. A
# guard against a hang, never a verdict: far beyond what the slowest busy machine takes.
HANG_GUARD = 1800


def wait_until(condition: Callable[[], object], what: str,
               process: subprocess.Popen | None = None, every: float = 0.2):
    """``condition()``'s first true value, asked every ``every`` seconds. Fails if
    ``process`` ends first (with what it said), or after ``HANG_GUARD`` seconds."""
    deadline = time.monotonic() + HANG_GUARD
    while not (value := condition()):
        if process is not None and process.poll() is not None:
            pytest.fail(f"the process ended (status {process.returncode}) before {what}: "
                        f"{process.communicate()}")
        if time.monotonic() > deadline:
            pytest.fail(f"hung: {HANG_GUARD} s without {what}")
        time.sleep(every)
    return value


def look_at_camera(eye, target, width: int, height: int, focal: float,
                   dtype=torch.float64, name: str = "") -> Camera:
    """An OpenCV-axes camera at ``eye`` looking at ``target``, principal point centred."""
    eye, target = np.asarray(eye, float), np.asarray(target, float)
    forward = target - eye
    forward /= np.linalg.norm(forward)
    right = np.cross(forward, [0.0, -1.0, 0.0])
    if np.linalg.norm(right) < 1e-8:
        right = np.array([1.0, 0.0, 0.0])
    right /= np.linalg.norm(right)
    down = np.cross(forward, right)
    rotation = np.stack([right, down, forward])  # rows: camera axes in world
    K = np.array([[focal, 0, width / 2], [0, focal, height / 2], [0, 0, 1]])
    camera = Camera.from_pose(torch.from_numpy(rotation), torch.from_numpy(-rotation @ eye),
                              torch.from_numpy(K), width, height, name)
    return Camera(camera.viewmat.to(dtype), camera.K.to(dtype), width, height, name)


def random_model(n: int, seed: int = 0, dtype=torch.float64, sh_degree: int = 3,
                 spread: float = 1.0, log_scale=(-3.0, -1.0), opacity=(0.2, 0.95)) -> GaussianModel:
    """Gaussians scattered around the origin with random shape, opacity and SH."""
    g = torch.Generator().manual_seed(seed)
    uniform = lambda *shape, lo=0.0, hi=1.0: lo + (hi - lo) * torch.rand(*shape, generator=g,  # noqa: E731
                                                                             dtype=dtype)
    opacities = uniform(n, lo=opacity[0], hi=opacity[1])
    return GaussianModel(
        means=(uniform(n, 3) - 0.5) * 2 * spread,
        quats=torch.randn(n, 4, generator=g, dtype=dtype),
        log_scales=uniform(n, 3, lo=log_scale[0], hi=log_scale[1]),
        opacity_logits=torch.log(opacities / (1 - opacities)),
        sh0=uniform(n, 1, 3, lo=-1.0, hi=1.0),
        shN=0.3 * torch.randn(n, SH_REST, 3, generator=g, dtype=dtype),
        sh_degree=sh_degree,
    )


def orbit_cameras(count: int, width: int, height: int, radius: float = 4.0,
                  dtype=torch.float64) -> list[Camera]:
    return [look_at_camera([radius * math.cos(a), 0.3 * radius, radius * math.sin(a)],
                           [0, 0, 0], width, height, focal=1.2 * width, dtype=dtype)
            for a in np.linspace(0, 2 * math.pi, count, endpoint=False)]


TRAIN_RATES = {"means": 2e-3, "quats": 1e-3, "log_scales": 5e-3, "opacity_logits": 0.05,
               "sh0": 2.5e-3, "shN": 1.25e-4}
TRAIN_STEPS = 12


def every_row_backend() -> Backend:
    """The CPU backend as a device that renders and steps the whole model (no rows
    gathered, whatever a batch sees)."""
    return dataclasses.replace(backend_named("cpu"), gathers_seen_rows=False)


def densifying_scene(dtype=torch.float64) -> tuple[list[TrainView], GaussianModel]:
    """Four views 41x37 (not a multiple of 16) of one random model, and another
    random model to train, large enough that densification clones and splits."""
    cameras = orbit_cameras(4, 41, 37, radius=3.5, dtype=dtype)
    truth = random_model(150, seed=11, spread=0.8, dtype=dtype)
    with torch.no_grad():
        views = [TrainView(c, render(truth, c).rgb.clamp(0, 1)) for c in cameras]
    return views, random_model(60, seed=12, spread=0.8, log_scale=(-2.5, -1.0), dtype=dtype)


def densifying_run(engine, views: list[TrainView],
                   steps: range = range(TRAIN_STEPS)) -> list[float]:
    """Steps of batches of 2 with clones, splits, pruning and an opacity reset inside
    (all TRAIN_STEPS, or ``steps`` of them); the losses."""
    return scheduled_run(engine, views, 2, steps, densify={3: False, 8: True}, reset=6,
                         grad_threshold=5e-3)


# densifying_scene's model has 60 Gaussians and 44 candidates at the first
# densification: a budget of 70 densifies 10 of them, then none.
BINDING_BUDGET = 70


def capped_run(engine, views: list[TrainView], steps: range = range(TRAIN_STEPS)) -> list[float]:
    """``densifying_run`` under a budget that binds."""
    return scheduled_run(engine, views, 2, steps, densify={3: False, 8: True}, reset=6,
                         grad_threshold=5e-3, max_gaussians=BINDING_BUDGET)


def absgrad_run(engine, views: list[TrainView],
                steps: range = range(TRAIN_STEPS)) -> list[float]:
    """``densifying_run`` with AbsGS's statistic (the absolute per-pixel gradients), at
    a threshold that densifies about half the Gaussians."""
    return scheduled_run(engine, views, 2, steps, densify={3: False, 8: True}, reset=6,
                         grad_threshold=2e-2, absgrad=True)


def batch_at(views: list[TrainView], batch_size: int, step: int) -> list[TrainView]:
    """The batch of ``step`` when batches take ``views`` in turn."""
    return [views[(batch_size * step + i) % len(views)] for i in range(batch_size)]


def cameras_of(batch: list[TrainView]) -> list:
    return [view.camera for view in batch]


def mcmc_run(engine, views: list[TrainView], batch_size: int = 2,
             steps: range = range(TRAIN_STEPS)) -> list[float]:
    """The Trainer's MCMC step order: regularised steps, relocation and growth to
    ``BINDING_BUDGET`` at steps 3 and 8 (opacity 0.3 counting as dead, so that some
    move), noise after every step; the losses. Each step tells the engine the next
    batch, as the Trainer does not with MCMC: what it edits voids the hint."""
    losses = []
    for step in steps:
        engine.expect(cameras_of(batch_at(views, batch_size, step + 1)), TRAIN_RATES)
        losses.append(engine.forward_backward(batch_at(views, batch_size, step),
                                              regularisers=Regularisers()).loss)
        engine.optimizer_step(TRAIN_RATES)
        if step in (3, 8):
            engine.edit_rows(lambda rows, total: (mcmc.relocate(rows, 0.3, total),
                                                  mcmc.add(rows, BINDING_BUDGET, 0.3, total)))
        engine.edit_rows(lambda rows, total: mcmc.move_means(rows, mcmc.noise(rows, 200.0,
                                                                              step)))
    return losses


def scheduled_run(engine, views: list[TrainView], batch_size: int, steps: range,
                  densify: dict[int, bool], reset: int, grad_threshold: float,
                  after_forward: Callable = lambda engine: None,
                  max_gaussians: int | None = None, absgrad: bool = False) -> list[float]:
    """The Trainer's step order over ``steps``: batches taken from ``views`` in turn,
    densification at the steps of ``densify`` (pruning large ones where it says True),
    an opacity reset at step ``reset``; the losses. Each step tells the engine the next
    batch's cameras, as the Trainer does."""
    losses = []
    for step in steps:
        engine.expect(cameras_of(batch_at(views, batch_size, step + 1)), TRAIN_RATES)
        losses.append(engine.forward_backward(batch_at(views, batch_size, step),
                                              GradientNorms(absgrad)).loss)
        after_forward(engine)
        if step in densify:
            engine.edit_rows(lambda rows, total: default.densify_and_prune(
                rows, grad_threshold, percent_dense=0.15, extent=2.0, min_opacity=0.005,
                prune_large=densify[step], max_gaussians=max_gaussians, total=total))
        if step == reset:
            engine.edit_rows(lambda rows, total: default.reset_opacity(rows))
        engine.optimizer_step(TRAIN_RATES)
    return losses


def state_by_key(state: dict) -> dict:
    """Every per-Gaussian tensor of an engine state (parameters, Adam moments as m_ and
    v_, statistics), rows ordered by key: engines compared as sets of Gaussians."""
    order = torch.argsort(state["keys"])
    tensors = {**state["model"], **state["stats"],
               **{"m_" + n: t for n, t in state["optimizer"]["exp_avg"].items()},
               **{"v_" + n: t for n, t in state["optimizer"]["exp_avg_sq"].items()}}
    return {"keys": state["keys"][order], **{n: t[order] for n, t in tensors.items()}}


@pytest.fixture(scope="session")
def garden():
    """30,000 of the garden scene's real Gaussian centres with random shapes, opacities
    and colours, and its cameras."""
    data = np.load(data_path("garden_splats.npz"))
    rng = np.random.default_rng(0)
    keep = rng.choice(len(data["means3d"]), 30_000, replace=False)
    means = torch.from_numpy(data["means3d"][keep].astype(np.float64))
    n = len(means)
    scales = nearest_neighbour_scales(means.numpy())[:, None] * rng.uniform(0.3, 3.0, (n, 3))
    model = GaussianModel(
        means=means,
        quats=torch.from_numpy(rng.normal(size=(n, 4))),
        log_scales=torch.from_numpy(np.log(scales)),
        # Some below opacity 1/255 (logit -5.54), which gsplat's kernels cull.
        opacity_logits=torch.from_numpy(rng.normal(size=n) * 2.5),
        sh0=torch.from_numpy(rng.normal(size=(n, 1, 3))),
        shN=torch.from_numpy(0.2 * rng.normal(size=(n, SH_REST, 3))),
    )
    width, height = int(data["width"]), int(data["height"])
    cameras = [Camera(torch.from_numpy(v.astype(np.float64)),
                      torch.from_numpy(k.astype(np.float64)), width, height)
               for v, k in zip(data["viewmats"], data["Ks"])]
    return model, cameras


def gsplat_kernel_boxes(radii, means2d, conics, opacities, width: int, height: int):
    """gsplat 1.5.3's CUDA visibility rule (ProjectionEWA3DGSPacked.cu), which its
    torch reference lacks, applied to that reference's geometry: cull opacity below
    1/255; per-axis box of min(3.33, sqrt(2 ln(255 opacity))) sigmas; the image test.
    ``opacities`` [N], or [C, N] where they depend on the camera (times an anti-aliased
    splat's compensation). Returns (unrounded box half-extents [C, N, 2], visible [C, N])."""
    opacities = opacities.expand(radii.shape[:-1])
    a, b, c = conics.unbind(-1)
    det = a * c - b * b
    sigma = torch.sqrt(torch.stack([c / det, a / det], dim=-1))  # of the 2D covariance
    sigmas = torch.sqrt(2 * torch.log(opacities * 255)).clamp(max=3.33)
    exact = sigmas[..., None] * sigma
    box = torch.ceil(exact)
    # The reference's radii > 0: a valid projection whose 3.33-sigma box meets the image.
    visible = ((radii > 0).all(dim=-1) & (opacities >= 1 / 255) & (box > 0).any(dim=-1)
               & (means2d + box > 0).all(dim=-1) & (means2d[..., 0] - box[..., 0] < width)
               & (means2d[..., 1] - box[..., 1] < height))
    return exact, visible


def assert_radii_match(radii: torch.Tensor, exact: torch.Tensor) -> None:
    """Radii are the ceil of the unrounded half-extents. Two implementations round
    those differently in the last bits, so where one lies within 1e-9 of an integer
    either neighbour is right; everywhere else the integers must be equal."""
    on_edge = (exact - exact.round()).abs() < 1e-9 * exact
    assert torch.equal(radii[~on_edge], torch.ceil(exact)[~on_edge].to(torch.int32))
    assert ((radii - exact)[on_edge].abs() <= 1).all()


def antialiased(model: GaussianModel, flag: bool = True) -> GaussianModel:
    """A detached copy of ``model``, rendered anti-aliased if ``flag``."""
    copy = model.detach()
    copy.antialiased = flag
    return copy


def pairs_of(model: GaussianModel, cameras: list[Camera]):
    """The projection kernels' arguments for every (Gaussian, camera) pair that
    ``visibility`` keeps: gaussian_ids, camera_ids and the cameras' tensors."""
    from splatscale.render.projection import visibility
    from splatscale.render.splats import camera_tensors
    viewmats, Ks, sizes = camera_tensors(cameras, model.means)
    camera_ids, gaussian_ids = visibility(model, cameras).visible.nonzero(as_tuple=True)
    return gaussian_ids, camera_ids, viewmats, Ks, sizes


def leaves_of(model: GaussianModel) -> list[torch.Tensor]:
    """Fresh leaves, requiring grad, of the parameters the projection differentiates."""
    return [t.detach().clone().requires_grad_(True)
            for t in (model.means, model.quats, model.log_scales)]

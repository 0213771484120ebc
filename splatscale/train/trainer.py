"""The Trainer: batches, schedules, evaluation, logging, outputs and checkpoints."""

from __future__ import annotations

import json
import math
import resource
import signal
import threading
import time
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, Iterator

import torch

from splatscale.atomic import write_json
from splatscale.data.images import ImageStore
from splatscale.data.scene import Scene
from splatscale.engine import Engine, TrainView
from splatscale.engine import factory
from splatscale.errors import DataError, Interrupted, TrainingDiverged
from splatscale.messages import notice
from splatscale.threads import threading_layer
from splatscale.model import GaussianModel, init_from_points
from splatscale.model.gaussians import concatenated
from splatscale.model.init import (plain_background, random_points_in_cube,
                                   random_points_in_view)
from splatscale.model.orientation import cameras_up
from splatscale.model.ply import write_ply_parts
from splatscale.step import appearance
from splatscale.step.appearance import Appearance
from splatscale.step.optimizer import batch_hyperparameters
from splatscale.strategy import Strategy, make_strategy
from splatscale.train import metrics
from splatscale.train.checkpoint import load_checkpoint, save_checkpoint
from splatscale.train.config import TrainConfig
from splatscale.train.progress import ProgressBar
from splatscale.train.render_folder import (RenderFolder, check_distinct, photo_name,
                                            render_names)
from splatscale.step.schedule import crosses, position_lr
from splatscale.train.watch import Watcher

RANDOM_INIT_POINTS = 100_000
RANDOM_INIT = {"cameras": random_points_in_view, "cube": random_points_in_cube}
RANDOM_INIT_SAMPLE = 8  # training images whose borders decide the "auto" rule
PAUSE_POLL = 0.1  # seconds between the ranks' checks that a pause goes on


@dataclass
class RunOptions:
    """Where and how often the Trainer writes, beyond the training settings."""

    output: Path
    eval_split: bool = False
    eval_every: int = 0           # images; 0: only at the end
    save_at: list[int] = field(default_factory=list)
    checkpoint_every: int = 1000  # images; 0: only at the end
    log_every: int = 10           # steps
    progress: bool = True
    writes: bool = True           # this process writes the outputs (rank 0 of a distributed run)
    split: tuple[list[int], list[int]] | None = None  # (train, test) views; None: eval_split's


EngineFactory = Callable[[GaussianModel, int, torch.Tensor, float], Engine]


def random_init_rule(store: ImageStore, train_ids: list[int], config: TrainConfig) -> str:
    """``config.random_init``; for "auto", what the images show: "cameras" (points
    where the cameras look) for an object on a plain background, else "cube"."""
    if config.random_init != "auto":
        return config.random_init
    sample = train_ids[::max(1, len(train_ids) // RANDOM_INIT_SAMPLE)][:RANDOM_INIT_SAMPLE]
    images = [store.image(i)[..., :3].numpy() for i in sample]
    return "cameras" if plain_background(images) else "cube"


def initial_model(scene: Scene, store: ImageStore, train_ids: list[int], config: TrainConfig,
                  strategy: Strategy) -> GaussianModel:
    """The SfM points, or random points by ``random_init_rule`` (no more than the
    strategy's budget), anti-aliased where the config says."""
    points, colors = scene.points, scene.colors
    budget = strategy.max_gaussians
    if len(points) == 0:
        draw = RANDOM_INIT[random_init_rule(store, train_ids, config)]
        points, colors = draw([scene.views[i].camera for i in train_ids],
                              min(RANDOM_INIT_POINTS, budget or RANDOM_INIT_POINTS),
                              config.seed)
    elif config.max_gaussians is not None and len(points) > config.max_gaussians:
        raise DataError(f"--max-gaussians {config.max_gaussians}: {scene.source} starts "
                        f"from {len(points)} SfM points, more than that")
    return init_from_points(points, colors, opacity=strategy.initial_opacity,
                            scale=strategy.initial_scale, antialiased=config.antialiased)


class Trainer:
    def __init__(self, scene: Scene, store: ImageStore, config: TrainConfig,
                 options: RunOptions, engine: Engine | None = None,
                 make_engine: EngineFactory = factory.make_engine) -> None:
        """``engine``, if given, is used as it is; otherwise ``make_engine(initial model,
        batch size, background, SSIM weight)`` makes one (by default ``make_engine``'s
        engine on the CPU)."""
        self.scene, self.store, self.config, self.options = scene, store, config, options
        self.train_ids, self.test_ids = options.split or scene.split(options.eval_split)
        if not self.train_ids:
            raise DataError(f"{scene.source}: no training views")
        if config.batch_size > len(self.train_ids):
            raise DataError(f"--batch-size {config.batch_size}: {scene.source} has "
                            f"{len(self.train_ids)} training views, and a batch holds "
                            "distinct views")
        trained = self._total_images()
        if trained != config.iterations:
            notice(f"--iterations {config.iterations} is not a multiple of --batch-size "
                   f"{config.batch_size}: the run trains on {trained} images")
        store.check(progress=options.progress)
        self.scene_fingerprint = store.fingerprint()  # of the scene as the run found it
        self.extent = scene.camera_extent(self.train_ids)  # 3DGS: training cameras only
        white = config.white_background or scene.background == (1.0, 1.0, 1.0)
        self.background = torch.ones(3) if white else torch.zeros(3)
        self.strategy = make_strategy(config, self.extent)
        self.engine = engine or make_engine(
            initial_model(scene, store, self.train_ids, config, self.strategy),
            config.batch_size, self.background, config.ssim_weight)
        self.images_seen = 0
        self.steps = 0
        self.sh_degree = 0
        self.engine.set_sh_degree(0)
        self.train_seconds = 0.0
        self.order = torch.Generator().manual_seed(config.seed)
        self.queue: list[int] = []
        self.checkpoint_images: int | None = None  # images seen at the last checkpoint
        self.appearance = (Appearance(len(scene.views), config.batch_size,
                                      self.train_ids)
                           if config.appearance == "affine" else None)

    # -- schedule -------------------------------------------------------------------

    def _next_batch(self) -> list[int]:
        batch: list[int] = []
        while len(batch) < self.config.batch_size:
            if not self.queue:
                perm = torch.randperm(len(self.train_ids), generator=self.order).tolist()
                self.queue = [self.train_ids[i] for i in perm]
            batch.append(self.queue.pop())
        return batch

    def learning_rates(self, image: int) -> dict[str, float]:
        c = self.config
        return {"means": position_lr(image, c.position_lr_init * self.extent,
                                     c.position_lr_final * self.extent, c.position_lr_max_steps),
                "sh0": c.feature_lr, "shN": c.feature_lr / 20, "opacity_logits": c.opacity_lr,
                "log_scales": c.scaling_lr, "quats": c.rotation_lr}

    def train_step(self) -> dict:
        c, engine = self.config, self.engine
        before, after = self.images_seen, self.images_seen + c.batch_size
        if crosses(before, after, c.sh_degree_interval) and self.sh_degree < c.sh_degree:
            self.sh_degree += 1
            engine.set_sh_degree(self.sh_degree)
        # Read when an engine asks: a rank reads only the rows it renders, so only one
        # process reads the next batch's whole images ahead.
        ids = self._next_batch()
        transforms = self.appearance.leaves(ids) if self.appearance else []
        batch = [TrainView(self.store.camera(i), read=partial(self.store.image, i),
                           appearance=transforms[k] if transforms else None,
                           masked=self.store.masked)
                 for k, i in enumerate(ids)]
        upcoming = self.queue[-c.batch_size:]  # the next batch, where queued
        engine.read_ahead(lambda: self.store.read_ahead(upcoming))
        strategy = self.strategy
        if len(self.queue) >= c.batch_size and not strategy.edits_every_step:
            engine.expect([self.store.camera(i) for i in reversed(self.queue[-c.batch_size:])],
                          self.learning_rates(before + 1))
        result = engine.forward_backward(batch, strategy if strategy.observes(after) else None,
                                         strategy.regularisers)
        if not math.isfinite(result.loss):
            self._diverged(f"the loss of images {before + 1}..{after} is {result.loss}")
        changes = strategy.before_adam(engine, before, after)
        engine.optimizer_step(self.learning_rates(before + 1))
        if self.appearance:
            self.appearance.step(ids, transforms, Appearance.learning_rate(
                before + 1, c.position_lr_max_steps))
        # The means' rate of the next step, as Adam takes it (the batch-size rule).
        means_lr = batch_hyperparameters(self.learning_rates(after + 1)["means"],
                                         c.batch_size).lr
        changes.update(strategy.after_adam(engine, before, after, means_lr))
        self.images_seen, self.steps = after, self.steps + 1
        return {"step": self.steps, "images": after, "loss": result.loss, "psnr": result.psnr,
                "num_gaussians": engine.num_gaussians(), "changes": changes,
                "diagnostics": result.diagnostics}

    # -- the run --------------------------------------------------------------------

    def run(self, watcher: Watcher | None = None) -> dict:
        """Train to the configured number of images, then write the final outputs;
        ``watcher`` is told of each step and may ask for the model, a checkpoint or a
        pause between two (``serve_watcher``).

        Ctrl-C or SIGTERM finishes the current step, saves a checkpoint and raises
        Interrupted. However the steps end, the engine is closed (``Engine.close``).
        """
        o, c = self.options, self.config
        total_steps = math.ceil(c.iterations / c.batch_size)
        bar = ProgressBar(self._total_images(), self.images_seen,
                          (c.densify_from, c.refine_until()), shown=o.progress)
        gaussians = self.engine.num_gaussians()
        log_path = o.output / "metrics.jsonl"
        with closing(self.engine), closing(bar), _stop_after_step() as interrupted:
            if watcher is not None:
                self._show_model(watcher)
            while self.steps < total_steps:
                before = self.images_seen
                start = time.perf_counter()
                entry = self.train_step()
                seconds = time.perf_counter() - start
                self.train_seconds += seconds
                entry["images_per_second"] = self.images_seen / max(self.train_seconds, 1e-9)
                bar.step(entry, seconds, gaussians)
                gaussians = entry["num_gaussians"]
                logged = self.steps % o.log_every == 0 or self.steps == total_steps
                if logged or entry["changes"]:
                    entry.pop("diagnostics")  # the engine's own, for benchmarks
                    self._write(_append_jsonl, log_path, entry)
                self._periodic(before, log_path)
                if watcher is not None:
                    self.train_seconds += self.serve_watcher(watcher, entry, interrupted)
                if self.engine.any_rank(interrupted()):
                    bar.close()
                    self.save_checkpoint()
                    raise Interrupted(
                        f"stopped after image {self.images_seen:,}, as asked; "
                        f"{self.checkpoint_path} is saved, and "
                        f"splatscale train -o {o.output} --resume continues the run")
        report = self.finish()
        if watcher is not None:
            watcher.finished(self.images_seen)
        return report

    def serve_watcher(self, watcher: Watcher, entry: dict,
                      interrupted: Callable[[], bool]) -> float:
        """Between two steps: tell ``watcher`` of the step's ``entry``, then give it
        the model, a checkpoint or a pause as asked (agreed by every rank; a pause
        ends when it is lifted or a stop signal arrives). The seconds this took,
        the pause excluded."""
        engine, start, paused = self.engine, time.perf_counter(), 0.0
        watcher.after_step(entry, self._total_images())
        if engine.any_rank(watcher.model_due()):
            self._show_model(watcher)
        while True:
            if engine.any_rank(watcher.checkpoint_requested()):
                self.save_checkpoint()
                watcher.checkpoint_saved(self.images_seen)
            if not engine.any_rank(watcher.paused()) or engine.any_rank(interrupted()):
                break
            held_from = time.perf_counter()
            watcher.wait(PAUSE_POLL)
            paused += time.perf_counter() - held_from
        watcher.serve()
        return time.perf_counter() - start - paused

    def _total_images(self) -> int:
        return math.ceil(self.config.iterations / self.config.batch_size) * self.config.batch_size

    def _show_model(self, watcher: Watcher) -> None:
        """The current model to ``watcher``, gathered part by part on the writing rank."""
        parts = self.engine.model_parts()
        if self.options.writes:
            watcher.show_model(concatenated(parts, self.sh_degree))
        else:
            for _ in parts:  # a rank's own part goes to the writer as this runs
                pass
            watcher.show_model(None)

    def _periodic(self, before: int, log_path: Path) -> None:
        o, after = self.options, self.images_seen
        for mark in o.save_at:
            if before < mark <= after:
                self._save_model(o.output / f"point_cloud_{mark}.ply")
        if o.eval_every and self.test_ids and crosses(before, after, o.eval_every):
            self._write(_append_jsonl, log_path, {"images": after, "test": self.evaluate()})
        if o.checkpoint_every and crosses(before, after, o.checkpoint_every):
            self.save_checkpoint()

    def evaluate(self, ids: list[int] | None = None, render_dir: Path | None = None) -> dict:
        """Test metrics over views ``ids`` (the test views); their renders written to
        ``render_dir``, a folder of renders of the run's own, if given, each beside its
        photo (as trained on: ``NAME.photo.png``). With masks, scored over the masked-in
        pixels (``metrics.ImageMetrics``)."""
        ids = self.test_ids if ids is None else ids
        scores = metrics.ImageMetrics()
        fitted = metrics.ImageMetrics() if self.appearance else None
        names = render_names([self.store.camera(i).name for i in ids])
        folder = RenderFolder(render_dir) if render_dir is not None else None
        if folder is not None:
            files = names + [photo_name(n) for n in names]
            check_distinct(files)
            self._write(folder.begin, files, {"split": "test", "images": self.images_seen})
        for i, name in zip(ids, names):
            out = self.engine.render(self.store.camera(i))
            image = out.rgb.clamp(0, 1).cpu()
            scores.add(image, self.store.as_float(i))
            if fitted is not None:  # the NeRF-W score of a model with per-image colours
                fitted.add(*appearance.fitted_right_half(image, self.store.as_float(i)))
            if folder is not None:
                self._write(folder.write, name, (image * 255).round().to(torch.uint8).numpy())
                self._write(folder.write, photo_name(name),
                            self.store.image(i)[..., :3].contiguous().numpy())
        if fitted is not None:
            return {**scores.summary(), "fitted_affine_right_half": fitted.summary()}
        return scores.summary()

    def finish(self) -> dict:
        o = self.options
        # The checkpoint first: a model that fails to be written then leaves the
        # previous one beside a checkpoint that resumes to write it.
        self.save_checkpoint()
        self._save_model(o.output / "point_cloud.ply")
        report = {
            "num_gaussians": self.engine.num_gaussians(),
            "iterations": self.images_seen,
            "steps": self.steps,
            "batch_size": self.config.batch_size,
            "images_per_second": self.images_seen / max(self.train_seconds, 1e-9),
            "iterations_per_second": self.steps / max(self.train_seconds, 1e-9),
            "wall_seconds": self.train_seconds,
            "peak_memory_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "threading_layer": threading_layer(),
            "antialiased": self.config.antialiased,
            "appearance": self.config.appearance,  # "affine": test.fitted_affine_right_half
        }
        if self.test_ids:
            report["test"] = self.evaluate(render_dir=o.output / "renders" / "test")
            report["test_views"] = len(self.test_ids)
            report["test_masked"] = self.store.masked  # scores over masked-in pixels only
            self._write(_append_jsonl, o.output / "metrics.jsonl",
                        {"images": self.images_seen, "test": report["test"]})
        self._write(write_json, o.output / "report.json", report)
        return report

    # -- checkpoints ------------------------------------------------------------------

    def _write(self, write: Callable, *args) -> None:
        """``write(*args)`` on the process that writes the outputs. The values are computed
        on every process: with several ranks, computing them is collective."""
        if self.options.writes:
            write(*args)

    @property
    def checkpoint_path(self) -> Path:
        return self.options.output / "checkpoint.pt"

    def _diverged(self, what: str) -> None:
        kept = (f"{self.checkpoint_path} keeps the state after image {self.checkpoint_images}"
                if self.checkpoint_images is not None else "no checkpoint was written")
        raise TrainingDiverged(f"training diverged: {what}; {kept}")

    def _require_finite(self) -> None:
        """A divergence if any parameter is NaN or infinite: never written."""
        bad = self.engine.non_finite()
        if bad:
            self._diverged(f"{bad} Gaussians have NaN or infinite parameters after "
                           f"image {self.images_seen}")

    def _save_model(self, path: Path) -> None:
        """``path`` as one PLY, streamed part by part by the writing rank, with the
        training cameras' up (a viewer of the PLY alone shows it upright) and whether
        its splats are anti-aliased."""
        self._require_finite()
        count, parts = self.engine.num_gaussians(), self.engine.model_parts()
        if self.options.writes:
            up = cameras_up([self.store.camera(i) for i in self.train_ids])
            write_ply_parts(parts, count, path, up, self.config.antialiased)
        else:
            for _ in parts:  # a rank's own part goes to the writer as this runs
                pass

    def state_dict(self) -> dict:
        return {"images_seen": self.images_seen, "steps": self.steps, "sh_degree": self.sh_degree,
                "train_seconds": self.train_seconds, "order": self.order.get_state(),
                "queue": list(self.queue), "config": self.config.to_dict(),
                **({"appearance": self.appearance.state_dict()} if self.appearance else {}),
                "scene": self.scene_fingerprint, "eval_split": self.options.eval_split}

    def save_checkpoint(self) -> None:
        """Write everything a resume needs (every rank its part); never a non-finite state."""
        self._require_finite()
        save_checkpoint(self.checkpoint_path, self.state_dict(), self.engine.state_dict(),
                        self.engine.shard(), self.options.writes)
        self.checkpoint_images = self.images_seen

    def resume(self, path: Path) -> None:
        """Continue from the checkpoint at ``path``, which must be of this scene."""
        state, engine_state = load_checkpoint(path, self.engine.shard())
        if state["scene"] != self.scene_fingerprint:
            raise DataError(f"{path}: a checkpoint of another scene (its cameras or images "
                            f"differ from those of {self.scene.source} at this resolution)")
        if state["eval_split"] != self.options.eval_split:
            said = "with" if state["eval_split"] else "without"
            raise DataError(f"{path}: the run was trained {said} --eval; resume it so")
        unknown = sorted(set(state["queue"]) - set(self.train_ids))
        if unknown:
            raise DataError(f"{path}: queue names view {unknown[0]}, not a training view "
                            "of the run")
        if self.appearance:  # the checkpoint holds it (``load_checkpoint`` checks so)
            problem = appearance.state_problem(state["appearance"], len(self.scene.views))
            if problem is not None:
                raise DataError(f"{path}: its appearance state is not this scene's ({problem})")
            self.appearance.load_state_dict(state["appearance"])
        self.engine.load_state_dict(engine_state)
        self.images_seen, self.steps = state["images_seen"], state["steps"]
        self.sh_degree = state["sh_degree"]
        self.engine.set_sh_degree(self.sh_degree)  # a checkpoint may hold more bands
        self.train_seconds = state["train_seconds"]
        self.order.set_state(state["order"])
        self.queue = list(state["queue"])
        self.checkpoint_images = self.images_seen


# A second stop signal this soon after the first is the same request arriving by
# another path (a terminal's Ctrl-C reaches torchrun's ranks, then its SIGTERM does).
REPEAT_WINDOW = 1.0  # seconds


@contextmanager
def _stop_after_step() -> Iterator[Callable[[], bool]]:
    """Yield a function telling whether SIGINT (Ctrl-C) or SIGTERM (``kill``, ``timeout``,
    Slurm) arrived; the loop checks it after each step. A second one, later than
    ``REPEAT_WINDOW`` after the first, interrupts at once."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False  # signal handlers can only be set from the main thread
        return
    first: list[float] = []

    def on_signal(signum, frame) -> None:
        if first and time.monotonic() - first[0] > REPEAT_WINDOW:
            raise KeyboardInterrupt
        if not first:
            first.append(time.monotonic())
            notice("finishing this step to save a checkpoint (Ctrl-C again to stop at once)")

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield lambda: bool(first)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _append_jsonl(path: Path, entry: dict) -> None:
    with open(path, "a") as handle:
        handle.write(json.dumps(entry) + "\n")

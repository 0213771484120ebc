"""What the progress bar says: images (the unit ``--iterations`` counts), one rate,
the training loss and PSNR smoothed and labelled as such, and the time left.

The time left follows the model's growth. A step's time per image is close to
``a + b * N`` for N Gaussians (projection, SH and Adam touch every Gaussian; the
pixels cost the same whatever N), so ``TimeLeft`` fits ``a`` and ``b`` to the
steps so far, recent ones weighing most, and sums that cost over the images to
come, with N growing at its rate since densification began until densification
ends, and constant after. A constant rate, as a plain progress bar assumes, says a run that grows
ten times will end in a fraction of the time it takes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tqdm import tqdm

# Each step's weight in the fit decays by this per image seen since: the fit follows
# the last few thousand images.
MEMORY_IMAGES = 2_000
SMOOTHING_IMAGES = 50  # the loss and PSNR shown are averaged over about this many images


@dataclass
class _Sums:
    """Weighted sums for the least-squares fit of seconds per image to a + b N."""

    w: float = 0.0
    n: float = 0.0
    nn: float = 0.0
    t: float = 0.0
    nt: float = 0.0

    def decay(self, factor: float) -> None:
        for name in ("w", "n", "nn", "t", "nt"):
            setattr(self, name, getattr(self, name) * factor)

    def add(self, weight: float, gaussians: float, per_image: float) -> None:
        self.w += weight
        self.n += weight * gaussians
        self.nn += weight * gaussians ** 2
        self.t += weight * per_image
        self.nt += weight * gaussians * per_image


class TimeLeft:
    """The seconds a run has left, from its steps so far and the images between which
    its model grows (``growth``: densification's window)."""

    def __init__(self, total_images: int, growth: tuple[int, int]) -> None:
        self.total, (self.growth_starts, self.growth_ends) = total_images, growth
        self.sums = _Sums()
        self.images = 0
        self.gaussians = 0.0
        self.grown_from: tuple[int, float] | None = None  # (images, Gaussians) as it began

    def step(self, images_after: int, seconds: float, gaussians_before: int,
             gaussians_after: int) -> None:
        """One step of ``images_after - images`` images took ``seconds``, beginning
        with ``gaussians_before`` Gaussians and ending with ``gaussians_after``."""
        images = images_after - self.images
        self.sums.decay(math.exp(-images / MEMORY_IMAGES))
        self.sums.add(images, gaussians_before, seconds / images)
        if self.grown_from is None and self.images >= self.growth_starts:
            self.grown_from = (self.images, float(gaussians_before))
        self.images, self.gaussians = images_after, float(gaussians_after)

    def growth(self) -> float:
        """Gaussians added per image: their mean rate since growth began (0 before)."""
        if self.grown_from is None or self.images <= self.grown_from[0]:
            return 0.0
        start, count = self.grown_from
        return max(self.gaussians - count, 0.0) / (self.images - start)

    def cost(self) -> tuple[float, float]:
        """(a, b): seconds per image = a + b N. Until the Gaussians' count has varied,
        all of it is taken as b N (which errs long, not short)."""
        s = self.sums
        if s.w == 0:
            return 0.0, 0.0
        mean_n, mean_t = s.n / s.w, s.t / s.w
        spread = s.nn / s.w - mean_n ** 2
        if spread <= (0.05 * mean_n) ** 2:
            return 0.0, mean_t / max(mean_n, 1.0)
        b = max((s.nt / s.w - mean_n * mean_t) / spread, 0.0)
        return max(mean_t - b * mean_n, 0.0), b

    def seconds(self) -> float:
        """The time the images left take at the fitted cost, the model growing as it
        has lately until ``growth_ends`` images."""
        a, b = self.cost()
        left = max(self.total - self.images, 0)
        growing = max(min(self.growth_ends, self.total) - self.images, 0)
        rate = self.growth()
        gaussian_images = (self.gaussians * left + rate * growing ** 2 / 2
                           + rate * growing * (left - growing))
        return a * left + b * gaussian_images


def duration_text(seconds: float) -> str:
    """``seconds`` rounded as a person would say it: 45 s, 12 min, 3 h 20 min."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 120:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60:02d} min"


class ProgressBar:
    """The run's bar on stderr: images done of the total, their rate, the smoothed
    training loss and PSNR, the Gaussians and the time left."""

    def __init__(self, total_images: int, done: int, growth: tuple[int, int],
                 shown: bool) -> None:
        self.bar = tqdm(total=total_images, initial=done, disable=not shown, unit=" images",
                        dynamic_ncols=True,
                        bar_format="{percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} images "
                                   "[{elapsed}, {rate_fmt}{postfix}]")
        self.time_left = TimeLeft(total_images, growth)
        self.time_left.images = done
        self.loss: float | None = None  # smoothed; None before the first step
        self.psnr: float | None = None

    def step(self, entry: dict, seconds: float, gaussians_before: int) -> None:
        """After a step: its log ``entry`` and the ``seconds`` it took. A process' first
        step also compiles the kernels: its time is not the run's."""
        left = self.time_left
        images = entry["images"] - left.images
        if self.loss is None:
            left.images, left.gaussians = entry["images"], float(entry["num_gaussians"])
        else:
            left.step(entry["images"], seconds, gaussians_before, entry["num_gaussians"])
        keep = math.exp(-images / SMOOTHING_IMAGES)
        self.loss = _smoothed(self.loss, entry["loss"], keep)
        self.psnr = _smoothed(self.psnr, entry["psnr"], keep)
        self.bar.update(images)
        when = (f"about {duration_text(left.seconds())} left" if left.sums.w
                else "estimating the time left")
        self.bar.set_postfix_str(
            f"train loss {self.loss:.4f}, train PSNR {self.psnr:.2f} dB, "
            f"{entry['num_gaussians']:,} Gaussians, {when}", refresh=False)

    def close(self) -> None:
        self.bar.close()


def _smoothed(previous: float | None, value: float, keep: float) -> float:
    return value if previous is None else keep * previous + (1 - keep) * value

"""The CPU kernels in numba's on-disk cache: whether a run will compile them, and
compiling them in three processes at once, begun as a run prepares and ended before
its first step (one compile per machine: its ranks wait for it, ``commands.py``).

numba compiles a kernel the first time it is called with new argument types, one
kernel at a time in a process, and keeps it on disk (``cache=True``) for later
runs. ``compiling`` splits a first run's compile in three parts, each driven
by a tiny synthetic step of its stages through the very calls training makes (so
the argument types, and so the specialisations cached, are training's own): the
geometry (visibility, projection, SH), the loss with Adam, and the pixels
(binning, compositing), each in a child process of one helper, which on Linux
forks them once it has imported splatscale and torch for them all. Three parts, not two, on two
cores: the operating system shares the cores among them, so the last ends near
half the whole, where two halves of unequal size wait on the larger. What only
some runs call is a part of its own (``VARIANTS``: AbsGS's compositing backward,
the projection's fisheye code), compiled once a run's settings say they want it
(``missing_variants``, then ``compiling`` them).

The run itself compiles none of them: it loads every kernel from the cache, as
every later run does. A kernel compiled with numba's fast-math flags rounds
otherwise, in its last bits, when compiled in the process that calls it than when
loaded from the cache (seen with numba 0.68 on the compositing kernels; without
the reassociation flag the two agree), so a first run that compiled its own would
train a model that later runs of the same command do not. A kernel a child could
not compile is compiled here when first called, as without the children: nothing
else depends on them.
"""

from __future__ import annotations

import inspect
import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator, NamedTuple

import torch
from numba import types

from splatscale.backends.cpu import BACKEND
from splatscale.data.cameras import Camera
from splatscale.kernel_cache import remove_stale_folders
from splatscale.model.gaussians import SH_REST, GaussianModel
from splatscale.parent_death import die_with_parent
from splatscale.render import compositing_kernels, projection_kernels, sh_kernels
from splatscale.render.projection import project
from splatscale.render.rasterize import rasterize
from splatscale.render.splats import Splats
from splatscale.step import ssim
from splatscale.step.view_loss import band_loss, masked_in_values

# The largest kernels, which take most of the first compile, and the fast-math ones a
# run must not compile itself; AbsGS's backward (fast-math too) apart.
CHECKED = (compositing_kernels.forward, compositing_kernels.backward,
           projection_kernels.project_backward, sh_kernels._colors_of,
           sh_kernels._color_gradients_of, ssim._ssim_value_and_grad)
ABSGRAD_CHECKED = (compositing_kernels.backward_with_absgrad,)
FISHEYE_CHECKED = (projection_kernels.visibility, projection_kernels.project_backward)
WIDTH, HEIGHT, COUNT = 40, 30, 16
ALONE = "--alone"  # the helper's argument for one part, compiled in that process itself


def kernels_cached(kernels: tuple = CHECKED, fisheye: bool = False) -> bool:
    """True when each of ``kernels`` has a compiled version cached for its source as
    it is now (numba reads an index whose stamp is stale as empty), the version a run
    calls: of a projection kernel, the one for fisheye cameras (``fisheye``) or for
    pinholes alone (which takes None for them); of a compositing kernel, the one
    without depth (None in its place), whatever else renders depth."""
    try:
        return all(_version_cached(kernel, fisheye) for kernel in kernels)
    except Exception:  # numba's cache internals moved, or an index is torn: say nothing
        return True


def _version_cached(kernel, fisheye: bool) -> bool:
    signatures = [key[0] for key in kernel._cache._cache_file._load_index()]
    parameters = list(inspect.signature(kernel.py_func).parameters)
    wanted = {"fisheye": types.Array if fisheye else types.NoneType,
              "out_depth": types.NoneType, "v_depth": types.NoneType}
    checks = [(parameters.index(name), kind) for name, kind in wanted.items()
              if name in parameters]
    return any(all(isinstance(signature[position], kind) for position, kind in checks)
               for signature in signatures)


class Compile:
    """A compile under way in ``helper`` (None: nothing to compile, or it could not
    start). Called, it awaits the helper and returns the parts that could not start
    or failed, which the run then compiles itself. Once ``done``, it stays done and
    a call returns at once."""

    def __init__(self, helper: subprocess.Popen | None, wanted: list[str]) -> None:
        self.helper, self.wanted = helper, wanted

    def done(self) -> bool:
        """Whether a call would return at once."""
        return self.helper is None or self.helper.poll() is not None

    def __call__(self) -> list[str]:
        if self.helper is None:
            return list(self.wanted)
        said, _ = self.helper.communicate()
        return said.split() if self.helper.returncode == 0 else list(self.wanted)


@contextmanager
def compiling(parts: Iterable[str] | None = None) -> Iterator[Compile]:
    """A first run's compile, begun: ``parts`` (of ``CHILD_PARTS``; None: the three of
    ``PARTS``) compiling in child processes while the block runs (a run prepares
    meanwhile). The block is given a ``Compile``, which it calls before its first
    step; the block ending early (refused, interrupted) ends the children with it."""
    wanted = list(PARTS if parts is None else parts)
    helper = None
    try:
        if wanted:
            helper = _started(wanted)
            remove_stale_folders()  # other sources' kernels, unused for weeks
        yield Compile(helper, wanted)
    finally:
        if helper is not None:
            if helper.poll() is None:  # the helper leads a session of its own: all of it
                os.killpg(helper.pid, signal.SIGKILL)
            helper.wait()


def missing_variants(absgrad: bool, fisheye: bool) -> list[str]:
    """The ``VARIANTS`` a run wants (AbsGS's, fisheye cameras') that the cache lacks."""
    wanted = {"absgrad": absgrad, "fisheye": fisheye}
    return [name for name, variant in VARIANTS.items() if wanted[name] and not variant.cached()]


def _started(parts: list[str]) -> subprocess.Popen | None:
    """The helper compiling ``parts`` (``_compile_apart``), or None where it could not
    start."""
    package_root = Path(__file__).resolve().parents[2]  # a child imports this splatscale
    try:
        return subprocess.Popen([sys.executable, "-m", __name__, *parts], cwd=package_root,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    except OSError:
        return None


def _compile_apart(parts: list[str]) -> None:
    """The helper's work: ``parts`` compiled at once, each in a process of its own, and
    the parts that failed printed. On Linux each process is forked from the helper, so
    that splatscale and torch are imported once rather than once a part; elsewhere
    (macOS: a fork after threads have started may hang) each is started afresh. The
    helper, and each forked process, ends with its parent."""
    die_with_parent(signal.SIGKILL)
    starts = _forked if sys.platform.startswith("linux") else _spawned
    ends = {part: starts(part) for part in parts}
    print(" ".join(part for part, end in ends.items() if end() != 0))


def _forked(part: str) -> Callable[[], int]:
    """A process forked to compile ``part``; what waits for its exit status."""
    # Forking is safe here: the helper has run nothing, and its only other threads are
    # OpenBLAS's, which OpenBLAS stops around a fork.
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            die_with_parent(signal.SIGKILL)
            # The pipe carries the helper's report alone.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            CHILD_PARTS[part]()
            code = 0
        finally:
            os._exit(code)
    return lambda: os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _spawned(part: str) -> Callable[[], int]:
    """A process started afresh to compile ``part`` alone; what waits for its exit
    status."""
    return subprocess.Popen([sys.executable, "-m", __name__, ALONE, part],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL).wait


def _camera(model: str = "pinhole") -> Camera:
    K = torch.tensor([[32.0, 0.0, WIDTH / 2], [0.0, 32.0, HEIGHT / 2], [0.0, 0.0, 1.0]])
    return Camera(torch.eye(4), K, WIDTH, HEIGHT, "compile", model)


def geometry_part(fisheye: bool = False) -> None:
    """A step's visibility test, projection and SH, forward and backward, on float32
    Gaussians; with ``fisheye``, through a fisheye camera."""
    generator = torch.Generator().manual_seed(0)
    model = GaussianModel(
        torch.rand(COUNT, 3, generator=generator) - 0.5 + torch.tensor([0.0, 0.0, 3.0]),
        torch.rand(COUNT, 4, generator=generator), torch.full((COUNT, 3), -2.0),
        torch.zeros(COUNT), torch.rand(COUNT, 1, 3, generator=generator),
        torch.zeros(COUNT, SH_REST, 3)).requires_grad_(True)
    splats = project(model, [_camera("fisheye" if fisheye else "pinhole")])
    outputs = (splats.means2d, splats.conics, splats.colors, splats.depths, splats.opacities)
    torch.autograd.backward([t.sum() for t in outputs])


def loss_part() -> None:
    """A step's loss (L1, SSIM, squared error), forward and backward, the densification
    statistic's sums and an Adam step, on float32 tensors."""
    generator = torch.Generator().manual_seed(0)
    rgb = torch.rand(HEIGHT, WIDTH, 3, generator=generator, requires_grad=True)
    target = torch.rand(HEIGHT, WIDTH, 3, generator=generator)
    loss, _ = band_loss(rgb, target, (0, HEIGHT), masked_in_values(target), 0.2)
    loss.backward()
    BACKEND.add_view_norms(torch.zeros(COUNT), torch.zeros(COUNT), torch.arange(COUNT),
                           torch.rand(COUNT, 2, generator=generator), torch.ones(2))
    param = rgb.detach().view(-1)
    BACKEND.adam_step(param, torch.zeros_like(param), torch.zeros_like(param),
                      torch.ones_like(param), -1e-3, 0.5, 0.9, 0.999, 1e-15)


def pixels_part(absgrad: bool = False) -> None:
    """A step's tile binning and compositing, forward and backward, on float32 splats;
    with ``absgrad``, AbsGS's."""
    generator = torch.Generator().manual_seed(0)
    leaves = [torch.rand(COUNT, 2, generator=generator) * torch.tensor([WIDTH, HEIGHT]),
              torch.tensor([0.05, 0.0, 0.05]).repeat(COUNT, 1),
              torch.rand(COUNT, 3, generator=generator), 1 + torch.rand(COUNT, generator=generator),
              torch.full((COUNT,), 0.5)]
    means2d, conics, colors, depths, opacities = (t.requires_grad_(True) for t in leaves)
    ids = torch.arange(COUNT)
    splats = Splats(torch.zeros(COUNT, dtype=torch.int64), ids, means2d, conics, depths,
                    torch.full((COUNT, 2), 12, dtype=torch.int32), colors, opacities, ids,
                    [0, COUNT], [_camera()],
                    absgrad=torch.zeros(COUNT, 2, requires_grad=True) if absgrad else None)
    out = rasterize(splats, WIDTH, HEIGHT, background=torch.zeros(3))  # no depth, as a run's
    (out.rgb.sum() + out.alpha.sum()).backward()


def absgrad_part() -> None:
    """AbsGS's compositing backward (the pixels' part with ``absgrad``)."""
    pixels_part(absgrad=True)


def fisheye_part() -> None:
    """The projection's fisheye code (the geometry's part through a fisheye camera)."""
    geometry_part(fisheye=True)


class Variant(NamedTuple):
    """A part only some runs want: what compiles it, whether the cache holds it, and
    whose kernels it is (as a run says it compiles them)."""

    part: Callable[[], None]
    cached: Callable[[], bool]
    whose: str


PARTS = {"geometry": geometry_part, "loss": loss_part, "pixels": pixels_part}
VARIANTS = {
    "absgrad": Variant(absgrad_part, lambda: kernels_cached(ABSGRAD_CHECKED), "AbsGS's"),
    "fisheye": Variant(fisheye_part, lambda: kernels_cached(FISHEYE_CHECKED, fisheye=True),
                       "fisheye cameras'")}
CHILD_PARTS = {**PARTS, **{name: variant.part for name, variant in VARIANTS.items()}}

if __name__ == "__main__":
    if sys.argv[1] == ALONE:
        CHILD_PARTS[sys.argv[2]]()
    else:
        _compile_apart(sys.argv[1:])

"""Exposure and white balance that change from photo to photo (``--appearance affine``).

Each training image has a colour transform of its own, a 3x3 matrix and an offset
(``[3, 4]``: ``out = A rgb + b``), starting at the identity. It maps the render of
the image's view before the loss (``apply``), so the Gaussians learn one scene's
colours and each transform what its photo's camera did to them. The reference
3DGS code's per-image exposure (``--train_test_exp``) is the same 3x4 affine.

Training: an Adam of their own (``step/optimizer.py``'s ``GaussianAdam`` over one
group, with the batch-size rule), stepped after every batch with the gradients of
the batch's images (the others', zero: their moments decay as in the reference's
and gsplat's dense per-image optimisers). The learning rate decays log-linearly
from ``LR_INIT`` to ``LR_FINAL`` over the positions' schedule, the reference
3DGS's exposure rates (0.01 to 0.001 over the run); ``EPS`` is gsplat's (and
ours) for its per-image bilateral grids.

Nothing in the photometric loss fixes the scene's own colours: every training
transform composed with an affine map G's inverse, and the scene's colours mapped
by G, render alike. The gauge is pinned after every step: the training transforms
are composed with the inverse of their mean, so their mean is the identity and the
scene renders as the average photo does (test views are rendered without a
transform). Each view's loss also adds ``PULL`` times its transform's squared
distance from the identity, a small prior against a transform taking on more than
its photo's change (neither of those trainers pulls a per-image affine; gsplat's
total variation term is zero on a grid of one cell).

The transforms are float64 on the host, whatever renders: a view's is a leaf of
its own for one step (``leaves``), which the compute parts apply to their rows
(ranks: bands) and whose gradient they sum over ranks; ``step`` takes them.

Evaluation: test views have no trained transform; ``fitted_right_half`` fits one
on the left half of the photo (least squares, closed form) and applies it to
the right half, as NeRF in the Wild evaluates its per-image appearance.
"""

from __future__ import annotations

import torch
from torch import Tensor

from splatscale.backends import backend_for
from splatscale.step.optimizer import GaussianAdam
from splatscale.step.schedule import position_lr

LR_INIT = 1e-2
LR_FINAL = 1e-3
EPS = 1e-15
PULL = 1e-3
GROUP = "appearance"
STATE_KEYS = ("transforms", "exp_avg", "exp_avg_sq", "steps", "batch_size")


def identity(images: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """``images`` identity transforms, [images, 3, 4]."""
    return torch.eye(3, 4, dtype=dtype).expand(images, 3, 4).clone()


def apply(rgb: Tensor, transform: Tensor | None) -> Tensor:
    """``rgb`` [h, W, 3] mapped by ``transform`` [3, 4] (cast to ``rgb``'s dtype and
    device, differentiably); ``rgb`` itself, untouched, without one."""
    if transform is None:
        return rgb
    t = transform.to(rgb)
    return rgb @ t[:, :3].T + t[:, 3]


class Appearance:
    """The transforms of ``images`` images (by view index) and their Adam, for batches
    of ``batch_size`` views; ``trained`` the training views (None: all), whose mean
    transform is held at the identity (a test view's stays the identity). Every rank
    holds the same, and steps them alike."""

    def __init__(self, images: int, batch_size: int, trained: list[int] | None = None
                 ) -> None:
        self.transforms = identity(images)
        self.trained = list(range(images)) if trained is None else sorted(trained)
        self.moments = {"exp_avg": {GROUP: torch.zeros_like(self.transforms)},
                        "exp_avg_sq": {GROUP: torch.zeros_like(self.transforms)}}
        self.adam = GaussianAdam([GROUP], batch_size, backend_for(self.transforms.device))

    @property
    def params(self) -> dict[str, Tensor]:
        return {GROUP: self.transforms}

    def leaves(self, ids: list[int]) -> list[Tensor]:
        """The transforms of views ``ids`` (distinct), each a leaf with a gradient."""
        return [self.transforms[i].clone().requires_grad_() for i in ids]

    @staticmethod
    def learning_rate(image: int, max_steps: int) -> float:
        """The rate of the step that ends before image ``image`` (the positions'
        decay, over ``max_steps`` images)."""
        return position_lr(image, LR_INIT, LR_FINAL, max_steps)

    def step(self, ids: list[int], leaves: list[Tensor], lr: float) -> None:
        """One Adam step with the gradients ``leaves`` (``leaves(ids)``, after the
        batch's backward pass; none where no pixel of a view reached the loss) and
        the pull toward the identity of each view, both averaged over the batch."""
        grad = torch.zeros_like(self.transforms)
        pull = 2 * PULL / len(ids)
        eye = torch.eye(3, 4, dtype=grad.dtype)
        for i, leaf in zip(ids, leaves):
            if leaf.grad is not None:
                grad[i] += leaf.grad
            grad[i] += pull * (self.transforms[i] - eye)
        self.transforms.grad = grad
        self.adam.step(self, {GROUP: lr})
        self._pin_mean()

    def _pin_mean(self) -> None:
        """Compose every training transform with the inverse of their mean (as 4x4
        affine maps): their mean becomes the identity. Exact where it already is."""
        rows = self.transforms[self.trained]
        mean = torch.eye(4, dtype=rows.dtype)
        mean[:3] = rows.mean(0)
        self.transforms[self.trained] = rows @ torch.linalg.inv(mean)

    def state_dict(self) -> dict:
        """Everything to continue bit for bit: ``STATE_KEYS``, tensors copied."""
        return {"transforms": self.transforms.clone(),
                **{name: moment[GROUP].clone() for name, moment in self.moments.items()},
                "steps": self.adam.steps[GROUP], "batch_size": self.adam.batch_size}

    def load_state_dict(self, state: dict) -> None:
        """Pre: ``state_problem(state, len(self.transforms))`` is None."""
        self.transforms.copy_(state["transforms"])
        for name, moment in self.moments.items():
            moment[GROUP].copy_(state[name])
        self.adam.load_state_dict({"steps": {GROUP: state["steps"]},
                                   "batch_size": state["batch_size"]})


def state_problem(state: object, images: int | None = None) -> str | None:
    """What is wrong with an ``Appearance`` state read from disk (of ``images``
    images, where known); None if nothing."""
    if not isinstance(state, dict) or set(state) != set(STATE_KEYS):
        return f"not a set of {', '.join(STATE_KEYS)}"
    count = images if images is not None else getattr(state["transforms"], "shape", (0,))[0]
    for name in ("transforms", "exp_avg", "exp_avg_sq"):
        value = state[name]
        if not (isinstance(value, Tensor) and value.dtype == torch.float64
                and value.shape == (count, 3, 4)):
            return f"its {name} must be float64 [{count}, 3, 4]"
        if not bool(torch.isfinite(value).all()):
            return f"its {name} holds NaN or infinite values"
    if bool((state["exp_avg_sq"] < 0).any()):
        return "its exp_avg_sq holds negative values"
    for name in ("steps", "batch_size"):
        if type(state[name]) is not int or state[name] < (name == "batch_size"):
            return f"its {name} must be a count"
    return None


def fit(render: Tensor, photo: Tensor) -> Tensor:
    """The [3, 4] transform that maps ``render``'s pixels nearest ``photo``'s (least
    squares over the pixels, float64; the minimum-norm one where the render's
    colours do not fix it). A photo of 4 channels carries its mask: only its
    masked-in pixels count (none: the identity)."""
    pixels = render.reshape(-1, 3).to(torch.float64)
    colours = photo.reshape(-1, photo.shape[-1]).to(torch.float64)
    if colours.shape[1] == 4:
        kept = colours[:, 3] > 0.5
        pixels, colours = pixels[kept], colours[kept, :3]
    if len(pixels) == 0:
        return identity(1)[0]
    design = torch.cat([pixels, torch.ones(len(pixels), 1, dtype=torch.float64)], 1)
    solution = torch.linalg.lstsq(design, colours, driver="gelsd").solution  # [4, 3]
    return solution.T.contiguous()


def fitted_right_half(render: Tensor, photo: Tensor) -> tuple[Tensor, Tensor]:
    """(the right half of ``render`` mapped by the transform fitted on the left
    halves and clamped to [0, 1], the right half of ``photo``, its mask too where it
    has one): the pair a test view is scored on (NeRF in the Wild's evaluation of
    per-image appearance)."""
    half = render.shape[1] // 2
    transform = fit(render[:, :half], photo[:, :half])
    return apply(render[:, half:].to(torch.float64), transform).clamp(0, 1).to(render.dtype), \
        photo[:, half:]

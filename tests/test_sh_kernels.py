"""The SH kernels' float32 colours and gradients at every degree, bit for bit those of
commit 7f45f0b, which took one pair at a time, on inputs that exercise chunks, lanes
and clamps: the lanes on the vector units changed no bit of them. In float64 the
fast-math sums reassociate otherwise in the lanes; ``test_projection`` holds those to
the torch reference."""

from __future__ import annotations

import hashlib

import pytest
import torch

from splatscale.render.projection import _ShColors

# Seen by two cameras: chunks of 256 pairs (CHUNK) and lanes of 64 (LANES), with
# remainders of each.
GAUSSIANS = 700

# sha256 of the colours' and the three gradients' bytes (``digest``) at SH degrees 0 to 3,
# as 7f45f0b computed them from the inputs below.
BEFORE = ["14c0b4109ea7d7920cf957c56eb59b243193d1d4ec5fdef4333ce3ad8721a915",
          "4121bee8a98644767c69b79a484666b335b0afc456f127b83e0d6f0b1d99e64e",
          "ba1a4f452f377f52e0a25ce31f471a785d36f631ed7cbc52f0b4aba3bd0b792e",
          "cf45c17bb46d7299c905b95c492dfb5c0620fdac0d8e9b59a2df441582676f18"]


def values(shape: tuple[int, ...], salt: int) -> torch.Tensor:
    """Values in [-1, 1) from integer arithmetic and one division: the same bits on
    every machine, unlike a random generator's or a sine's."""
    k = torch.arange(torch.Size(shape).numel(), dtype=torch.int64)
    return (((k * 7919 + salt * 104729) % 2000).float() / 1000 - 1).reshape(shape)


def digest(degree: int) -> str:
    means = values((GAUSSIANS, 3), 1) * 3
    sh0 = values((GAUSSIANS, 1, 3), 2)
    sh0[::5] *= 4  # some colours clamped at 0
    shN = values((GAUSSIANS, 15, 3), 3) / 2
    shN[:, (degree + 1) ** 2 - 1:] = torch.nan  # above the degree: never read
    leaves = [t.requires_grad_(True) for t in (means, sh0, shN)]
    gaussian_ids = torch.arange(GAUSSIANS).repeat(2)
    camera_ids = torch.arange(2).repeat_interleave(GAUSSIANS)
    centres = torch.tensor([[0.0, 0.0, -6.0], [5.0, 1.0, 0.5]])
    colors = _ShColors.apply(*leaves, gaussian_ids, camera_ids, centres, degree)
    assert (colors == 0).any(), "the clamp must hold some colours"
    upstream = values(tuple(colors.shape), 4)
    grads = torch.autograd.grad((colors * upstream).sum(), leaves, allow_unused=True)
    found = hashlib.sha256(colors.detach().numpy().tobytes())
    for grad in grads:
        found.update(b"none" if grad is None else grad.numpy().tobytes())
    return found.hexdigest()


@pytest.mark.parametrize("degree", range(4))
def test_float32_colours_and_gradients_are_those_of_7f45f0b(degree):
    assert digest(degree) == BEFORE[degree]

"""AbsGS, the 3DGS strategy's ``absgrad`` option: its statistic, its threshold, its
flag, and the band loss that keeps each pixel's gradient whole for it on ranks."""

from __future__ import annotations

import pytest
import torch

from splatscale.cli import main
from splatscale.step.loss import photometric_loss
from splatscale.step.row_set import RowSet
from splatscale.step.view_loss import HALO, band_loss
from splatscale.strategy import make_strategy
from splatscale.step.observer import Seen, SeenView
from splatscale.strategy.default import GRAD_SUM, COUNT, GradientNorms
from splatscale.train.config import TrainConfig
from tests.conftest import random_model
from tests.test_bad_input import assert_clean_error


def seen_once(rows: list[int], grad: list[list[float]], absgrad: list[list[float]]) -> Seen:
    """One view of 20 x 10 pixels that saw ``rows``."""
    return Seen([SeenView(torch.tensor(rows), torch.tensor(grad, dtype=torch.float64),
                          torch.tensor(absgrad, dtype=torch.float64), 20, 10)])


@pytest.mark.parametrize("absgrad", [False, True])
def test_the_statistic_reads_the_gradient_it_is_asked_for(absgrad):
    rows = RowSet(random_model(4, seed=0))
    seen = seen_once([1, 3], [[0.1, -0.2], [0.0, 0.3]], [[0.5, 0.4], [0.2, 0.6]])
    GradientNorms(absgrad).observe(rows, seen)
    read = seen.views[0].absgrad if absgrad else seen.views[0].means2d_grad
    # 3DGS's units: each component times half the image's size (one view in the batch).
    want = (read * torch.tensor([10.0, 5.0], dtype=torch.float64)).norm(dim=-1)
    torch.testing.assert_close(rows.state[GRAD_SUM][[1, 3]], want)
    assert rows.state[GRAD_SUM][[0, 2]].tolist() == [0.0, 0.0]
    assert rows.state[COUNT].tolist() == [0.0, 1.0, 0.0, 1.0]


class RecordingEngine:
    """An engine of one process reduced to its seam: edits run on ``rows``."""

    def __init__(self, rows: RowSet) -> None:
        self.rows = rows

    def edit_rows(self, edit):
        return edit(self.rows, lambda value: value)


@pytest.mark.parametrize("absgrad", [False, True])
def test_densification_takes_the_option_s_own_threshold(absgrad):
    """Two Gaussians with mean statistics 5e-4 and 1e-3: between the thresholds of
    3DGS (2e-4) and AbsGS (8e-4), the first is densified by 3DGS alone."""
    config = TrainConfig(absgrad=absgrad, densify_from=0, densify_interval=100)
    strategy = make_strategy(config, extent=100.0)
    rows = RowSet(random_model(2, seed=1, log_scale=(-3.0, -3.0)))
    rows.state[GRAD_SUM] = torch.tensor([5e-4, 1e-3])
    rows.state[COUNT] = torch.ones(2)
    changes = strategy.before_adam(RecordingEngine(rows), 99, 100)
    assert changes["cloned"] == (1 if absgrad else 2)


def test_band_loss_keeps_each_pixel_s_gradient_whole():
    """With ``whole_pixels`` a band's loss has the whole image loss's gradient at its
    own rows and none at its halo; its value is still its share."""
    generator = torch.Generator().manual_seed(0)
    height, width = 40, 9
    image = torch.rand(height, width, 3, generator=generator, dtype=torch.float64)
    target = torch.rand(height, width, 3, generator=generator, dtype=torch.float64)
    whole = image.clone().requires_grad_(True)
    photometric_loss(whole, target).backward()
    elements = image.numel()
    for own in ((0, 7), (7, 26), (26, 40)):
        y0, y1 = max(0, own[0] - 2 * HALO), min(height, own[1] + 2 * HALO)
        band = image[y0:y1].clone().requires_grad_(True)
        local = (own[0] - y0, own[1] - y0)
        loss, _ = band_loss(band, target[y0:y1], local, elements, 0.2, whole_pixels=True)
        share = photometric_loss(image[y0:y1], target[y0:y1], rows=local, count=elements)
        assert loss.item() == pytest.approx(share.item(), rel=1e-15)
        loss.backward()
        torch.testing.assert_close(band.grad[local[0]:local[1]], whole.grad[own[0]:own[1]],
                                   rtol=1e-10, atol=1e-18)
        assert not band.grad[:local[0]].any() and not band.grad[local[1]:].any()


@pytest.mark.parametrize("scale", [1.0, 0.1, 3.0])
def test_another_strategy_s_settings_at_their_scaled_defaults_are_no_change(scale):
    """--schedule-scale scales 3DGS's opacity resets too: an MCMC run so scaled has
    changed no setting of 3DGS's."""
    config = TrainConfig(strategy="mcmc").scaled(scale)
    assert make_strategy(config, extent=1.0).absgrad is False


def test_absgrad_with_mcmc_is_refused(tmp_path, capsys):
    output = tmp_path / "run"
    code = main(["train", "-o", str(output), "--quiet", "--strategy", "mcmc", "--absgrad"])
    assert_clean_error(code, capsys.readouterr().err,
                       "--absgrad: a setting of --strategy 3dgs, not of mcmc")
    assert not output.exists()


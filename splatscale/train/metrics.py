"""Test-view metrics: PSNR, SSIM and, where the lpips package and its weights are
present, LPIPS (VGG, as the 3DGS paper reports it)."""

from __future__ import annotations

import statistics
import warnings

import torch
from torch import Tensor

from splatscale.messages import notice
from splatscale.step.loss import masked_pair, psnr, split_mask
from splatscale.step.ssim import ssim

_lpips_model = None
_lpips_missing: str | None = None


def _lpips():
    """The LPIPS network, or None after saying once why it is skipped."""
    global _lpips_model, _lpips_missing
    if _lpips_model is None and _lpips_missing is None:
        try:
            import lpips

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                _lpips_model = lpips.LPIPS(net="vgg", verbose=False).eval()
        except Exception as error:  # no package, or its weights cannot be fetched offline
            _lpips_missing = (
                "LPIPS is not measured: its package is not installed (pip install lpips "
                "adds it)" if getattr(error, "name", None) == "lpips" else
                f"LPIPS is not measured: its network did not load ({type(error).__name__}: "
                f"{error})")
            notice(_lpips_missing)
    return _lpips_model


class ImageMetrics:
    def __init__(self) -> None:
        self.scores: dict[str, list[float]] = {"psnr": [], "ssim": []}

    @torch.no_grad()
    def add(self, image: Tensor, target: Tensor) -> None:
        """Score ``image`` against ``target``; a target with a mask (a fourth channel,
        ``step/loss.py``) over its masked-in pixels alone: PSNR's mean and SSIM's over
        them, SSIM's windows and LPIPS reading the render where the photo is masked."""
        image, target = image.float(), target.float()
        self.scores["psnr"].append(psnr(image, target))
        colours, mask = split_mask(target)
        if mask is None:
            self.scores["ssim"].append(ssim(image, target).item())
        else:
            image, colours = masked_pair(image, colours, mask)
            self.scores["ssim"].append(
                ssim(image, colours, count=3 * int(mask.sum()), weights=mask).item())
        model = _lpips()
        if model is not None:
            as_input = lambda t: t.permute(2, 0, 1)[None] * 2 - 1  # noqa: E731
            value = model(as_input(image), as_input(colours)).item()
            self.scores.setdefault("lpips", []).append(value)

    def summary(self) -> dict[str, float]:
        return {name: statistics.mean(values) for name, values in self.scores.items() if values}

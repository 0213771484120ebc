"""What a finished run tells its user in words: what was trained, how well it scores
on the views it never saw, where its files are, and what to do next."""

from __future__ import annotations

from pathlib import Path

from splatscale.train.progress import duration_text


def summary(report: dict, output: Path) -> list[str]:
    """The lines said on stderr after a run that wrote ``report`` into ``output``."""
    lines = [f"trained on {report['iterations']:,} images in "
             f"{duration_text(report['wall_seconds'])} ({report['images_per_second']:.1f} "
             f"images/s): {report['num_gaussians']:,} Gaussians"]
    test = report.get("test")
    if test:
        scores = [f"PSNR {test['psnr']:.2f} dB", f"SSIM {test['ssim']:.3f}"]
        if "lpips" in test:
            scores.append(f"LPIPS {test['lpips']:.3f}")
        lines.append(f"on its {report['test_views']} test views, held out of training: "
                     f"{', '.join(scores)}")
    files = ["point_cloud.ply (the model)", "report.json"]
    if test:
        files.append("renders/test/ (each test render beside its photo)")
    lines.append(f"in {output}: {', '.join(files)}")
    lines.append(f"next: splatscale view {output}   (look at it in a browser)")
    lines.append(f"      splatscale export {output} --format spz   (share it: a quarter "
                 "of the PLY's size)")
    if test:
        lines.append("the model lacks what its test views alone show: train it without "
                     "--eval for the one to share")
    return lines

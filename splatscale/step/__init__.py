"""The math of one training step, shared by every engine.

- ``loss``: the 3DGS photometric loss and PSNR; ``ssim``: SSIM (fused CPU kernel).
- ``optimizer``: Adam over the Gaussian parameters with the batch-size rule.
- ``densify``: densification statistics, clone, split, prune and opacity reset,
  applied to parameters and optimiser state row by row together.

This package sits between ``render`` and ``engine``: it imports the model and
the renderer's geometry helpers, never an engine or the Trainer.
"""
